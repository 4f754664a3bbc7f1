#!/usr/bin/env bash
# One H200, the final commit (the kernels of s17c/s17d, the re-derived and new virtual-rank tables):
# the GPU tests that read the shipped tables, under one budget: batch invariance over every
# shipped table (the 16-, 32-, 64- and 72-rank tables are new), auto's all_reduce_rmsnorm choice,
# then the wide-group tests with the time left (SIGINT: pytest still reports what ran).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache PYTHONPATH=$PWD
cp docs/results/2026-12-03-h200-s17e/device-script.sh $OUT/
{ nvidia-smi -L; echo "commit ${SOLLAT_COMMIT:-unknown}"; date -u +%FT%TZ; } > $OUT/env.txt 2>&1
timeout -s INT -k 10 ${BUDGET:-215} python3 -m pytest -q -ra -p no:cacheprovider --durations=8 \
  tests/gpu/test_batch_invariance.py "tests/gpu/test_rmsnorm.py::test_auto_uses_a_one_shot_algorithm_or_the_unfused_hand_over" \
  tests/gpu/test_wide_groups.py > $OUT/gpu-tests.txt 2>&1
echo "rc $? at $SECONDS s"; tail -22 $OUT/gpu-tests.txt
