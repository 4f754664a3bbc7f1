#!/usr/bin/env bash
# session 7 call A (x2): the previous session's last commit on 2 GPUs (real-rank suite, virtual-rank
# GPU tests split over the two GPUs), then where an eager call's host time goes
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_COMMIT=$(cat .ab/commit) PYTHONPATH=$PWD SOLLAT_CACHE_DIR=/tmp/sollat-cache
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
R=/tmp/r; mkdir -p $R; cp .ab/s7a.sh $R/device-script.sh
trap 'tar czf $OUT/s7a.tgz -C $R .' EXIT
el "1 real-rank suite"
OUT=$R RUNS=1 SKEW=0 RUN_TIMEOUT=240 bash scripts/real_rank_suite.sh > $R/suite-console.txt 2>&1; echo "rc=$?"; tail -2 $R/suite-console.txt
el "2 eager breakdown"
timeout 100 torchrun --nproc-per-node 2 scripts/eager_breakdown.py --into $R > $R/eager-breakdown.txt 2>&1; echo "rc=$?"; grep -a " us$" $R/eager-breakdown.txt
el "3 eager"
timeout 100 torchrun --nproc-per-node 2 scripts/eager_real.py --into $R > $R/eager.txt 2>&1; echo "rc=$?"; grep -a "sollat out= /" $R/eager.txt
el "4 virtual-rank GPU tests, two halves side by side"
left=$(( 570 - ($(date +%s) - T0) ))
(CUDA_VISIBLE_DEVICES=0 timeout $left python3 -m pytest -q tests/gpu/test_rmsnorm.py tests/gpu/test_custom.py tests/gpu/test_faults.py > $R/gpu-a.txt 2>&1; echo "a rc=$?") &
(CUDA_VISIBLE_DEVICES=1 timeout $left python3 -m pytest -q tests/gpu/test_allreduce.py tests/gpu/test_gather_scatter.py tests/gpu/test_bench_gpu.py > $R/gpu-b.txt 2>&1; echo "b rc=$?") &
wait
for f in a b; do grep -a -E "^FAILED|^ERROR|passed|failed" $R/gpu-$f.txt | cut -c1-250 | head; done
el done
