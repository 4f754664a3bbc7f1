#!/usr/bin/env bash
# session 8 call G (x2, 2026-12-01): the apps at TP2 on the final kernels and table: decode
# (Llama-3.1-70B shapes, context 32k) and CG (256^3, fp64)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_COMMIT=$(cat .ab/commit) PYTHONPATH=$PWD SOLLAT_CACHE_DIR=/tmp/sollat-cache
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cp .ab/s8g.sh $OUT/device-script.sh; echo "commit $SOLLAT_COMMIT"
el "decode"
timeout 190 python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m sollat.apps.decode --context 32768 --backends nccl,sollat,sollat_fused --json $OUT/decode-tp2.json > $OUT/decode-tp2.txt 2>&1; echo "rc=$?"; grep -a -A9 "ITL p50" $OUT/decode-tp2.txt | cut -c1-140 | head -12
el "cg"
timeout 100 python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m sollat.apps.cg --grid 256 --dtype fp64 --backends nccl,sollat --json $OUT/cg-tp2.json > $OUT/cg-tp2.txt 2>&1; echo "rc=$?"; tail -14 $OUT/cg-tp2.txt | cut -c1-160
el done
