#!/usr/bin/env bash
# One H200, virtual ranks, development A/Bs (logs tarred into $OUT/logs.tgz):
#   1. all_reduce_rmsnorm, quick sweep (R = 2, 8; 1/8/64 x 4096/8192; bf16): 540415e's package
#      (.ab/head = `git archive 540415e sollat`) against this tree (interleaved butterflies,
#      row_tree_sum in the fused kernels), twice, alternating; then this tree's one-row shapes at
#      other row-cluster widths (--row-lines 128 and 1024; default 256);
#   2. the wide-group AllReduce (R = 9, 16, 72; 128 B and 8 KiB fp32): the table-loading bcast of
#      540415e (SOLLAT_X_OLD_BCAST=1) against the first window's bases loaded before the input is
#      used, each with one or two peer windows per receive (SOLLAT_X_RECV_WIN).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache
D=docs/results/2026-12-03-h200-s17b
L=$OUT/logs; mkdir -p $L; cp $D/device-script.sh $L/
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv; echo "commit ${SOLLAT_COMMIT:-unknown}"; date -u +%FT%TZ; } > $L/env.txt 2>&1
Q="--quick --fp8 none --replays 15"
for rep in 1 2; do
  for t in head new; do
    [ $t = head ] && P=$PWD/.ab/head || P=$PWD
    PYTHONPATH=$P timeout 120 python3 scripts/rmsnorm_bench.py $Q --into $L/rms-$t-$rep --commit $t > $L/rms-$t-$rep.txt 2>&1
    echo "rms $t $rep rc $? at $SECONDS s"; grep -a "^ *[28] " $L/rms-$t-$rep.txt | cut -c1-150
  done
done
for rl in 128 1024; do
  PYTHONPATH=$PWD timeout 60 python3 scripts/rmsnorm_bench.py --ranks 2,8 --hidden 4096,8192 --rows 1 --dtypes bf16 \
    --fp8 none --row-lines $rl --into $L/rms-rl$rl > $L/rms-rl$rl.txt 2>&1
  echo "row-lines $rl rc $? at $SECONDS s"; grep -a "^ *[28] " $L/rms-rl$rl.txt | cut -c1-110
done
export PYTHONPATH=$PWD
timeout 280 python3 scripts/ab_trees.py --tree old=.:SOLLAT_X_OLD_BCAST=1,SOLLAT_X_RECV_WIN=1 \
  --tree bcast=.:SOLLAT_X_RECV_WIN=1 --tree new=.:SOLLAT_X_RECV_WIN=2 --ranks 9,16,72 \
  --algos oneshot_ll,oneshot_sentinel,oneshot_ll_wide --sizes 128,8192 --dtypes float32 --reps 2 \
  --json $L/ab-wide.json > $L/ab-wide.txt 2>&1
echo "ab rc $? at $SECONDS s"; grep -v "^RUN" $L/ab-wide.txt | grep -v "^\s*$" | tail -30
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
