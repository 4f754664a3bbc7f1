#!/usr/bin/env bash
# One GPU, the final code: the engine adapter on real ranks (tests/gpu/test_engine_processes.py, 3
# processes sharing GPU 0; the test changed after s19c), then with the time left the real-rank suite
# as 2 processes sharing GPU 0 (a slow test). Logs under $OUT.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache PYTHONPATH=$PWD
cp docs/results/2026-12-06-gpu-s19d/device-script.sh $OUT/
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version --format=csv; echo "commit ${SOLLAT_COMMIT:-unknown}"; date -u +%FT%TZ; } > $OUT/env.txt 2>&1
timeout -s INT -k 10 240 python3 -m pytest -q -ra -p no:cacheprovider --durations=3 tests/gpu/test_engine_processes.py > $OUT/engine-tests.txt 2>&1
echo "engine rc $? at $SECONDS s"; tail -3 $OUT/engine-tests.txt
if [ $SECONDS -lt ${SUITE_BY:-200} ]; then
  timeout -s INT -k 10 $(( ${BUDGET:-400} - SECONDS )) python3 -m pytest -q -ra -p no:cacheprovider -m '' tests/gpu/test_multiprocess.py \
    -k "test_real_rank_suite and 2" --durations=3 > $OUT/suite-2proc.txt 2>&1
  echo "suite rc $? at $SECONDS s"; tail -3 $OUT/suite-2proc.txt
fi
