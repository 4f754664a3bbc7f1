#!/usr/bin/env bash
# session 14 call A (one H200): the wide one-shot's script (s14w: precompile, its GPU tests, the R
# sweep oneshot_ll vs oneshot_ll_wide), then the eager host cost per call (scripts/eager_overhead.py)
# of this tree against 59d1d90 (.ab/old-59d1d90.tar, carried), alternating, then the GPU test files
# whose helpers moved (tests/gpu/_graphs.py etc.) with the time left.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache
t0=$(date +%s)
bash docs/results/2026-12-02-h200-s14w/device-script.sh
cp docs/results/2026-12-02-h200-s14a/device-script.sh $OUT/device-script-s14a.sh
mkdir -p /tmp/old && tar -xf .ab/old-59d1d90.tar -C /tmp/old
for v in new old new; do
  root=$PWD; [ $v = old ] && root=/tmp/old
  echo "== $v"; (cd $root/scripts && timeout 50 env PYTHONPATH=$root python3 eager_overhead.py)
done > $OUT/eager.txt 2>&1
echo "elapsed $(( $(date +%s) - t0 )) s"; grep -v "^$" $OUT/eager.txt | tail -24
PYTHONPATH=$PWD timeout $(( 575 - ($(date +%s) - t0) )) python3 -m pytest -q -ra -p no:cacheprovider \
  tests/gpu/test_custom.py tests/gpu/test_gather_scatter.py tests/gpu/test_bulk.py 2>&1 | tail -25 > $OUT/moved-helpers-tests.txt
echo "elapsed $(( $(date +%s) - t0 )) s"; tail -4 $OUT/moved-helpers-tests.txt
