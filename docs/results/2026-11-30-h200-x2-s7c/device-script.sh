#!/usr/bin/env bash
# session 7 call C (x2): bulk two-shot tuning (round size, unroll, pushed/pulled all-gather; fp32,
# scripts/ab_latency.py, one torchrun per build), then the eager cost with the cases taking turns
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_COMMIT=$(cat .ab/commit) PYTHONPATH=$PWD SOLLAT_CACHE_DIR=/tmp/sollat-cache
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
R=/tmp/r; mkdir -p $R; cp .ab/s7c.sh $R/device-script.sh
trap 'tar czf $OUT/s7c.tgz -C $R .' EXIT
SIZES=4194304,8388608,16777216,67108864
ab() {  # tag, defines...
  local tag=$1; shift
  local defs=(); for d in "$@"; do defs+=(--define "$d"); done
  timeout 90 python3 -m torch.distributed.run --standalone --nproc-per-node 2 scripts/ab_latency.py --algos twoshot_bulk \
    --sizes $SIZES --calls 30 --replays 10 --tag "$tag" "${defs[@]}" 2>&1 | grep -a "^AB" | tee -a $R/bulk-ab.txt
}
el "1 bulk builds"
ab default
ab round1024 SOLLAT_BULK_ROUND_LINES=1024
ab round512 SOLLAT_BULK_ROUND_LINES=512
ab pull SOLLAT_BULK_AG_PULL=1
ab pull-round512 SOLLAT_BULK_AG_PULL=1 SOLLAT_BULK_ROUND_LINES=512
ab unroll8 SOLLAT_BULK_UNROLL=8
ab unroll2 SOLLAT_BULK_UNROLL=2
el "2 eager, cases taking turns"
timeout 120 torchrun --nproc-per-node 2 scripts/eager_real.py --into $R > $R/eager.txt 2>&1; echo "rc=$?"; grep -a " us$\|/" $R/eager.txt | head -30
el done
