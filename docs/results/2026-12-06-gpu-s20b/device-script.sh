#!/usr/bin/env bash
# One GPU, one call (device starts were scarce): s20a's wide one-shot diagnostic while every
# kernel precompiles, then the GPU half of README's test command (python3 -m pytest -q tests/gpu)
# with the process launches FIRST (the real-rank suite as 3 processes sharing GPU 0, the engine
# adapter core), then the fused kernel's files, then the rest, until the call's budget ends.
# Output: $OUT/wide-diag.txt, $OUT/gpu-tests.txt, $OUT/precompile.txt, $OUT/env.txt.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache
D=docs/results/2026-12-06-gpu-s20a
cp docs/results/2026-12-06-gpu-s20b/device-script.sh $OUT/
left() { echo $(( ${BUDGET:-585} - SECONDS )); }
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv; echo "commit ${SOLLAT_COMMIT:-unknown}"; date -u +%FT%TZ; python3 -c 'import torch; print("torch", torch.__version__)'; } > $OUT/env.txt 2>&1
PYTHONPATH=$PWD timeout 150 python3 -c "
import time; from sollat.collectives import instantiations as I; t=time.monotonic()
n=I.precompile(jobs=12); print(n, 'modules', round(time.monotonic()-t, 1), 's')" > $OUT/precompile.txt 2>&1 &
rm -rf /tmp/diagtree && mkdir -p /tmp/diagtree && cp -r sollat /tmp/diagtree/ && (cd /tmp/diagtree && patch -p1 < $OLDPWD/$D/wide-diag.patch) > /dev/null
PYTHONPATH=/tmp/diagtree timeout ${DIAG_S:-150} python3 $D/wide_diag.py > $OUT/wide-diag.txt 2>&1; echo "diag rc $? at $SECONDS s"
wait; echo "precompiled at $SECONDS s: $(tail -1 $OUT/precompile.txt)"
grep -A200 BEST $OUT/wide-diag.txt; grep FAIL $OUT/wide-diag.txt | head -5
export PYTHONPATH=$PWD
REST=$(ls tests/gpu/test_*.py | grep -v -e test_multiprocess -e test_engine_processes -e test_rmsnorm -e test_batch_invariance)
timeout -s INT -k 10 $(left) python3 -m pytest -q -ra -p no:cacheprovider --durations=15 tests/gpu/test_multiprocess.py \
  tests/gpu/test_engine_processes.py tests/gpu/test_rmsnorm.py tests/gpu/test_batch_invariance.py $REST > $OUT/gpu-tests.txt 2>&1
echo "pytest rc $? at $SECONDS s"; tail -25 $OUT/gpu-tests.txt
