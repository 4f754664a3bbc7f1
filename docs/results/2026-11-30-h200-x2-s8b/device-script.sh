#!/usr/bin/env bash
# session 8 call B (x2): bulk two-shot geometry A/B (blocks per rank, lines in flight, rounds),
# fp32 and bf16, scripts/ab_latency.py, one torchrun per build
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_COMMIT=$(cat .ab/commit) PYTHONPATH=$PWD SOLLAT_CACHE_DIR=/tmp/sollat-cache
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
R=/tmp/r; mkdir -p $R; cp .ab/s8b.sh $R/device-script.sh
trap 'tar czf $OUT/s8b.tgz -C $R .' EXIT
SIZES=8388608,16777216,33554432,67108864
ab() {  # dtype, tag, defines...
  local dt=$1 tag=$2; shift 2
  local defs=(); for d in "$@"; do defs+=(--define "$d"); done
  timeout 80 python3 -m torch.distributed.run --standalone --nproc-per-node 2 scripts/ab_latency.py --algos twoshot_bulk \
    --dtype $dt --sizes $SIZES --calls 30 --replays 10 --tag "$tag" "${defs[@]}" > $R/ab-$dt-$tag.log 2>&1
  grep -a "^AB" $R/ab-$dt-$tag.log | tee -a $R/bulk-ab.txt; grep -a -i "error" $R/ab-$dt-$tag.log | head -2
}
for dt in float32 bfloat16; do
  el "$dt"
  ab $dt default
  (export SOLLAT_MAX_BLOCKS=64; ab $dt blocks64)
  (export SOLLAT_MAX_BLOCKS=96; ab $dt blocks96)
  ab $dt unroll1 SOLLAT_BULK_UNROLL=1
  ab $dt unroll4 SOLLAT_BULK_UNROLL=4
  ab $dt round1024-early SOLLAT_BULK_ROUND_LINES=1024 SOLLAT_BULK_EARLY_SEND=1
  (export SOLLAT_MAX_BLOCKS=64; ab $dt blocks64-unroll4 SOLLAT_BULK_UNROLL=4)
  ab $dt default-again
done
el done
