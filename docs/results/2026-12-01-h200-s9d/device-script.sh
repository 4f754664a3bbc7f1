#!/usr/bin/env bash
# session 9 call D (one H200): the prologue with the state copy and the L2 prefetches (working tree,
# 709e9ee + the prefetch) against 193e67c (old), virtual ranks; then the virtual-rank GPU tests of the new build
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_COMMIT=$(cat .ab/commit) SOLLAT_CACHE_DIR=/tmp/sollat-cache
cp .ab/s9d.sh $OUT/device-script.sh; echo "commit $SOLLAT_COMMIT + working tree"; nvidia-smi -L
mkdir -p /tmp/old && tar -xf .ab/old-193e67c.tar -C /tmp/old
NEW=$PWD
{
  for r in 1 2; do
    for v in new old; do
      root=$NEW; [ $v = old ] && root=/tmp/old
      AB="timeout 150 env PYTHONPATH=$root python3 $root/scripts/ab_latency.py --dtype float32"
      $AB --virtual 2 --algos oneshot_ll,oneshot_sentinel,twoshot_sentinel --sizes 128,8192,262144 --tag r$r-$v-R2
      $AB --virtual 4 --algos oneshot_ll,oneshot_sentinel --sizes 128,8192 --tag r$r-$v-R4
      $AB --virtual 8 --algos oneshot_ll --sizes 128 --tag r$r-$v-R8
      $AB --virtual 2 --algos twoshot_bulk --sizes 8388608 --calls 20 --replays 10 --tag r$r-$v-R2
    done
  done
} 2>&1 | grep -a "^AB\|rror" | tee $OUT/prologue-ab.txt
export PYTHONPATH=$NEW
timeout 420 python3 -m pytest -q tests/gpu/test_rmsnorm.py tests/gpu/test_bulk.py tests/gpu/test_custom.py tests/gpu/test_allreduce.py tests/gpu/test_faults.py tests/gpu/test_gather_scatter.py 2>&1 | tail -15 | tee $OUT/tests.txt
