#!/usr/bin/env bash
# session 12 call D (one H200): the one GPU test fixed after call C, then the virtual-rank latency
# A/B of this tree against 59d1d90 (issue 27's last commit, .ab/old-59d1d90.tar, carried), R <= 8.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache
cp docs/results/2026-12-02-h200-s12d/device-script.sh $OUT/device-script.sh; nvidia-smi -L
t0=$(date +%s)
PYTHONPATH=$PWD timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_allreduce.py \
  -k "bad_inputs" 2>&1 | tail -3 | tee $OUT/gpu-test.txt
mkdir -p /tmp/old && tar -xf .ab/old-59d1d90.tar -C /tmp/old
for v in new old new old; do
  root=$PWD; [ $v = old ] && root=/tmp/old
  for R in 2 4 8; do
    timeout 40 env PYTHONPATH=$root python3 $root/scripts/ab_latency.py --virtual $R --dtype float32 --replays 11 \
      --algos oneshot_ll,oneshot_sentinel,twoshot_sentinel --sizes 4,128,8192,65536 --tag $v-R$R
  done
done 2>&1 | grep -a "^AB\|rror" > $OUT/ab.txt
echo "elapsed $(( $(date +%s) - t0 )) s"; tail -2 $OUT/ab.txt
