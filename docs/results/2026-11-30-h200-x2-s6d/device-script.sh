#!/usr/bin/env bash
# session 6 call D (x2), final commit: fused vs unfused at few rows, decode ITL at TP2 (auto = unfused
# at 8 rows, the fused one-shot forced, sollat AllReduce, NCCL), the whole real-rank suite, the
# virtual GPU tests
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_COMMIT=$(cat .ab/commit) PYTHONPATH=$PWD SOLLAT_CACHE_DIR=/tmp/sollat-cache
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
R=/tmp/r; mkdir -p $R
el "1 real-rank rmsnorm bench, few rows"
timeout 90 python3 -m torch.distributed.run --standalone --nproc-per-node 2 scripts/rmsnorm_bench.py --replays 15 --shapes 1x4096,2x4096,4x4096,8x4096,1x8192,2x8192,4x8192,8x8192 --commit $SOLLAT_COMMIT --into $R/rmsnorm-real > $R/rmsnorm-real.txt 2>&1; echo "rc=$?"; grep -a -v "^\[\|Warning\|warn\|\*\*\*" $R/rmsnorm-real.txt | cut -c1-175 | tail -11
el "2 real-rank suite"
OUT=$R RUNS=1 SKEW=0 RUN_TIMEOUT=240 timeout 300 bash scripts/real_rank_suite.sh > /dev/null 2>&1
tail -1 $R/real-ranks-summary.txt
grep -a -h "FAIL\|SUMMARY" $R/real-ranks-run1.txt | cut -c1-200 | head -8
el "3 decode ITL TP2"
timeout 200 python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m sollat.apps.decode --context 16384 --backends nccl,sollat,sollat_fused,sollat_fused:oneshot_sentinel --json $R/decode-tp2.json > $R/decode-tp2.txt 2>&1; echo "rc=$?"; grep -a -A9 "ITL p50" $R/decode-tp2.txt | cut -c1-120 | head -12; grep -a "result:\|sollat_fused" $R/decode-tp2.txt | tail -6
el "4 virtual GPU tests"
left=$(( 585 - ($(date +%s) - T0) ))
CUDA_VISIBLE_DEVICES=0 timeout $left python3 -m pytest -q --maxfail=10 tests/gpu > $R/gpu-tests.txt 2>&1; echo "rc=$? (limit $left s)"; grep -a -E "^FAILED|^ERROR|passed|failed" $R/gpu-tests.txt | cut -c1-250 | head -12
cp .ab/s6d.sh $R/device-script.sh
tar czf $OUT/s6d.tgz -C $R .
el done
