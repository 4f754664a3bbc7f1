#!/usr/bin/env bash
# session 9 call C (one H200): L2 prefetch of the input, epoch and fault-record lines before
# griddepcontrol.wait (SOLLAT_PREFETCH_L2=1, which also fetches every kernel parameter before the wait) against without; virtual ranks
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_COMMIT=$(cat .ab/commit) PYTHONPATH=$PWD SOLLAT_CACHE_DIR=/tmp/sollat-cache
cp .ab/s9c.sh $OUT/device-script.sh; echo "commit $SOLLAT_COMMIT (+ uncommitted SOLLAT_PREFETCH_L2 define)"; nvidia-smi -L
AB="timeout 150 python3 scripts/ab_latency.py --dtype float32"
{
  for r in 1 2 3; do
    for v in base pf; do
      d=""; [ $v = pf ] && d="--define SOLLAT_PREFETCH_L2=1"
      $AB --virtual 2 --algos oneshot_ll,oneshot_sentinel --sizes 128,8192 $d --tag r$r-$v-R2
      $AB --virtual 4 --algos oneshot_ll,oneshot_sentinel --sizes 128 $d --tag r$r-$v-R4
    done
  done
} 2>&1 | grep -a "^AB\|rror" | tee $OUT/prefetch-ab.txt
