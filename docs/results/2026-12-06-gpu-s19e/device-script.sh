#!/usr/bin/env bash
# One GPU, virtual ranks: where the final fused kernel spends its time above the AllReduce
# (fused_diag.py with fused-diag.patch's SOLLAT_DIAG_FUSED builds K6, K1, K3, K2, applied to a copy
# of the package under /tmp/diagtree). Output: $OUT/fused-diag.txt, $OUT/env.txt.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache
D=docs/results/2026-12-06-gpu-s19e
cp $D/device-script.sh $OUT/
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version --format=csv; echo "commit ${SOLLAT_COMMIT:-unknown}"; date -u +%FT%TZ; } > $OUT/env.txt 2>&1
rm -rf /tmp/diagtree && mkdir -p /tmp/diagtree && cp -r sollat /tmp/diagtree/ && (cd /tmp/diagtree && patch -p1 < $OLDPWD/$D/fused-diag.patch)
PYTHONPATH=/tmp/diagtree timeout ${DIAG_S:-170} python3 $D/fused_diag.py > $OUT/fused-diag.txt 2>&1; echo "diag rc $? at $SECONDS s"
cat $OUT/fused-diag.txt | cut -c1-400
