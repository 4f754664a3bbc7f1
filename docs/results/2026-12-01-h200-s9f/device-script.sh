#!/usr/bin/env bash
# session 9 call F (one H200): the prologue's two changes apart, virtual ranks: "t0" = state copy
# + L2 prefetches (working tree), "p" = L2 prefetches only (--define SOLLAT_STATE_COPY=0: CommState
# read after the wait where used, as before, and its line prefetched), "old" = 193e67c
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_COMMIT=$(cat .ab/commit) SOLLAT_CACHE_DIR=/tmp/sollat-cache
cp .ab/s9f.sh $OUT/device-script.sh; echo "commit $SOLLAT_COMMIT + working tree"; nvidia-smi -L
mkdir -p /tmp/old && tar -xf .ab/old-193e67c.tar -C /tmp/old
NEW=$PWD
{
  for r in 1 2; do
    for v in t0 p old; do
      root=$NEW; d=""; [ $v = old ] && root=/tmp/old; [ $v = p ] && d="--define SOLLAT_STATE_COPY=0"
      AB="timeout 150 env PYTHONPATH=$root python3 $root/scripts/ab_latency.py --dtype float32 $d"
      $AB --virtual 2 --algos oneshot_ll,oneshot_sentinel --sizes 128,8192,262144 --tag r$r-$v-R2
      $AB --virtual 2 --algos twoshot_sentinel,ll128 --sizes 128,262144,1048576,4194304 --tag r$r-$v-R2
      $AB --virtual 4 --algos oneshot_sentinel,twoshot_sentinel --sizes 128,1048576 --tag r$r-$v-R4
    done
  done
} 2>&1 | grep -a "^AB\|rror" | tee $OUT/prologue-parts-ab.txt
