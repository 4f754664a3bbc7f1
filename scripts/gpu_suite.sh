#!/usr/bin/env bash
# One device call: precompile, the GPU test suite, then the benchmarks. Logs land in $OUT.
# Usage on the device machine:  bash scripts/gpu_suite.sh [tests|bench|all] [pytest -k expr]
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR="${SOLLAT_CACHE_DIR:-/tmp/sollat-cache}"
OUT="${OUT:-/tmp/sollat-out}"; mkdir -p "$OUT"
what="${1:-all}"; kexpr="${2:-}"
{
  echo "== $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo none)"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
  python3 -c "import torch, cuda.core; print('torch', torch.__version__, 'cuda.core', cuda.core.__version__)"
} 2>&1 | tee "$OUT/env.txt"
python3 -m sollat precompile -j 16 2>&1 | tee "$OUT/precompile.txt"
rc=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  set -o pipefail
  python3 -m pytest ${SOLLAT_GPU_TESTS:-tests/gpu} -x -q -ra ${kexpr:+-k "$kexpr"} --timeout=900 -p no:cacheprovider 2>&1 | tee "$OUT/gpu-tests.txt"
  rc=$?
  set +o pipefail
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  python3 scripts/quick_latency.py 2>&1 | tee "$OUT/quick-latency.txt"
fi
exit $rc
