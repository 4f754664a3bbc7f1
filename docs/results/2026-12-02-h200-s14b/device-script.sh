#!/usr/bin/env bash
# session 14 call B (one H200): the whole virtual-rank GPU suite on the merged tree (the comm/ core,
# the wide one-shot, the shared test helpers, the split model), after every module is compiled.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache PYTHONPATH=$PWD
cp docs/results/2026-12-02-h200-s14b/device-script.sh $OUT/device-script.sh; nvidia-smi -L
t0=$(date +%s)
timeout 120 python3 -c "
import time; from sollat import instantiations; t=time.monotonic(); n=instantiations.precompile(jobs=16)
print(n, 'modules', round(time.monotonic()-t, 1), 's')" 2>&1 | tail -3 | tee $OUT/precompile.txt
echo "elapsed $(( $(date +%s) - t0 )) s"
set -o pipefail
timeout $(( 585 - ($(date +%s) - t0) )) python3 -m pytest -q -ra -p no:cacheprovider tests/gpu --durations=12 2>&1 \
  | tee $OUT/gpu-tests-full.txt | tail -45 > $OUT/gpu-tests.txt
echo "rc $? elapsed $(( $(date +%s) - t0 )) s"; tail -4 $OUT/gpu-tests.txt
