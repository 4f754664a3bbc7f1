#!/usr/bin/env bash
# session 10 call B (one H200): the whole virtual-rank GPU suite at this commit, and the batch-invariance
# auto-row test against 1be0c58 (expected to fail there: the bug it guards against).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache
cp docs/results/2026-12-01-h200-s10b/device-script.sh $OUT/device-script.sh; nvidia-smi -L; cat .ab/commit
mkdir -p /tmp/old && tar -xf .ab/old-1be0c58.tar -C /tmp/old
NEW=$PWD; export PYTHONPATH=$NEW
python3 -m sollat precompile -j 16 --no-progress 2>&1 | tail -1 | tee $OUT/precompile.txt
echo "== the auto-row test against 1be0c58 (expected to FAIL); -P: the old tree, not the checkout"
timeout 90 env PYTHONPATH=/tmp/old python3 -P -m pytest -q --noconftest --import-mode=append -p no:cacheprovider tests/gpu/test_batch_invariance.py -k rmsnorm_auto 2>&1 | grep -a "sollat/__init__\|^E .*differ\|passed\|failed" | head -12 | tee $OUT/old-auto-row.txt
env PYTHONPATH=/tmp/old python3 -P -c 'import sollat; print("old tree imported from", sollat.__file__)' | tee -a $OUT/old-auto-row.txt
set -o pipefail
timeout 420 python3 -m pytest -q -ra -p no:cacheprovider tests/gpu 2>&1 | tail -30 | tee $OUT/gpu-tests.txt
