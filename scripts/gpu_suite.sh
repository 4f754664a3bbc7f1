#!/usr/bin/env bash
# One device call: precompile, the GPU test suite, then the benchmarks. Logs land in $OUT.
# Usage on the device machine:  bash scripts/gpu_suite.sh [tests|bench|extras|all]
#   extras: the eager host time per call (scripts/eager_overhead.py).
#   SOLLAT_GPU_TESTS=path  restricts the tests; BENCH_ARGS adds options to `sollat bench`.
set -u
case "${1:-}" in -h|--help) sed -n '2,/^set -u$/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
case "${1:-all}" in tests|bench|extras|all) ;;
  *) echo "gpu_suite.sh: unknown part '$1' (want tests, bench, extras or all; see --help)" >&2; exit 2 ;; esac
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR="${SOLLAT_CACHE_DIR:-/tmp/sollat-cache}"
OUT="${OUT:-/tmp/sollat-out}"; mkdir -p "$OUT"
what="${1:-all}"
{
  echo "== $(date -u +%FT%TZ) commit ${SOLLAT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
  python3 -c "import torch, cuda.core; print('torch', torch.__version__, 'cuda.core', cuda.core.__version__)"
} 2>&1 | tee "$OUT/env.txt"
python3 -m sollat precompile -j 16 2>&1 | tee -a "$OUT/env.txt"
rc=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  set -o pipefail
  python3 -m pytest ${SOLLAT_GPU_TESTS:-tests/gpu} -q -ra $(python3 -c 'import pytest_timeout' 2>/dev/null && echo --timeout=900) -p no:cacheprovider 2>&1 | tee "$OUT/gpu-tests.txt"
  rc=$?
  set +o pipefail
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  python3 -m sollat bench --quick --barrier --no-progress --into /tmp/sollat-bench ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.txt"
  for r in 2 4 8; do
    python3 -m sollat tune --ranks $r --sizes 128,1024,8192,65536,262144,1048576,4194304 --out /tmp/sollat-bench/tuning 2>&1 | tee -a "$OUT/tune.txt"
  done
  tar czf "$OUT/bench.tgz" -C /tmp/sollat-bench .
fi
if [ "$what" = extras ] || [ "$what" = all ]; then
  for s in eager_overhead; do
    echo "== scripts/$s.py"; python3 "scripts/$s.py"
  done 2>&1 | tee "$OUT/extras.txt"
fi
exit $rc
