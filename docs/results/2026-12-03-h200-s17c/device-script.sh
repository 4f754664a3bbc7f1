#!/usr/bin/env bash
# One H200, the final kernels, virtual ranks (logs tarred into $OUT/logs.tgz): every kernel
# precompiled (for this call and the GPU suite right after it, same machine), the all_reduce_rmsnorm
# sweep (324 shapes), the bf16 one- to 16-row shapes again at a row-cluster width of 128 lines per
# block (--row-lines 128; the default is 256), and the R sweep at 4 B and 128 B.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache PYTHONPATH=$PWD
D=docs/results/2026-12-03-h200-s17c
L=$OUT/logs; mkdir -p $L; cp $D/device-script.sh $L/
C=${SOLLAT_COMMIT:-unknown}
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv; echo "commit $C"; date -u +%FT%TZ; python3 -c 'import torch; print("torch", torch.__version__)'; } > $L/env.txt 2>&1
timeout 150 python3 -c "
import time; from sollat.collectives import instantiations as I; t=time.monotonic()
n=I.precompile(jobs=16); print(n, 'modules', round(time.monotonic()-t, 1), 's')" > $L/precompile.txt 2>&1
echo "precompile rc $? at $SECONDS s"; tail -1 $L/precompile.txt
timeout 150 python3 scripts/rmsnorm_bench.py --into $L/rmsnorm --commit "$C" > $L/rmsnorm-bench.txt 2>&1
echo "bench rc $? at $SECONDS s"; tail -2 $L/rmsnorm-bench.txt
timeout 60 python3 scripts/rmsnorm_bench.py --rows 1,2,4,8,16 --dtypes bf16 --fp8 none --row-lines 128 \
  --into $L/rmsnorm-rl128 --commit "$C" > $L/rmsnorm-rl128.txt 2>&1
echo "rl128 rc $? at $SECONDS s"; tail -1 $L/rmsnorm-rl128.txt
timeout 150 python3 scripts/rank_sweep.py --ranks 2,4,8,9,16,32,64,72 --sizes 4,128 --dtype float32 \
  --algos oneshot_ll,oneshot_sentinel,oneshot_ll_wide > $L/rank-sweep.txt 2>&1
echo "sweep rc $? at $SECONDS s"; grep -a "^SWEEP\|^FLOOR" $L/rank-sweep.txt | grep -a " 128 \|FLOOR"
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
