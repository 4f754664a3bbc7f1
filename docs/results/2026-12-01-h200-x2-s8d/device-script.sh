#!/usr/bin/env bash
# session 8 call D (x2): the distributed bench at the final kernels (issue 13's bench.json), the
# eager cost, then tune (the real-rank selection table, measured)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_COMMIT=$(cat .ab/commit) PYTHONPATH=$PWD SOLLAT_CACHE_DIR=/tmp/sollat-cache
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
R=$OUT; cp .ab/s8d.sh $R/device-script.sh
el "0 precompile"
timeout 100 python3 -m sollat precompile -j 32 > $R/precompile.txt 2>&1; echo "rc=$?"; tail -1 $R/precompile.txt
el "1 bench"
timeout 250 python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m sollat bench --sizes 4:64M:4 --replays 15 --barrier \
  --no-progress --commit "$SOLLAT_COMMIT" --into $R/bench > $R/bench-console.txt 2>&1
echo "bench rc=$?"; grep -a -E "^ +[0-9]+ [KM]?i?B|size|floor" $R/bench/bench.txt | cut -c1-330
el "2 eager"
timeout 90 python3 -m torch.distributed.run --standalone --nproc-per-node 2 scripts/eager_real.py --into $R > $R/eager.txt 2>&1; echo "rc=$?"; grep -a " us$\|/" $R/eager.txt | head -20
el "3 tune"
left=$(( 560 - ($(date +%s) - T0) ))
timeout $left python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m sollat tune --out $R/tune > $R/tune.txt 2>&1; echo "tune rc=$? (limit $left)"; tail -30 $R/tune.txt | cut -c1-200
el done
