#!/usr/bin/env bash
# session 8 call F (x2, 2026-12-01, commit 11109ee): the apps' GPU tests (virtual ranks, and the apps under torchrun with 2 GPUs)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD SOLLAT_CACHE_DIR=/tmp/sollat-cache
timeout 380 python3 -m pytest -q tests/gpu/test_apps_gpu.py > $OUT/apps-gpu.txt 2>&1; echo "rc=$?"
