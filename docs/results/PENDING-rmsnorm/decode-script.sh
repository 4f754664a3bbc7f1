#!/usr/bin/env bash
# One H200, virtual ranks: the Llama-3.1-70B-shaped decode app (8 of its 80 layers, batch 8, 4096
# prefilled tokens) with the fused AllReduce + residual + RMSNorm off (`sollat`: sollat's AllReduce,
# then torch's add and RMSNorm) and on (`sollat_fused`: auto; `sollat_fused:unfused`: the AllReduce,
# then sollat's one-launch epilogue) at every TP size the model's 8 KV heads allow on one GPU besides 1.
# The ratio on the model's own shapes, not an inter-token latency claim (every rank shares one GPU).
# About 2-3 minutes; each TP size under its own timeout. Outputs: $OUT/decode-tp{2,4,8}.{txt,json}.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache PYTHONPATH=$PWD
OUT=${OUT:-/tmp/decode-out}
mkdir -p "$OUT"
for tp in 2 4 8; do
  timeout 90 python3 -m sollat.apps.decode --virtual-tp "$tp" --layers 8 --context 4096 --batch 8 --steps 64 \
    --warmup 8 --backends sollat,sollat_fused,sollat_fused:unfused --json "$OUT/decode-tp$tp.json" \
    > "$OUT/decode-tp$tp.txt" 2>&1
  echo "TP $tp rc=$?"; grep -a -E "^sollat|^no AllReduce|result:" "$OUT/decode-tp$tp.txt"
done
