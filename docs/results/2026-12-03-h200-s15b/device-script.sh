#!/usr/bin/env bash
# One H200, second call: the cost of the per-lane signature words against 4c1dd9c's kernels (the
# A/B, interleaved, virtual ranks R = 2, 4, 8; 4 B .. 64 KiB; fp32 and bf16; scripts/ab_trees.py
# with 4c1dd9c's sollat package carried in .ab/base), then the all_reduce_rmsnorm sweep with the
# one-launch unfused epilogue (scripts/rmsnorm_bench.py, bf16 shapes first, cut by its budget).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache PYTHONPATH=$PWD
D=docs/results/2026-12-03-h200-s15b
cp $D/device-script.sh $OUT/device-script.sh
t0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - t0) )); }
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv; echo "commit ${SOLLAT_COMMIT:-unknown}"; } > $OUT/env.txt 2>&1
timeout 70 python3 -c "
import time; from sollat.collectives import instantiations as I; t=time.monotonic()
keep = lambda f, d: d.get('SOLLAT_FENCE_SYS') == '0' and d.get('SOLLAT_MAX_RANKS') in ('2', '4', '8') and (
    f in ('allreduce_oneshot.cu', 'allreduce_twoshot.cu', 'allreduce_rmsnorm.cu') or f == 'add_rmsnorm.cu')
n=I.precompile(jobs=16, only=keep); print('new tree:', n, 'modules', round(time.monotonic()-t, 1), 's')" > $OUT/precompile.txt 2>&1
(cd .ab/base && timeout 60 python3 -c "
import time; from sollat import instantiations as I; t=time.monotonic()
n=I.precompile(jobs=16, files={'allreduce_oneshot.cu', 'allreduce_twoshot.cu'})
print('base tree (4c1dd9c):', n, 'modules', round(time.monotonic()-t, 1), 's')") >> $OUT/precompile.txt 2>&1
echo "precompiled at $(( $(date +%s) - t0 )) s"; cat $OUT/precompile.txt | tail -3
timeout $(left 205) python3 scripts/ab_trees.py --base .ab/base --reps 2 --json $OUT/ab.json > $OUT/ab.txt 2>&1
echo "ab rc $? at $(( $(date +%s) - t0 )) s"; grep -v "^RUN" $OUT/ab.txt | tail -60
B=$(left 315)
timeout $(( B + 20 )) python3 scripts/rmsnorm_bench.py --into $OUT --budget-s $B --commit "${SOLLAT_COMMIT:-unknown}" \
  > $OUT/rmsnorm-bench.txt 2>&1
echo "bench rc $? at $(( $(date +%s) - t0 )) s"; tail -30 $OUT/rmsnorm-bench.txt
