#!/usr/bin/env bash
# One GPU (it ran on an H100), virtual ranks, HEAD b780257 (the fused kernels' row exchange on mbarriers, unrun on a GPU
# until now): every kernel precompiled; the RMSNorm GPU tests at HEAD; the fused A/B of HEAD against
# 027d5c6 (cluster barriers) with s18b's ab_fused.py; s18a's diagnostic builds K1-K5 of 027d5c6's
# fused kernel (fused_diag.py, .ab/diag = 027d5c6 + fused-diag.patch); the engines' communicator
# options against a plain communicator at <= 1 MiB (scripts/engine_default_bench.py).
# Carried: .ab (base = 027d5c6's sollat, diag = the same patched). Logs under $OUT.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache
D=docs/results/2026-12-06-gpu-s19a
L=$OUT/logs; mkdir -p $L; cp $D/device-script.sh $L/
left() { echo $(( ${BUDGET:-570} - SECONDS )); }
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv; echo "commit ${SOLLAT_COMMIT:-unknown}"; date -u +%FT%TZ; python3 -c 'import torch; print("torch", torch.__version__)'; } > $L/env.txt 2>&1
PYTHONPATH=. timeout 120 python3 -c "
import time; from sollat.collectives import instantiations as I; t=time.monotonic()
n=I.precompile(jobs=16); print(n, 'modules', round(time.monotonic()-t, 1), 's')" > $L/precompile.txt 2>&1
echo "precompile rc $? at $SECONDS s"; tail -1 $L/precompile.txt
PYTHONPATH=. timeout -s INT -k 5 150 python3 -m pytest -q -x -p no:cacheprovider --durations=5 tests/gpu/test_rmsnorm.py \
  tests/gpu/test_batch_invariance.py > $L/pytest-rmsnorm.txt 2>&1
echo "pytest rc $? at $SECONDS s"; tail -3 $L/pytest-rmsnorm.txt | cut -c1-300
PYTHONPATH= timeout $(( $(left) - 230 )) python3 docs/results/2026-12-05-h200-s18b/ab_fused.py $PWD/.ab/base $PWD > $L/ab-fused.txt 2>&1
echo "ab rc $? at $SECONDS s"; tail -16 $L/ab-fused.txt
PYTHONPATH=$PWD/.ab/diag timeout $(( $(left) - 60 )) python3 docs/results/2026-12-05-h200-s18a/fused_diag.py > $L/fused-diag.txt 2>&1
echo "diag rc $? at $SECONDS s"; cat $L/fused-diag.txt | cut -c1-400
PYTHONPATH=. timeout $(left) python3 scripts/engine_default_bench.py > $L/engine-default.txt 2>&1
echo "engine rc $? at $SECONDS s"; grep -a "WORST\|SETUP" $L/engine-default.txt
tar czf $OUT/logs.tgz -C $OUT logs && cp $L/*.txt $OUT/ 2>/dev/null; rm -rf $L; ls $OUT
