#!/usr/bin/env bash
# One H200, first call: where the sentinel's signature words cost time. The A/B of 1be0c58's
# kernels (the baseline of the soundness target), this tree, and this tree with every lane carrying
# its own signature words (no lane sharing, no vote: SOLLAT_DIAG_SHARE_OFF), interleaved, virtual
# ranks R = 2, 4, 8, 4 B .. 64 KiB, fp32 and bf16; then diagnostic variants of the sentinel kernels
# (no vote, no signature words, lane 0's record word not shuffled), the one-shot breakdown.
# The SOLLAT_DIAG_* switches are a patch for this call only (diag.patch here), not in the package.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache PYTHONPATH=$PWD
D=docs/results/2026-12-03-h200-s16a
cp $D/device-script.sh $D/diag.patch $OUT/ 2>/dev/null
t0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - t0) )); }
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv; echo "commit ${SOLLAT_COMMIT:-unknown}"; } > $OUT/env.txt 2>&1
PRE='
import multiprocessing, time
from concurrent.futures import ProcessPoolExecutor
try:
    from sollat.collectives import instantiations as I
except ImportError:
    from sollat import instantiations as I
t = time.monotonic()
work = [(f, d, "sm_90") for f, d in I.all_instantiations()
        if f in ("allreduce_oneshot.cu", "allreduce_twoshot.cu") and d.get("SOLLAT_MAX_RANKS") in ("2", "4", "8")
        and d.get("SOLLAT_T") in ("float", "sollat::bf16") and d.get("SOLLAT_OP", "OpSum") == "OpSum"]
with ProcessPoolExecutor(8, mp_context=multiprocessing.get_context("spawn")) as pool:
    list(pool.map(I._compile_one, work))
print(len(work), "modules", round(time.monotonic() - t, 1), "s")'
( python3 -c "$PRE" > $OUT/pre-new.txt 2>&1 ) &
( cd .ab/b1be && python3 -c "$PRE" > $OUT/pre-1be0c58.txt 2>&1 ) &
wait
echo "precompiled at $(( $(date +%s) - t0 )) s"; tail -n 2 $OUT/pre-*.txt
timeout $(left 330) python3 scripts/ab_trees.py --tree 1be0c58=.ab/b1be --tree new=. \
  --tree unshared=.:SOLLAT_DIAG_SHARE_OFF=1 --reps 2 --json $OUT/ab.json > $OUT/ab.txt 2>&1
echo "ab rc $? at $(( $(date +%s) - t0 )) s"; grep -v "^RUN" $OUT/ab.txt | tail -60
timeout $(left 420) python3 scripts/ab_trees.py --tree new=. --tree novote=.:SOLLAT_DIAG_NOVOTE=1 \
  --tree nosig=.:SOLLAT_DIAG_NOSIG=1 --tree plainprior=.:SOLLAT_DIAG_PLAINPRIOR=1 --reps 1 --ranks 2,8 \
  --algos oneshot_sentinel,twoshot_sentinel,oneshot_ll --sizes 128,8192 --dtypes float32 --json $OUT/diag.json > $OUT/diag.txt 2>&1
echo "diag rc $? at $(( $(date +%s) - t0 )) s"; grep -v "^RUN" $OUT/diag.txt | tail -20
timeout $(left 500) python3 scripts/latency_breakdown.py > $OUT/breakdown.txt 2>&1
echo "breakdown rc $? at $(( $(date +%s) - t0 )) s"; tail -20 $OUT/breakdown.txt
