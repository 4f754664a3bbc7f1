#!/usr/bin/env bash
# session 8 call E (x2, 2026-12-01): call D's bench and tune again, because call D's result folder
# had too many files to come back (bench.json among those left out). Commit b35af33 (.ab/commit).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export SOLLAT_COMMIT=$(cat .ab/commit) PYTHONPATH=$PWD SOLLAT_CACHE_DIR=/tmp/sollat-cache; R=/tmp/r8; mkdir -p $R
timeout 250 python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m sollat bench --sizes 4:64M:4 --replays 15 --barrier \
  --no-progress --commit "$SOLLAT_COMMIT" --into $R/bench > $R/bench-console.txt 2>&1; echo "bench rc=$?"
timeout 200 python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m sollat tune --out $R/tune > $R/tune.txt 2>&1; echo "tune rc=$?"
tar czf $OUT/d.tgz -C $R .
