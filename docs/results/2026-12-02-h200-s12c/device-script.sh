#!/usr/bin/env bash
# session 12 call C (one H200): the whole virtual-rank GPU suite (tests/gpu, test_wide_groups.py
# included) on main after the merges, at the commit this script was committed with.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache
cp docs/results/2026-12-02-h200-s12c/device-script.sh $OUT/device-script.sh; nvidia-smi -L
# (tests/gpu/conftest.py compiles every kernel module first.)
PYTHONPATH=$PWD timeout 520 python3 -m pytest -q -ra -p no:cacheprovider tests/gpu --durations=5 2>&1 | tail -40 | tee $OUT/gpu-tests.txt
