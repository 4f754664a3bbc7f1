#!/usr/bin/env bash
# One H200, third call, the final kernels: the A/B of 1be0c58's and 4c1dd9c's kernels against this
# tree (interleaved, virtual ranks R = 2, 4, 8, 4 B .. 64 KiB, fp32 and bf16), the one-shot
# breakdown, the R sweep at 4 B and 128 B, the all_reduce_rmsnorm sweep (bf16 first, cut by its
# budget), then the real-rank suite as 4 processes sharing the GPU with the time left.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache PYTHONPATH=$PWD
D=docs/results/2026-12-03-h200-s16c
cp $D/device-script.sh $OUT/
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
with ProcessPoolExecutor(4, mp_context=multiprocessing.get_context("spawn")) as pool:
    list(pool.map(I._compile_one, work))
print(len(work), "modules", round(time.monotonic() - t, 1), "s")'
( cd .ab/b1be && python3 -c "$PRE" > $OUT/pre-1be0c58.txt 2>&1 ) &
( cd .ab/base && python3 -c "$PRE" > $OUT/pre-4c1dd9c.txt 2>&1 ) &
timeout 90 python3 -c "
import time; from sollat.collectives import instantiations as I; t=time.monotonic()
n=I.precompile(jobs=8); print(n, 'modules', round(time.monotonic()-t, 1), 's')" > $OUT/precompile.txt 2>&1
wait
echo "precompiled at $(( $(date +%s) - t0 )) s"; tail -qn 1 $OUT/pre*.txt
timeout $(left 250) python3 scripts/ab_trees.py --tree 1be0c58=.ab/b1be --tree 4c1dd9c=.ab/base --tree new=. \
  --reps 2 --json $OUT/ab.json > $OUT/ab.txt 2>&1
echo "ab rc $? at $(( $(date +%s) - t0 )) s"; grep -v "^RUN" $OUT/ab.txt | grep -v "^\s*$" | tail -50
timeout $(left 275) python3 scripts/latency_breakdown.py > $OUT/breakdown.txt 2>&1
echo "breakdown rc $? at $(( $(date +%s) - t0 )) s"; tail -7 $OUT/breakdown.txt
timeout $(left 335) python3 scripts/rank_sweep.py --ranks 2,4,8,9,16,32,64,72 --sizes 4,128 --dtype float32 \
  --algos oneshot_ll,oneshot_sentinel,oneshot_ll_wide > $OUT/rank-sweep.txt 2>&1
echo "sweep rc $? at $(( $(date +%s) - t0 )) s"; grep -a "^SWEEP\|^FLOOR" $OUT/rank-sweep.txt | grep -a " 128 \|FLOOR"
B=$(left 360)
timeout $(( B + 15 )) python3 scripts/rmsnorm_bench.py --into $OUT --budget-s $B --commit "${SOLLAT_COMMIT:-unknown}" \
  > $OUT/rmsnorm-bench.txt 2>&1
echo "bench rc $? at $(( $(date +%s) - t0 )) s"; tail -4 $OUT/rmsnorm-bench.txt
timeout $(left 585) python3 -m pytest -q -ra -p no:cacheprovider -m '' tests/gpu/test_multiprocess.py \
  -k "test_real_rank_suite and 4" --durations=3 > $OUT/suite-4proc.txt 2>&1
echo "suite rc $? at $(( $(date +%s) - t0 )) s"; tail -6 $OUT/suite-4proc.txt
