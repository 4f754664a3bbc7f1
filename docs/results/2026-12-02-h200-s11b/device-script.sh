#!/usr/bin/env bash
# session 11 call B (one H200): the PTX-sound protocols with the ring of sentinel signature words.
# Precompile, the AllReduce latency A/B against 1be0c58 (virtual ranks R = 2, 4, 8, fp32 and bf16,
# 4 B - 64 KiB, rounds alternating new/old; scripts/ab_latency.py: graph of 50 calls, median of 11
# replays), then the whole virtual-rank GPU suite in the time left.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache
D=docs/results/2026-12-02-h200-s11b
cp $D/device-script.sh $OUT/device-script.sh; nvidia-smi -L; cat .ab/commit
NEW=$PWD
mkdir -p /tmp/old && tar -xf .ab/old-1be0c58.tar -C /tmp/old
PYTHONPATH=$NEW timeout 150 python3 -m sollat precompile -j 16 --no-progress 2>&1 | tail -1 | tee $OUT/precompile.txt
for round in 1 2; do
  for v in new old; do
    root=$NEW; [ $v = old ] && root=/tmp/old
    for dt in float32 bfloat16; do
      for R in 2 4 8; do
        [ $SECONDS -gt 300 ] && continue
        timeout 60 env PYTHONPATH=$root python3 $root/scripts/ab_latency.py --virtual $R --dtype $dt --replays 11 --calls 50 \
          --algos oneshot_ll,oneshot_sentinel,twoshot_sentinel --sizes 4,128,8192,65536 --tag $v-R$R
      done
    done
  done 2>&1 | grep -a "^AB\|rror" >> $OUT/ab.txt
  echo "round $round done at $SECONDS s"
done
grep -c WRONG $OUT/ab.txt
LEFT=$((585 - SECONDS)); echo "suite gets $LEFT s"
PYTHONPATH=$NEW timeout $LEFT python3 -m pytest -q -ra -p no:cacheprovider tests/gpu 2>&1 | tail -30 | tee $OUT/gpu-tests.txt
