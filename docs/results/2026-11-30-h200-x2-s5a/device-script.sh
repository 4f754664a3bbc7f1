#!/usr/bin/env bash
# session 5 call A (x2): real-rank suite at HEAD, AG/RS bench (real), then README command 2 with one GPU
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_COMMIT=$(cat .ab/commit)
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
el "1 real-rank suite"
( export PYTHONPATH=$PWD SOLLAT_CACHE_DIR=/tmp/sollat-cache
  RUNS=1 RUN_TIMEOUT=240 SKEW_TIMEOUT=80 timeout 330 bash scripts/real_rank_suite.sh > /dev/null 2>&1 )
tail -3 $OUT/real-ranks-summary.txt
grep -h "FAIL\|REAL-RANKS" $OUT/real-ranks-run1.txt | head -20
el "2 AG/RS bench real"
PYTHONPATH=$PWD SOLLAT_CACHE_DIR=/tmp/sollat-cache timeout 70 python3 -m torch.distributed.run --standalone --nproc-per-node 2 scripts/gather_scatter_bench.py --into $OUT/gs-real > $OUT/gs-real.txt 2>&1; echo "rc=$?"; grep -v Warn $OUT/gs-real.txt | tail -30 | cut -c1-160
el "3 virtual GPU tests (one GPU visible, warm cache)"
left=$(( 590 - ($(date +%s) - T0) ))
t0=$(date +%s)
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$PWD SOLLAT_CACHE_DIR=/tmp/sollat-cache timeout $left python3 -m pytest -q tests/gpu/test_gather_scatter.py tests/gpu/test_rmsnorm.py tests/gpu/test_custom.py tests/gpu > $OUT/gpu-tests.txt 2>&1
echo "gpu tests: rc=$? $(( $(date +%s) - t0 )) s (limit $left s)" | tee -a $OUT/gpu-tests.txt
grep -E "^FAILED|^ERROR" $OUT/gpu-tests.txt | head; tail -3 $OUT/gpu-tests.txt
el done
