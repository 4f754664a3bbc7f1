#!/usr/bin/env bash
# session 5 call B (x2): symmetric-input zero copy + AG/RS thresholds on real ranks, AG/RS bench with
# torch symm peers, eager cost on real ranks, the distributed bench (issue 13's bench.json)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_COMMIT=$(cat .ab/commit) PYTHONPATH=$PWD SOLLAT_CACHE_DIR=/tmp/sollat-cache
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
el "1 real-rank sections symmetric, auto, gather_scatter"
RUNS=1 SKEW=0 RUN_TIMEOUT=200 timeout 260 bash scripts/real_rank_suite.sh --only symmetric,auto,gather_scatter > /dev/null 2>&1
tail -1 $OUT/real-ranks-summary.txt
grep -h "fail\|FAIL\|symmetric:" $OUT/real-ranks-run1.txt | head -20
el "2 AG/RS bench real"
timeout 90 python3 -m torch.distributed.run --standalone --nproc-per-node 2 scripts/gather_scatter_bench.py --commit $SOLLAT_COMMIT --into $OUT/gs-real > $OUT/gs-real.txt 2>&1; echo "rc=$?"; grep -v "Warn\|OMP\|\*\*\*" $OUT/gs-real.txt | grep -v "^$" | tail -24 | cut -c1-190
el "3 eager on real ranks"
timeout 90 python3 -m torch.distributed.run --standalone --nproc-per-node 2 scripts/eager_real.py --into $OUT/eager > $OUT/eager.txt 2>&1; echo "rc=$?"; grep " B " $OUT/eager.txt | tail -24
el "4 distributed bench"
left=$(( 585 - ($(date +%s) - T0) ))
timeout $left python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m sollat bench --sizes 4:64M:4 --replays 15 --barrier --no-progress \
  --commit "$SOLLAT_COMMIT" --into $OUT/bench > $OUT/bench-console.txt 2>&1
echo "bench rc=$? limit $left s"
grep -A20 "float32$" $OUT/bench/bench.txt | head -24 | cut -c1-250
el done
