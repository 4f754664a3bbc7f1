#!/usr/bin/env bash
# session 7 call B (x2): the bulk two-shot (virtual-rank tests, real-rank suite, bench against
# torch's two-shot and NCCL) and the eager hot path (breakdown, eager cost)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_COMMIT=$(cat .ab/commit) PYTHONPATH=$PWD SOLLAT_CACHE_DIR=/tmp/sollat-cache
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
R=/tmp/r; mkdir -p $R; cp .ab/s7b.sh $R/device-script.sh
trap 'tar czf $OUT/s7b.tgz -C $R .' EXIT
el "0 precompile"
timeout 150 python3 -m sollat precompile -j 32 > $R/precompile.txt 2>&1; echo "rc=$?"; tail -2 $R/precompile.txt
el "1 virtual-rank bulk tests, both GPUs"
(CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m pytest -q -x tests/gpu/test_bulk.py > $R/gpu-bulk.txt 2>&1; echo "bulk rc=$?") &
(CUDA_VISIBLE_DEVICES=1 timeout 120 python3 -m pytest -q tests/gpu/test_allreduce.py tests/gpu/test_faults.py -k bulk > $R/gpu-bulk-generic.txt 2>&1; echo "generic rc=$?") &
wait
for f in gpu-bulk gpu-bulk-generic; do grep -a -E "^FAILED|^ERROR|passed|failed|Error" $R/$f.txt | cut -c1-300 | head -8; done
el "2 eager"
timeout 60 torchrun --nproc-per-node 2 scripts/eager_breakdown.py --into $R > $R/eager-breakdown.txt 2>&1; echo "rc=$?"; grep -a " us$" $R/eager-breakdown.txt
timeout 60 torchrun --nproc-per-node 2 scripts/eager_real.py --into $R > $R/eager.txt 2>&1; echo "rc=$?"; grep -a "sollat\|torch x" $R/eager.txt | head -20
el "3 bench, large sizes"
timeout 150 python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m sollat bench --sizes 256K:64M:2 --replays 15 --no-progress \
  --algos twoshot_sentinel,twoshot_bulk,auto --peers torch-symm,nccl --no-plots --commit "$SOLLAT_COMMIT" --into $R/bench > $R/bench-console.txt 2>&1
echo "bench rc=$?"; grep -a -E "^ +[0-9]+ [KM]iB|size" $R/bench/bench.txt | cut -c1-260
el "4 real-rank suite"
left=$(( 585 - ($(date +%s) - T0) ))
OUT=$R RUNS=1 SKEW=0 RUN_TIMEOUT=$(( left - 30 )) timeout $left bash scripts/real_rank_suite.sh > $R/suite-console.txt 2>&1; echo "rc=$? (limit $left)"; tail -1 $R/suite-console.txt
grep -a -h "FAIL\|twoshot_bulk" $R/real-ranks-run1.txt | head -12 | cut -c1-250
el done
