#!/usr/bin/env bash
# session 9 call A (one H200): pre-wait warm-up of the parameters and CommState (SOLLAT_PREWAIT), virtual ranks; allocation forms
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_COMMIT=$(cat .ab/commit) PYTHONPATH=$PWD SOLLAT_CACHE_DIR=/tmp/sollat-cache
cp .ab/s9a.sh $OUT/device-script.sh; echo "commit $SOLLAT_COMMIT (+ uncommitted PREWAIT define)"; nvidia-smi -L
AB="timeout 120 python3 scripts/ab_latency.py --virtual 2 --dtype float32 --sizes 128"
{
  for r in 1 2; do
    for pw in 0 1 2; do
      $AB --algos oneshot_ll,oneshot_sentinel --define SOLLAT_PREWAIT=$pw --tag r$r-pw$pw
    done
    for bd in 3 2 4; do for pw in 0 2; do
      $AB --algos oneshot_ll --kernel-file oneshot_ll=diag_oneshot_breakdown.cu --define SOLLAT_BREAKDOWN=$bd --define SOLLAT_PREWAIT=$pw --tag r$r-bd$bd-pw$pw
    done; done
  done
} 2>&1 | grep -a "^AB\|rror" | tee $OUT/prewait.txt
timeout 200 python3 scripts/alloc_variants.py --into $OUT 2>&1 | tee $OUT/alloc.txt
