#!/usr/bin/env bash
# session 14 call W (one H200): the wide one-shot (oneshot_ll_wide, lines per block fixed per world
# size) in the wide-group GPU tests, then the R sweep oneshot_ll against oneshot_ll_wide
# (R = 2 .. 72, 4 B / 128 B / 8 KiB per rank, fp32). Whole script <= 280 s.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache PYTHONPATH=$PWD
cp docs/results/2026-12-02-h200-s14w/device-script.sh $OUT/device-script.sh; nvidia-smi -L
t0=$(date +%s)
# Every module, 16 at a time (tests/gpu/conftest.py would compile them all before the first test
# anyway; then it only finds them in the cache). Earlier: 50-63 s.
timeout 95 python3 -c "
import time; from sollat import instantiations; t=time.monotonic(); n=instantiations.precompile(jobs=16)
print(n, 'modules', round(time.monotonic()-t, 1), 's')" 2>&1 | tail -3 | tee $OUT/precompile.txt
echo "elapsed $(( $(date +%s) - t0 )) s"
timeout 105 python3 -m pytest -q -ra -p no:cacheprovider tests/gpu/test_wide_groups.py -k oneshot_ll_wide \
  --durations=8 2>&1 | tail -30 > $OUT/wide-tests.txt
echo "elapsed $(( $(date +%s) - t0 )) s"; tail -3 $OUT/wide-tests.txt
timeout 70 python3 scripts/rank_sweep.py --ranks 2,8,9,16,17,32,33,64,72 --sizes 4,128,8192 --dtype float32 \
  --algos oneshot_ll,oneshot_ll_wide > $OUT/rank-sweep.txt 2>&1
echo "elapsed $(( $(date +%s) - t0 )) s"; grep -a "^SWEEP" $OUT/rank-sweep.txt | grep -a " 128 " ; tail -2 $OUT/rank-sweep.txt
