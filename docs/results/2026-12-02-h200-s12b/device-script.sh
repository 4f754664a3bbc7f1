#!/usr/bin/env bash
# session 12 call B (one H200): the wide-group tests again (after the RMSNorm cluster-width fix),
# then the virtual-rank latency A/B of this tree against 1be0c58 at R <= 8 (.ab/ab.sh, carried).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache
cp docs/results/2026-12-02-h200-s12b/device-script.sh $OUT/device-script.sh; nvidia-smi -L
t0=$(date +%s)
PYTHONPATH=$PWD timeout 200 python3 -c "
import time; from sollat import instantiations; t=time.monotonic(); n=instantiations.precompile(jobs=16)
print(n, 'modules', round(time.monotonic()-t, 1), 's')" 2>&1 | tail -3 | tee $OUT/precompile.txt
PYTHONPATH=$PWD timeout 200 python3 -m pytest -q -ra -p no:cacheprovider tests/gpu/test_wide_groups.py \
  --durations=10 2>&1 | tail -30 | tee $OUT/wide-tests.txt
echo "elapsed $(( $(date +%s) - t0 )) s"
timeout $(( 570 - ($(date +%s) - t0) )) bash .ab/ab.sh > $OUT/ab.txt 2>&1
echo "elapsed $(( $(date +%s) - t0 )) s"; tail -3 $OUT/ab.txt
