#!/usr/bin/env bash
# session 13 call A (one H200): the whole virtual-rank GPU suite on main after the public ops were
# written once (sollat/comm/api.py), and the eager host cost per call (scripts/eager_overhead.py)
# of this tree against 59d1d90 (.ab/old-59d1d90.tar, carried), alternating.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache
cp docs/results/2026-12-02-h200-s13a/device-script.sh $OUT/device-script.sh; nvidia-smi -L
t0=$(date +%s)
# (tests/gpu/conftest.py compiles every kernel module first.)
PYTHONPATH=$PWD timeout 430 python3 -m pytest -q -ra -p no:cacheprovider tests/gpu --durations=5 2>&1 | tail -40 > $OUT/gpu-tests.txt
echo "elapsed $(( $(date +%s) - t0 )) s"; tail -3 $OUT/gpu-tests.txt
mkdir -p /tmp/old && tar -xf .ab/old-59d1d90.tar -C /tmp/old
for v in new old new; do
  root=$PWD; [ $v = old ] && root=/tmp/old
  echo "== $v"; (cd $root/scripts && timeout 50 env PYTHONPATH=$root python3 eager_overhead.py)
done > $OUT/eager.txt 2>&1
echo "elapsed $(( $(date +%s) - t0 )) s"; cat $OUT/eager.txt | grep -v "^$" | tail -20
