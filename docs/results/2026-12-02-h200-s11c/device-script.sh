#!/usr/bin/env bash
# session 11 call C (one H200): the whole virtual-rank GPU suite for issue 27's device code (main at
# the commit this script was committed with; later commits change no device code).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache
cp docs/results/2026-12-02-h200-s11c/device-script.sh $OUT/device-script.sh; nvidia-smi -L
# (tests/gpu/conftest.py compiles every kernel module first.)
PYTHONPATH=$PWD timeout 440 python3 -m pytest -q -ra -p no:cacheprovider tests/gpu 2>&1 | tail -30 | tee $OUT/gpu-tests.txt
