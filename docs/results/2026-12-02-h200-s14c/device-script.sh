#!/usr/bin/env bash
# session 14 call C (one H200): the whole virtual-rank GPU suite on the tree where auto picks the
# wide one-shot above 8 ranks (generic.json) and the R <= 8 tests no longer name it, then the R sweep
# of every deterministic AllReduce, R = 2 .. 72, with the floor in the same process.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache PYTHONPATH=$PWD
cp docs/results/2026-12-02-h200-s14c/device-script.sh $OUT/device-script.sh; nvidia-smi -L
t0=$(date +%s)
timeout 120 python3 -c "
import time; from sollat import instantiations; t=time.monotonic(); n=instantiations.precompile(jobs=16)
print(n, 'modules', round(time.monotonic()-t, 1), 's')" 2>&1 | tail -3 | tee $OUT/precompile.txt
echo "elapsed $(( $(date +%s) - t0 )) s"
timeout 260 python3 -m pytest -q -ra -p no:cacheprovider tests/gpu --durations=12 > $OUT/gpu-tests-full.txt 2>&1
echo "rc $? elapsed $(( $(date +%s) - t0 )) s"; tail -3 $OUT/gpu-tests-full.txt
timeout $(( 585 - ($(date +%s) - t0) )) python3 scripts/rank_sweep.py --sizes 4,128,1024,4096,8192,65536 \
  > $OUT/rank-sweep.txt 2>&1
echo "rc $? elapsed $(( $(date +%s) - t0 )) s"; grep -a -c "^SWEEP" $OUT/rank-sweep.txt; grep -a WRONG $OUT/rank-sweep.txt | head
