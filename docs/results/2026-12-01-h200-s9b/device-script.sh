#!/usr/bin/env bash
# session 9 call B (one H200): CommState copied before griddepcontrol.wait (new) against after it
# (SOLLAT_STATE_AFTER_WAIT=1, the old order), virtual ranks; then the virtual-rank GPU tests of the new build
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_COMMIT=$(cat .ab/commit) PYTHONPATH=$PWD SOLLAT_CACHE_DIR=/tmp/sollat-cache
cp .ab/s9b.sh $OUT/device-script.sh; echo "commit $SOLLAT_COMMIT"; git diff --stat 2>/dev/null; nvidia-smi -L
AB="timeout 150 python3 scripts/ab_latency.py --dtype float32"
{
  for r in 1 2; do
    for v in new old; do
      d=""; [ $v = old ] && d="--define SOLLAT_STATE_AFTER_WAIT=1"
      $AB --virtual 2 --algos oneshot_ll,oneshot_sentinel,twoshot_sentinel --sizes 128,8192,262144 $d --tag r$r-$v-R2
      $AB --virtual 4 --algos oneshot_ll,oneshot_sentinel --sizes 128 $d --tag r$r-$v-R4
      $AB --virtual 2 --algos twoshot_bulk --sizes 8388608 --calls 20 --replays 10 $d --tag r$r-$v-R2
    done
  done
} 2>&1 | grep -a "^AB\|rror" | tee $OUT/state-ab.txt
timeout 400 python3 -m pytest -q -x tests/gpu/test_allreduce.py tests/gpu/test_faults.py tests/gpu/test_gather_scatter.py 2>&1 | tail -15 | tee $OUT/tests.txt
