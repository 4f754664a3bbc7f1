#!/usr/bin/env bash
# session 12 call A (one H200): issue 28's wide groups on virtual ranks (tests/gpu/test_wide_groups.py)
# and the R sweep (scripts/rank_sweep.py), main at the commit this script was committed with.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache
cp docs/results/2026-12-02-h200-s12a/device-script.sh $OUT/device-script.sh; nvidia-smi -L
t0=$(date +%s)
PYTHONPATH=$PWD timeout 200 python3 -c "
import time; from sollat import instantiations; t=time.monotonic(); n=instantiations.precompile(jobs=16)
print(n, 'modules', round(time.monotonic()-t, 1), 's')" 2>&1 | tail -3 | tee $OUT/precompile.txt
PYTHONPATH=$PWD timeout 300 python3 -m pytest -q -ra -x -p no:cacheprovider tests/gpu/test_wide_groups.py \
  --durations=15 2>&1 | tail -40 | tee $OUT/wide-tests.txt
echo "elapsed $(( $(date +%s) - t0 )) s"
PYTHONPATH=$PWD timeout $(( 560 - ($(date +%s) - t0) )) python3 scripts/rank_sweep.py 2>&1 | tee $OUT/rank-sweep.txt | tail -5
echo "elapsed $(( $(date +%s) - t0 )) s"
