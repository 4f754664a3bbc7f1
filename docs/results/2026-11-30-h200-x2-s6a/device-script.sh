#!/usr/bin/env bash
# session 6 call A (x2): real-rank suite at HEAD; then the experimental fused two-shot (virtual tests,
# real-rank rmsnorm section, real-rank bench against the one-shot), all tarred
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_COMMIT=$(cat .ab/commit) PYTHONPATH=$PWD SOLLAT_CACHE_DIR=/tmp/sollat-cache
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
R=/tmp/r; mkdir -p $R
el "1 real-rank suite"
OUT=$R RUNS=1 SKEW=0 RUN_TIMEOUT=230 timeout 290 bash scripts/real_rank_suite.sh > /dev/null 2>&1
tail -1 $R/real-ranks-summary.txt
grep -h "fail\|FAIL\|SUMMARY" $R/real-ranks-run1.txt | head -16
export SOLLAT_EXPERIMENTAL_RMSNORM_TWOSHOT=1
el "2 virtual rmsnorm tests with the two-shot"
CUDA_VISIBLE_DEVICES=0 timeout 170 python3 -m pytest -q -x tests/gpu/test_rmsnorm.py -k "not fp8" > $R/gpu-rmsnorm-twoshot.txt 2>&1; echo "rc=$?"; grep -E "^FAILED|^ERROR|passed|failed|Error" $R/gpu-rmsnorm-twoshot.txt | head -12
el "3 real-rank rmsnorm section with the two-shot"
SOLLAT_MP_SECTIONS=rmsnorm timeout 80 python3 -m torch.distributed.run --standalone --nproc-per-node 2 tests/gpu/mp_suite.py > $R/mp-rmsnorm-twoshot.txt 2>&1; echo "rc=$?"; grep -E "fail|FAIL|SUMMARY|rmsnorm" $R/mp-rmsnorm-twoshot.txt | head -12
el "4 real-rank rmsnorm bench"
timeout 100 python3 -m torch.distributed.run --standalone --nproc-per-node 2 scripts/rmsnorm_bench.py --replays 15 --shapes 1x8192,8x8192,32x8192,128x8192,512x8192 --commit $SOLLAT_COMMIT --into $R/rmsnorm-real > $R/rmsnorm-real.txt 2>&1; echo "rc=$?"; grep -v "^\[\|Warning\|warn" $R/rmsnorm-real.txt | cut -c1-260 | tail -12
cp .ab/s6a.sh $R/device-script.sh
tar czf $OUT/s6a.tgz -C $R .
el done
