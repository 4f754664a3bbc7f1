#!/usr/bin/env bash
# session 9 call G (one H200): the committed prologue (3edbd7f) against 193e67c, virtual ranks; then the virtual-rank GPU tests at 3edbd7f
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_COMMIT=$(cat .ab/commit) SOLLAT_CACHE_DIR=/tmp/sollat-cache
cp .ab/s9g.sh $OUT/device-script.sh; echo "commit $SOLLAT_COMMIT"; nvidia-smi -L
mkdir -p /tmp/old && tar -xf .ab/old-193e67c.tar -C /tmp/old
NEW=$PWD
{
  for v in new old new old; do
    root=$NEW; [ $v = old ] && root=/tmp/old
    AB="timeout 100 env PYTHONPATH=$root python3 $root/scripts/ab_latency.py --dtype float32 --replays 15"
    $AB --virtual 2 --algos oneshot_ll,oneshot_sentinel --sizes 128,8192,262144 --tag $v-R2
    $AB --virtual 2 --algos twoshot_sentinel --sizes 128,1048576,4194304 --tag $v-R2
    $AB --virtual 4 --algos oneshot_sentinel,twoshot_sentinel --sizes 128,1048576 --tag $v-R4
  done
} 2>&1 | grep -a "^AB\|rror" | tee $OUT/final-ab.txt
export PYTHONPATH=$NEW
timeout 280 python3 -m pytest -q -x tests/gpu/test_faults.py tests/gpu/test_allreduce.py tests/gpu/test_rmsnorm.py tests/gpu/test_gather_scatter.py tests/gpu/test_bulk.py tests/gpu/test_custom.py 2>&1 | tail -4 | tee $OUT/tests.txt
