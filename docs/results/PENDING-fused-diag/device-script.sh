#!/usr/bin/env bash
# One H200, about 2 minutes: where the fused AllReduce + RMSNorm spends its time above the AllReduce
# (fused_diag.py; SOLLAT_DIAG_FUSED builds from fused-diag.patch, applied to a copy of the package
# under /tmp/diagtree). Output: $OUT/fused-diag.txt.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache
D=docs/results/PENDING-fused-diag
cp $D/device-script.sh $D/fused_diag.py $D/fused-diag.patch $OUT/
rm -rf /tmp/diagtree && mkdir -p /tmp/diagtree && cp -r sollat /tmp/diagtree/ && (cd /tmp/diagtree && patch -p1 < $OLDPWD/$D/fused-diag.patch)
PYTHONPATH=/tmp/diagtree timeout 240 python3 $D/fused_diag.py > $OUT/fused-diag.txt 2>&1
echo "rc $?"; cat $OUT/fused-diag.txt
