#!/usr/bin/env bash
# One GPU: the chunks' fault words (no block barrier per row in a cluster) and the residual loads
# before the send (this tree) against 105e05f's exchange (.ab/base, carried), trees alternating
# (s18b's ab_fused.py); the RMSNorm GPU tests and the batch-invariance test at this tree; the
# all_reduce_rmsnorm sweep at this tree. Logs under $OUT (the sweep's folder tarred).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache
D=docs/results/2026-12-05-h200-s18c
C=${SOLLAT_COMMIT:-unknown}
cp $D/device-script.sh $OUT/
{ nvidia-smi --query-gpu=name,driver_version --format=csv; echo "commit $C"; git status --short; date -u +%FT%TZ; } > $OUT/env.txt 2>&1
PYTHONPATH=. timeout 120 python3 -c "
import time; from sollat.collectives import instantiations as I; t=time.monotonic()
n=I.precompile(jobs=16); print(n, 'modules', round(time.monotonic()-t, 1), 's')"; echo "precompile rc $? at $SECONDS s"
PYTHONPATH= timeout 150 python3 docs/results/2026-12-05-h200-s18b/ab_fused.py $PWD/.ab/base $PWD > $OUT/ab-fused.txt 2>&1; echo "ab rc $? at $SECONDS s"
tail -16 $OUT/ab-fused.txt
PYTHONPATH=. timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_rmsnorm.py tests/gpu/test_batch_invariance.py > $OUT/pytest-rmsnorm.txt 2>&1; echo "pytest rc $? at $SECONDS s"
tail -3 $OUT/pytest-rmsnorm.txt
PYTHONPATH=. timeout 170 python3 scripts/rmsnorm_bench.py --into $OUT/rmsnorm --commit "$C" > $OUT/rmsnorm-bench.txt 2>&1; echo "bench rc $? at $SECONDS s"
tail -4 $OUT/rmsnorm-bench.txt
tar czf $OUT/rmsnorm.tgz -C $OUT rmsnorm && rm -rf $OUT/rmsnorm
