#!/usr/bin/env bash
# session 8 call C (x2): correctness of the final kernels: virtual-rank GPU tests (two halves, one
# per GPU) and the real-rank suite
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_COMMIT=$(cat .ab/commit) PYTHONPATH=$PWD SOLLAT_CACHE_DIR=/tmp/sollat-cache
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
R=/tmp/r; mkdir -p $R; cp .ab/s8c.sh $R/device-script.sh
trap 'tar czf $OUT/s8c.tgz -C $R .' EXIT
el "0 precompile"
timeout 150 python3 -m sollat precompile -j 32 > $R/precompile.txt 2>&1; echo "rc=$?"; tail -1 $R/precompile.txt
el "1 virtual-rank GPU tests, two halves side by side"
(CUDA_VISIBLE_DEVICES=0 timeout 250 python3 -m pytest -q tests/gpu/test_rmsnorm.py tests/gpu/test_bulk.py tests/gpu/test_custom.py tests/gpu/test_bench_gpu.py > $R/gpu-a.txt 2>&1; echo "a rc=$?") &
(CUDA_VISIBLE_DEVICES=1 timeout 250 python3 -m pytest -q tests/gpu/test_allreduce.py tests/gpu/test_faults.py tests/gpu/test_gather_scatter.py > $R/gpu-b.txt 2>&1; echo "b rc=$?") &
wait
for f in a b; do grep -a -E "^FAILED|^ERROR|passed|failed" $R/gpu-$f.txt | cut -c1-250 | head; done
el "2 real-rank suite"
left=$(( 575 - ($(date +%s) - T0) ))
OUT=$R RUNS=1 SKEW=0 RUN_TIMEOUT=$(( left - 20 )) timeout $left bash scripts/real_rank_suite.sh > $R/suite-console.txt 2>&1; echo "rc=$? (limit $left)"; tail -1 $R/suite-console.txt
grep -a -h " FAIL\|auto: picks\|picks \|SUMMARY" $R/real-ranks-run1.txt | head -12 | cut -c1-300
el done
