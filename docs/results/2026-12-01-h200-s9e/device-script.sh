#!/usr/bin/env bash
# session 9 call E (one H200): the L2 prefetches from thread 0 only (working tree) against from every
# thread (s9d's tree, .ab/pfall-sollat.tar) and 193e67c (old), virtual ranks; then tests/gpu/test_allreduce.py
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_COMMIT=$(cat .ab/commit) SOLLAT_CACHE_DIR=/tmp/sollat-cache
cp .ab/s9e.sh $OUT/device-script.sh; echo "commit $SOLLAT_COMMIT + working tree"; nvidia-smi -L
mkdir -p /tmp/old /tmp/all && tar -xf .ab/old-193e67c.tar -C /tmp/old && tar -xf .ab/pfall-sollat.tar -C /tmp/all
NEW=$PWD
{
  for r in 1 2; do
    for v in t0 all old; do
      root=$NEW; [ $v = old ] && root=/tmp/old; [ $v = all ] && root=/tmp/all
      AB="timeout 150 env PYTHONPATH=$root python3 $root/scripts/ab_latency.py --dtype float32"
      $AB --virtual 2 --algos oneshot_ll,oneshot_sentinel --sizes 128,8192,262144 --tag r$r-$v-R2
      $AB --virtual 2 --algos twoshot_sentinel --sizes 128,262144,1048576 --tag r$r-$v-R2
      $AB --virtual 4 --algos oneshot_sentinel --sizes 128,8192 --tag r$r-$v-R4
    done
  done
} 2>&1 | grep -a "^AB\|rror" | tee $OUT/prefetch-t0-ab.txt
export PYTHONPATH=$NEW
timeout 200 python3 -m pytest -q tests/gpu/test_allreduce.py 2>&1 | tail -3 | tee $OUT/tests.txt
