#!/usr/bin/env bash
# One H200: the fused kernel's cost above the AllReduce (fused_diag.py with fused-diag.patch's
# SOLLAT_DIAG_FUSED builds, applied to a copy of the package under /tmp/diagtree), with PDL and
# without. Output: $OUT/fused-diag.txt, $OUT/fused-diag-nopdl.txt.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache
D=docs/results/2026-12-05-h200-s18a
cp $D/device-script.sh $D/fused_diag.py $D/fused-diag.patch $OUT/
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/env.txt; git rev-parse HEAD >> $OUT/env.txt 2>/dev/null
rm -rf /tmp/diagtree && mkdir -p /tmp/diagtree && cp -r sollat /tmp/diagtree/ && (cd /tmp/diagtree && patch -p1 < $OLDPWD/$D/fused-diag.patch)
PYTHONPATH=/tmp/diagtree timeout 200 python3 $D/fused_diag.py > $OUT/fused-diag.txt 2>&1; echo "rc $?"
PYTHONPATH=/tmp/diagtree timeout 150 python3 $D/fused_diag.py nopdl > $OUT/fused-diag-nopdl.txt 2>&1; echo "rc $?"
cat $OUT/fused-diag.txt $OUT/fused-diag-nopdl.txt
