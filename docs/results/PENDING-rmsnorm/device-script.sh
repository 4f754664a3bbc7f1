#!/usr/bin/env bash
# One H200, virtual ranks: the unfused RMSNorm epilogue (one launch for every virtual rank) and the
# all_reduce_rmsnorm sweep (scripts/rmsnorm_bench.py: R = 2, 4, 8; hidden 4096/5120/8192; rows
# 1..512; bf16, bf16 + FP8, fp16, fp32). Steps, each under `timeout`, the whole script within 300 s:
#   1. precompile the virtual-rank kernels the tests and the bench use (rank caps 2, 4, 8, sum; <= 60 s)
#   2. the epilogue's GPU tests, until 115 s into the script (SIGINT: pytest still reports what ran):
#      first the epilogue alone, unfused in one launch under a graph, auto's row across batches and
#      auto's choices; then unfused / in-place / sizes / every-algorithm tests of test_rmsnorm.py and
#      test_batch_invariance.py's sweeps of the 2- and 8-rank virtual tables
#   3. the bench with the time left (--budget-s: no new shape once spent; bf16 shapes run first; the
#      JSON is rewritten after every shape), then the virtual-rank tables with auto's rules derived
#      from it ($OUT/tuning: copy over sollat/collectives/tuning to ship them).
# Outputs in $OUT: gpu.txt, precompile.txt, gpu-tests.txt, rmsnorm-bench.txt, rmsnorm-bench.json, tuning/.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache PYTHONPATH=$PWD
OUT=${OUT:-/tmp/rmsnorm-out}
mkdir -p "$OUT"
cp docs/results/PENDING-rmsnorm/device-script.sh "$OUT/device-script.sh"
COMMIT=${SOLLAT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
left() { echo $((293 - SECONDS)); }
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; echo "commit $COMMIT"; } \
  2>&1 | tee "$OUT/gpu.txt"

echo "== 1 precompile ($SECONDS s)"
timeout 60 python3 - <<'PY' 2>&1 | tail -3 | tee "$OUT/precompile.txt"
import time
from sollat.collectives import instantiations

def virtual(f: str, d: dict) -> bool:
    if f == "add_rmsnorm.cu":
        return d["SOLLAT_TABLE_RANKS"] in ("1", "2", "4", "8")
    return (d.get("SOLLAT_FENCE_SYS") == "0" and d.get("SOLLAT_OP", "OpSum") == "OpSum"
            and d.get("SOLLAT_MAX_RANKS") in ("2", "4", "8"))

t = time.monotonic()
n = instantiations.precompile(jobs=16, only=virtual)
print(f"{n} modules in {time.monotonic() - t:.1f} s")
PY

echo "== 2 GPU tests ($SECONDS s)"
G=tests/gpu/test_rmsnorm.py
FIRST="$G::test_epilogue_alone_is_the_reference_on_one_gpu $G::test_unfused_epilogue_serves_every_rank_in_one_launch_under_a_graph
  tests/gpu/test_batch_invariance.py::test_rmsnorm_auto_row_is_batch_invariant_in_every_mode
  $G::test_auto_uses_a_one_shot_algorithm_or_the_unfused_hand_over"
timeout -s INT -k 5 40 python3 -m pytest -q -ra -p no:cacheprovider --durations=6 $FIRST > "$OUT/gpu-tests.txt" 2>&1
echo "rc=$?" >> "$OUT/gpu-tests.txt"
K="(unfused or in_place or more_sizes or every_algorithm or ws8-R8 or ws2-R2) and not epilogue and not auto"
K="$K and not compile"
T=$((115 - SECONDS))
if [ "$T" -gt 10 ]; then
  timeout -s INT -k 5 "$T" python3 -m pytest -q -ra -p no:cacheprovider --durations=6 -k "$K" \
    $G tests/gpu/test_batch_invariance.py >> "$OUT/gpu-tests.txt" 2>&1
  echo "rc=$?" >> "$OUT/gpu-tests.txt"
fi
grep -a -E "^FAILED|^ERROR|passed|failed|rc=" "$OUT/gpu-tests.txt" | cut -c1-300 | tail -14

echo "== 3 bench ($SECONDS s, $(left) s left)"
BUDGET=$(($(left) - 25))
timeout "$(left)" python3 scripts/rmsnorm_bench.py --into "$OUT" --budget-s "$BUDGET" --commit "$COMMIT" \
  --write-tables "$OUT/tuning" > "$OUT/rmsnorm-bench.txt" 2>&1
echo "rc=$?" >> "$OUT/rmsnorm-bench.txt"
tail -4 "$OUT/rmsnorm-bench.txt"
ls "$OUT/tuning" 2>/dev/null
echo "== done ($SECONDS s)"
