#!/usr/bin/env bash
# session 8 call A (x2): bulk two-shot A/B (early send, 256 blocks per rank) with torch's in-place
# two-shot in the same call, then the new bulk signature on GPUs (virtual-rank tests, real-rank
# mismatch section)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_COMMIT=$(cat .ab/commit) PYTHONPATH=$PWD SOLLAT_CACHE_DIR=/tmp/sollat-cache
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
R=/tmp/r; mkdir -p $R; cp .ab/s8a.sh $R/device-script.sh
trap 'tar czf $OUT/s8a.tgz -C $R .' EXIT
SIZES=4194304,8388608,16777216,33554432,67108864
ab() {  # tag, defines...
  local tag=$1; shift
  local defs=(); for d in "$@"; do defs+=(--define "$d"); done
  timeout 80 python3 -m torch.distributed.run --standalone --nproc-per-node 2 scripts/ab_latency.py --algos twoshot_bulk \
    --sizes $SIZES --calls 30 --replays 10 --tag "$tag" "${defs[@]}" > $R/ab-$tag.log 2>&1
  grep -a "^AB" $R/ab-$tag.log | tee -a $R/bulk-ab.txt; grep -a -i "error\|Traceback" $R/ab-$tag.log | head -3
}
el "1 bulk builds"
ab default
ab early SOLLAT_BULK_EARLY_SEND=1
(export SOLLAT_MAX_BLOCKS=256; ab blocks256)
(export SOLLAT_MAX_BLOCKS=256; ab blocks256-early SOLLAT_BULK_EARLY_SEND=1)
ab default-again
el "2 bench: bulk, auto and torch's two-shot in place, one run"
timeout 120 python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m sollat bench --sizes 4M:64M:2 --replays 15 \
  --algos twoshot_bulk,auto --peers torch-symm --no-progress --commit "$SOLLAT_COMMIT" --into $R/bench > $R/bench-console.txt 2>&1
echo "bench rc=$?"; grep -a -E "^ +[0-9]+ [KM]?i?B|size" $R/bench/bench.txt | cut -c1-300
el "3 precompile"
timeout 120 python3 -m sollat precompile -j 32 > $R/precompile.txt 2>&1; echo "rc=$?"; tail -1 $R/precompile.txt
el "4 virtual-rank tests of the bulk kernel and the mismatch paths, one per GPU"
(CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m pytest -q tests/gpu/test_bulk.py > $R/gpu-a.txt 2>&1; echo "a rc=$?") &
(CUDA_VISIBLE_DEVICES=1 timeout 120 python3 -m pytest -q tests/gpu/test_faults.py -k "mismatch or bulk" > $R/gpu-b.txt 2>&1; echo "b rc=$?") &
wait
for f in a b; do grep -a -E "^FAILED|^ERROR|passed|failed" $R/gpu-$f.txt | cut -c1-250 | head; done
el "5 real-rank suite, mismatch section"
left=$(( 560 - ($(date +%s) - T0) ))
OUT=$R RUNS=1 SKEW=0 RUN_TIMEOUT=$(( left - 15 )) timeout $left bash scripts/real_rank_suite.sh --only mismatch > $R/suite-console.txt 2>&1; echo "rc=$? (limit $left)"; tail -1 $R/suite-console.txt
grep -a -h "FAIL\|bulk" $R/real-ranks-run1.txt | head -20 | cut -c1-300
el done
