#!/usr/bin/env bash
# One GPU, virtual ranks, the final kernels: every kernel precompiled (and 1be0c58's one- and
# two-shots, carried in .ab/b1be); the all_reduce_rmsnorm sweep (324 shapes, the tables' rules
# derived from it where the card has virtual-rank tables); the A/B of 1be0c58's kernels against
# this tree (scripts/ab_trees.py: R = 2, 4, 8; one- and two-shots; 4 B .. 64 KiB; fp32, bf16);
# the R sweep (2 .. 72 ranks, 4 B .. 64 KiB); the one-shot breakdown. Logs tarred into
# $OUT/logs.tgz, the main ones also plain.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache PYTHONPATH=$PWD
D=docs/results/2026-12-06-gpu-s19b
C=${SOLLAT_COMMIT:-unknown}
L=$OUT/logs; mkdir -p $L; cp $D/device-script.sh $L/
left() { echo $(( ${BUDGET:-580} - SECONDS )); }
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv; echo "commit $C"; date -u +%FT%TZ; python3 -c 'import torch; print("torch", torch.__version__)'; } > $L/env.txt 2>&1
PRE='
import multiprocessing, time
from concurrent.futures import ProcessPoolExecutor
from sollat.collectives import instantiations as I
t = time.monotonic()
work = [(f, d, "sm_90") for f, d in I.all_instantiations()
        if f in ("allreduce_oneshot.cu", "allreduce_twoshot.cu") and d.get("SOLLAT_MAX_RANKS") in ("2", "4", "8")
        and d.get("SOLLAT_T") in ("float", "sollat::bf16") and d.get("SOLLAT_OP", "OpSum") == "OpSum"]
with ProcessPoolExecutor(4, mp_context=multiprocessing.get_context("spawn")) as pool:
    list(pool.map(I._compile_one, work))
print(len(work), "modules", round(time.monotonic() - t, 1), "s")'
( cd .ab/b1be && PYTHONPATH=$PWD python3 -c "$PRE" > $L/pre-1be0c58.txt 2>&1 ) &
timeout 120 python3 -c "
import time; from sollat.collectives import instantiations as I; t=time.monotonic()
n=I.precompile(jobs=12); print(n, 'modules', round(time.monotonic()-t, 1), 's')" > $L/precompile.txt 2>&1
wait
echo "precompiled at $SECONDS s"; tail -qn 1 $L/pre*.txt
timeout 170 python3 scripts/rmsnorm_bench.py --into $L/rmsnorm --commit "$C" --write-tables $L/tuning > $L/rmsnorm-bench.txt 2>&1
echo "bench rc $? at $SECONDS s"; tail -3 $L/rmsnorm-bench.txt; ls $L/tuning 2>/dev/null
timeout $(( $(left) - 150 )) python3 scripts/ab_trees.py --tree 1be0c58=.ab/b1be --tree new=. --reps 2 --json $L/ab.json > $L/ab.txt 2>&1
echo "ab rc $? at $SECONDS s"; grep -v "^RUN" $L/ab.txt | grep -v "^\s*$" | tail -50
timeout $(( $(left) - 30 )) python3 scripts/rank_sweep.py --ranks 2,4,8,9,16,32,64,72 --sizes 4,128,8192,65536 --dtype float32 \
  --algos oneshot_ll,oneshot_sentinel,oneshot_ll_wide > $L/rank-sweep.txt 2>&1
echo "sweep rc $? at $SECONDS s"; grep -a "^SWEEP\|^FLOOR" $L/rank-sweep.txt | grep -a " 128 \|FLOOR"
timeout $(left) python3 scripts/latency_breakdown.py > $L/breakdown.txt 2>&1
echo "breakdown rc $? at $SECONDS s"; tail -8 $L/breakdown.txt
cp $L/rmsnorm-bench.txt $L/ab.txt $L/rank-sweep.txt $L/breakdown.txt $L/env.txt $OUT/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L; ls $OUT
