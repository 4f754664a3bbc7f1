#!/usr/bin/env bash
# session 12 call D (one H200): the wide one-shot (oneshot_ll_wide) in the wide-group tests and the
# R sweep, the GPU test fixed after call C, and the virtual-rank latency A/B of this tree against
# 59d1d90 (issue 27's last commit, .ab/old-59d1d90.tar, carried) at R <= 8.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache
cp docs/results/2026-12-02-h200-s12d/device-script.sh $OUT/device-script.sh; nvidia-smi -L
t0=$(date +%s)
PYTHONPATH=$PWD timeout 150 python3 -c "
import time; from sollat import instantiations; t=time.monotonic(); n=instantiations.precompile(jobs=16)
print(n, 'modules', round(time.monotonic()-t, 1), 's')" 2>&1 | tail -3 | tee $OUT/precompile.txt
PYTHONPATH=$PWD timeout 150 python3 -m pytest -q -ra -p no:cacheprovider tests/gpu/test_wide_groups.py \
  tests/gpu/test_allreduce.py -k "wide or bad_inputs" --durations=5 2>&1 | tail -25 | tee $OUT/wide-tests.txt
echo "elapsed $(( $(date +%s) - t0 )) s"
PYTHONPATH=$PWD timeout 100 python3 scripts/rank_sweep.py --ranks 2,8,9,16,17,32,33,64,72 2>&1 > $OUT/rank-sweep.txt
echo "elapsed $(( $(date +%s) - t0 )) s"
mkdir -p /tmp/old && tar -xf .ab/old-59d1d90.tar -C /tmp/old
for v in new old new old; do
  root=$PWD; [ $v = old ] && root=/tmp/old
  for R in 2 4 8; do
    timeout 40 env PYTHONPATH=$root python3 $root/scripts/ab_latency.py --virtual $R --dtype float32 --replays 11 \
      --algos oneshot_ll,oneshot_sentinel,twoshot_sentinel --sizes 4,128,8192,65536 --tag $v-R$R
  done
done 2>&1 | grep -a "^AB\|rror" > $OUT/ab.txt
echo "elapsed $(( $(date +%s) - t0 )) s"; tail -2 $OUT/ab.txt
