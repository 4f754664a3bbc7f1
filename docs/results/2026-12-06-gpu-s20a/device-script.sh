#!/usr/bin/env bash
# One GPU, virtual ranks: the wide one-shot cut into stages, polls with a back-off, rank clusters
# and the wide rank cap at R = 8 (wide_diag.py with wide-diag.patch applied to a copy of the
# package under /tmp/diagtree). Output: $OUT/wide-diag.txt, $OUT/env.txt.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache
D=docs/results/2026-12-06-gpu-s20a
cp $D/device-script.sh $OUT/
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version --format=csv; echo "commit ${SOLLAT_COMMIT:-unknown}"; date -u +%FT%TZ; } > $OUT/env.txt 2>&1
rm -rf /tmp/diagtree && mkdir -p /tmp/diagtree && cp -r sollat /tmp/diagtree/ && (cd /tmp/diagtree && patch -p1 < $OLDPWD/$D/wide-diag.patch)
PYTHONPATH=/tmp/diagtree timeout ${DIAG_S:-400} python3 $D/wide_diag.py > $OUT/wide-diag.txt 2>&1; echo "diag rc $? at $SECONDS s"
grep -A200 BEST $OUT/wide-diag.txt; grep FAIL $OUT/wide-diag.txt | head
