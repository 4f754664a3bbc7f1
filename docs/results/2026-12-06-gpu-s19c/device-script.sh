#!/usr/bin/env bash
# One H200, the final code, right after s17c on the same machine (its kernel cache warm): the GPU
# half of README's test command (python3 -m pytest -q tests/gpu; the CPU half runs on the CPU
# machines, where CI runs the whole command): the virtual-rank suite, the engine adapter core and
# the real-rank suite as 3 processes sharing GPU 0 (the default markers), the process launches last.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache PYTHONPATH=$PWD
cp docs/results/2026-12-03-h200-s17d/device-script.sh $OUT/device-script.sh
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv; echo "commit ${SOLLAT_COMMIT:-unknown}"; date -u +%FT%TZ; python3 -c 'import torch; print("torch", torch.__version__)'; } > $OUT/env.txt 2>&1
t0=$(date +%s)
FILES=$(ls tests/gpu/test_*.py | grep -v -e test_multiprocess -e test_engine_processes)
timeout -s INT -k 10 ${PYTEST_BUDGET:-540} python3 -m pytest -q -ra -p no:cacheprovider --durations=25 $FILES \
  tests/gpu/test_engine_processes.py tests/gpu/test_multiprocess.py > $OUT/gpu-tests.txt 2>&1
echo "rc $? after $(( $(date +%s) - t0 )) s"; tail -45 $OUT/gpu-tests.txt
