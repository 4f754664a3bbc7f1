#!/usr/bin/env bash
# One H200, first call of the day: the tree with per-lane signature words (every sentinel thread's
# channel 0, shared by the lanes of a pass, a vote per receive) and LL128 reduce-scatter words.
# 1) precompile this tree (all) and 4c1dd9c's one-/two-shot kernels (carried in .ab/base);
# 2) the virtual-rank GPU suite but the multi-process launches;
# 3) the real-rank suite as 3 processes sharing GPU 0 (timings of each section under time slicing);
# 4) the A/B of 4c1dd9c's kernels against this tree's, interleaved (scripts/ab_trees.py).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache PYTHONPATH=$PWD
D=docs/results/2026-12-03-h200-s15a
cp $D/device-script.sh $OUT/device-script.sh
t0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - t0) )); }
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv; echo "commit ${SOLLAT_COMMIT:-unknown}"; } > $OUT/env.txt 2>&1
timeout 110 python3 -c "
import time; from sollat.collectives import instantiations as I; t=time.monotonic(); n=I.precompile(jobs=16)
print('new tree:', n, 'modules', round(time.monotonic()-t, 1), 's')" > $OUT/precompile.txt 2>&1
PYTHONPATH=.ab/base timeout 60 python3 -c "
import time; from sollat import instantiations as I; t=time.monotonic()
n=I.precompile(jobs=16, files={'allreduce_oneshot.cu', 'allreduce_twoshot.cu'})
print('base tree:', n, 'modules', round(time.monotonic()-t, 1), 's')" >> $OUT/precompile.txt 2>&1
echo "precompiled at $(( $(date +%s) - t0 )) s"; cat $OUT/precompile.txt | tail -3
timeout $(left 360) python3 -m pytest -q -ra -p no:cacheprovider tests/gpu --durations=15 \
  --ignore=tests/gpu/test_multiprocess.py > $OUT/gpu-tests.txt 2>&1
echo "gpu tests rc $? at $(( $(date +%s) - t0 )) s"; tail -4 $OUT/gpu-tests.txt; grep -a "^FAILED\|^ERROR" $OUT/gpu-tests.txt | head -20
TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1 SOLLAT_TEST_SHARED_GPU=1 SOLLAT_MP_GRAPH_REPLAYS=5 timeout -k 10 $(left 470) \
  python3 -m torch.distributed.run --standalone --nproc-per-node=3 tests/gpu/mp_suite.py \
  --only values,rmsnorm,auto,mismatch,mismatch_other,compile,dead_peer,graphs > $OUT/mp3.txt 2>&1
echo "mp3 rc $? at $(( $(date +%s) - t0 )) s"; grep -a "RANK 0 \(PASS\|FAIL\|SUMMARY\|SKIP\)\| fail: " $OUT/mp3.txt | head -30
timeout $(left 585) python3 scripts/ab_trees.py --base .ab/base --reps 2 --json $OUT/ab.json > $OUT/ab.txt 2>&1
echo "ab rc $? at $(( $(date +%s) - t0 )) s"; tail -50 $OUT/ab.txt
