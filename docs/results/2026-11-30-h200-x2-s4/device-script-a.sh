#!/usr/bin/env bash
# session 4 call A (x2): real-rank suite at HEAD, then README command 2 timed with one GPU visible, cold cache
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_COMMIT=$(cat .ab/commit)
T0=$(date +%s)
( export PYTHONPATH=$PWD SOLLAT_CACHE_DIR=/tmp/sollat-cache
  RUNS=1 RUN_TIMEOUT=240 SKEW_TIMEOUT=80 timeout 300 bash scripts/real_rank_suite.sh > /dev/null 2>&1 )
tail -3 $OUT/real-ranks-summary.txt
grep -h "FAIL\|REAL-RANKS\|rmsnorm:" $OUT/real-ranks-run1.txt | head -20
export PIP_NO_INDEX=1 PIP_FIND_LINKS=$PWD/.whl
python3 -m pip install -q -e '.[bench,nvrtc,test]' > $OUT/pip.txt 2>&1; echo "pip rc=$?"
rm -rf ~/.cache/sollat
nproc > $OUT/readme-env.txt; nvidia-smi -L >> $OUT/readme-env.txt
left=$(( 585 - ($(date +%s) - T0) ))
t0=$(date +%s)
CUDA_VISIBLE_DEVICES=0 timeout $left python3 -m pytest -q tests > $OUT/readme-cmd2.txt 2>&1
echo "README command 2: rc=$? $(( $(date +%s) - t0 )) s (limit $left s)" | tee -a $OUT/readme-cmd2.txt
tail -4 $OUT/readme-cmd2.txt
