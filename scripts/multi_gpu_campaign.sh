#!/usr/bin/env bash
# The multi-GPU campaign (real ranks, NVLink) in one call, on a host with 2 to 8 GPUs.
# Usage:  bash scripts/multi_gpu_campaign.sh [stages]     stages: any of tests,sol,bench,tune,apps (default all)
# Each stage has its own time limit, so one failure does not cost the rest. Everything lands in
# $OUT as at most 8 files (logs + one tarball of result folders). T_TESTS, T_SOL, T_BENCH, T_TUNE,
# T_DECODE, T_CG override the stage limits (seconds).
set -u
case "${1:-}" in -h|--help) sed -n '2,/^set -u$/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
for s in ${1//,/ }; do case "$s" in tests|sol|bench|tune|apps) ;;
  *) echo "multi_gpu_campaign.sh: unknown stage '$s' (want any of tests,sol,bench,tune,apps; see --help)" >&2; exit 2 ;;
esac; done
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR="${SOLLAT_CACHE_DIR:-/tmp/sollat-cache}"
OUT="${OUT:-/tmp/sollat-out}"; R=/tmp/campaign; mkdir -p "$OUT" "$R"
stages="${1:-tests,sol,bench,tune,apps}"
N=$(nvidia-smi -L | wc -l)
run() { echo "== $1 ($(date -u +%T))"; shift; timeout "$@"; echo "== rc=$?"; }
{
  echo "campaign on $N GPUs, commit ${SOLLAT_COMMIT:-unknown}, $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=index,name,driver_version,clocks.sm --format=csv; nvidia-smi topo -m
  python3 -m sollat precompile -j 16
} > "$OUT/env.txt" 2>&1
case ",$stages," in *,tests,*)
  run "real-rank tests" "${T_TESTS:-1900}" python3 -m pytest tests/gpu/test_multiprocess.py -q -p no:cacheprovider > "$OUT/tests.txt" 2>&1 ;;
esac
case ",$stages," in *,sol,*)
  run "sol probe" "${T_SOL:-120}" python3 -m sollat sol > "$OUT/sol.txt" 2>&1 ;;
esac
case ",$stages," in *,bench,*)
  run "bench" "${T_BENCH:-540}" torchrun --nproc-per-node "$N" -m sollat bench --quick --barrier --no-progress --into "$R/bench-$N" > "$OUT/bench.txt" 2>&1 ;;
esac
case ",$stages," in *,tune,*)
  run "tune" "${T_TUNE:-300}" torchrun --nproc-per-node "$N" -m sollat tune --out "$R/tuning" > "$OUT/tune.txt" 2>&1 ;;
esac
case ",$stages," in *,apps,*)
  {
    run "decode" "${T_DECODE:-420}" torchrun --nproc-per-node "$N" -m sollat.apps.decode --layers 80 --context 32768 --steps 64 \
        --backends nccl,sollat --price 3.5 --json "$R/decode-tp$N.json"
    run "cg" "${T_CG:-180}" torchrun --nproc-per-node "$N" -m sollat.apps.cg --grid 256 --backends nccl,sollat --json "$R/cg-$N.json"
  } > "$OUT/apps.txt" 2>&1 ;;
esac
tar czf "$OUT/results.tgz" -C "$R" . 2>/dev/null
grep -h "== \|passed\|failed\|RANK\|SoL =" "$OUT"/*.txt | tail -60
