#!/usr/bin/env bash
# One H200, second call (tree 7e35f87 + diag.patch, which only adds SOLLAT_DIAG_EPI switches to
# kernels/add_rmsnorm.cu): where the one-GPU add + RMSNorm epilogue spends its time
# (epilogue_diag.py); the virtual-rank mismatch check on 4c1dd9c's package and on this tree
# (mismatch_on_tree.py); the real-rank suite as 4 processes sharing the GPU (a slow test).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache PYTHONPATH=$PWD
D=docs/results/2026-12-03-h200-s16b
cp $D/device-script.sh $D/diag.patch $D/*.py $OUT/ 2>/dev/null
t0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - t0) )); }
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv; echo "commit ${SOLLAT_COMMIT:-unknown}"; } > $OUT/env.txt 2>&1
timeout 150 python3 $D/epilogue_diag.py > $OUT/epilogue-diag.txt 2>&1
echo "diag rc $? at $(( $(date +%s) - t0 )) s"; tail -8 $OUT/epilogue-diag.txt
(cd .ab/base && timeout 90 python3 ../../$D/mismatch_on_tree.py 4c1dd9c) > $OUT/mismatch-4c1dd9c.txt 2>&1
echo "4c1dd9c rc $? at $(( $(date +%s) - t0 )) s"; tail -3 $OUT/mismatch-4c1dd9c.txt
timeout 60 python3 $D/mismatch_on_tree.py new > $OUT/mismatch-new.txt 2>&1
echo "new rc $? at $(( $(date +%s) - t0 )) s"; tail -2 $OUT/mismatch-new.txt
timeout 70 python3 -c "
import time; from sollat.collectives import instantiations as I; t=time.monotonic()
n=I.precompile(jobs=16); print(n, 'modules', round(time.monotonic()-t, 1), 's')" > $OUT/precompile.txt 2>&1
echo "precompiled at $(( $(date +%s) - t0 )) s"; tail -1 $OUT/precompile.txt
timeout $(left 500) python3 -m pytest -q -ra -p no:cacheprovider -m '' tests/gpu/test_multiprocess.py \
  -k "test_real_rank_suite and 4" --durations=3 > $OUT/suite-4proc.txt 2>&1
echo "suite rc $? at $(( $(date +%s) - t0 )) s"; tail -8 $OUT/suite-4proc.txt
