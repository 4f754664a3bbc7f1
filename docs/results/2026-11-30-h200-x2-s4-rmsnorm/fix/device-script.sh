#!/usr/bin/env bash
# session 4 call D (x2): row-cluster fix: virtual rmsnorm tests, virtual bench, real-rank cluster-width sweep
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_COMMIT=$(cat .ab/commit) PYTHONPATH=$PWD SOLLAT_CACHE_DIR=/tmp/sollat-cache
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
el "1 virtual rmsnorm tests"
timeout 150 python3 -m pytest -q tests/gpu/test_rmsnorm.py > $OUT/gpu-rmsnorm.txt 2>&1; echo "rc=$?"; grep -E "^FAILED|passed|failed" $OUT/gpu-rmsnorm.txt | head -8
el "2 virtual bench"
timeout 90 python3 scripts/rmsnorm_bench.py --ranks 2,4,8 --commit $SOLLAT_COMMIT --into $OUT/bench-virtual > $OUT/bench-virtual.txt 2>&1; echo "rc=$?"; grep -v Warn $OUT/bench-virtual.txt | tail -17 | cut -c1-140
for rl in 256 1024 100000; do
  el "3 real bench row-lines $rl"
  timeout 80 python3 -m torch.distributed.run --standalone --nproc-per-node 2 scripts/rmsnorm_bench.py --row-lines $rl --commit $SOLLAT_COMMIT --into $OUT/bench-real-$rl > $OUT/bench-real-$rl.txt 2>&1; echo "rc=$?"; grep -v Warn $OUT/bench-real-$rl.txt | tail -6 | cut -c1-170
done
el done
