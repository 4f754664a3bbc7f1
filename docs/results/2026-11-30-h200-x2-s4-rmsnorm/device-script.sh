#!/usr/bin/env bash
# session 4 call C (x2): the row-cluster fused RMSNorm: virtual GPU tests, the real-rank rmsnorm
# section, the fused bench (real + virtual), the decode app's GPU tests, decode ITL at TP2.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_COMMIT=$(cat .ab/commit) PYTHONPATH=$PWD SOLLAT_CACHE_DIR=/tmp/sollat-cache
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
el "1 virtual rmsnorm tests"
timeout 150 python3 -m pytest -q -x tests/gpu/test_rmsnorm.py > $OUT/gpu-rmsnorm.txt 2>&1; echo "rc=$?"; tail -3 $OUT/gpu-rmsnorm.txt
el "2 real-rank rmsnorm section"
RUNS=1 SKEW=0 RUN_TIMEOUT=100 timeout 130 bash scripts/real_rank_suite.sh --only rmsnorm > /dev/null 2>&1
tail -1 $OUT/real-ranks-summary.txt; grep -h "FAIL\|rmsnorm:" $OUT/real-ranks-run1.txt | head -8
el "3 fused bench, real ranks then virtual"
timeout 120 python3 -m torch.distributed.run --standalone --nproc-per-node 2 scripts/rmsnorm_bench.py --commit $SOLLAT_COMMIT --into $OUT/bench-real > $OUT/bench-real.txt 2>&1; echo "rc=$?"; grep -v Warn $OUT/bench-real.txt | tail -9
timeout 90 python3 scripts/rmsnorm_bench.py --ranks 2,4,8 --commit $SOLLAT_COMMIT --into $OUT/bench-virtual > $OUT/bench-virtual.txt 2>&1; echo "rc=$?"; grep -v Warn $OUT/bench-virtual.txt | tail -18
el "4 decode app GPU tests"
timeout 150 python3 -m pytest -q tests/gpu/test_apps_gpu.py > $OUT/gpu-apps.txt 2>&1; echo "rc=$?"; tail -3 $OUT/gpu-apps.txt
el "5 decode ITL TP2"
left=$(( 570 - ($(date +%s) - T0) ))
timeout $left python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m sollat.apps.decode --context 16384 --backends nccl,sollat,sollat_fused --json $OUT/decode-tp2.json > $OUT/decode-tp2.txt 2>&1; echo "rc=$?"; tail -15 $OUT/decode-tp2.txt
el done
