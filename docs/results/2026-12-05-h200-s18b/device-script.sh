#!/usr/bin/env bash
# One GPU: the fused kernels' row exchange on mbarriers (this tree) against 027d5c6's cluster barriers
# (ab_fused.py, trees alternating), then the RMSNorm GPU tests and the batch-invariance test at
# this tree, then the all_reduce_rmsnorm sweep. Logs under $OUT.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache
D=docs/results/2026-12-05-h200-s18b
cp $D/device-script.sh $D/ab_fused.py $OUT/
{ nvidia-smi --query-gpu=name,driver_version --format=csv; echo "HEAD $(git rev-parse HEAD) + working tree"; git status --short; date -u +%FT%TZ; } > $OUT/env.txt 2>&1
rm -rf /tmp/base && mkdir -p /tmp/base && git archive 027d5c6 sollat | tar -x -C /tmp/base
timeout 200 python3 $D/ab_fused.py /tmp/base $PWD > $OUT/ab-fused.txt 2>&1; echo "ab rc $? at $SECONDS s"
tail -16 $OUT/ab-fused.txt
PYTHONPATH=. timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_rmsnorm.py tests/gpu/test_batch_invariance.py > $OUT/pytest-rmsnorm.txt 2>&1; echo "pytest rc $? at $SECONDS s"
tail -5 $OUT/pytest-rmsnorm.txt
