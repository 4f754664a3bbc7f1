#!/usr/bin/env bash
# The real-rank suite (tests/gpu/mp_suite.py) on the device: one process per visible GPU under
# torchrun, no pytest. Precompiles once, then RUNS (default 2) runs in a row; each run is the main
# suite plus the compile-skew section in its own launch with an empty kernel cache, logged (tee)
# into $OUT/real-ranks-run<i>.txt. Ends with one summary line per run; exit 1 if any run failed.
# Usage:  bash scripts/real_rank_suite.sh [--only a,b]     (arguments go to the main launch)
#   RUNS=1  one run       SKEW=0  no compile-skew launch      RUN_TIMEOUT / SKEW_TIMEOUT  seconds
#   SOLLAT_MP_TEAR_LINES=1e8  shorter tear stress              SOLLAT_MP_SKIP=tear,graphs  drop sections
set -u
case "${1:-}" in -h|--help) sed -n '2,/^set -u$/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR="${SOLLAT_CACHE_DIR:-/tmp/sollat-cache}"
OUT="${OUT:-/tmp/sollat-out}"; mkdir -p "$OUT"
RUNS="${RUNS:-2}"; SKEW="${SKEW:-1}"
RUN_TIMEOUT="${RUN_TIMEOUT:-900}"; SKEW_TIMEOUT="${SKEW_TIMEOUT:-300}"
NGPU="$(python3 -c 'import torch; print(torch.cuda.device_count())')"
{
  echo "== $(date -u +%FT%TZ) commit ${SOLLAT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}; $NGPU GPU(s)"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv
  nvidia-smi topo -m
  python3 -m sollat precompile -j 16
} 2>&1 | tee "$OUT/real-ranks-env.txt"
if [ "$NGPU" -lt 2 ]; then echo "real-rank suite: needs >= 2 GPUs, found $NGPU"; exit 1; fi

# ranks that printed "SUMMARY passed=N failed=0" with N = the sections of their PLAN
ranks_ok() {
  python3 - "$1" "$NGPU" <<'EOF'
import re, sys
text, n = open(sys.argv[1], errors="replace").read(), int(sys.argv[2])
ok = 0
for r in range(n):
    plan = re.findall(rf"RANK {r} PLAN (\S+)", text)
    passed = sum(len(re.findall(rf"RANK {r} SUMMARY passed={len(p.split(','))} failed=0\b", text)) > 0 for p in set(plan))
    ok += bool(plan) and passed == len(set(plan))
print(ok)
EOF
}

summary=()
status=0
for i in $(seq 1 "$RUNS"); do
  log="$OUT/real-ranks-run$i.txt"
  : > "$log"
  echo "== run $i: main suite on $NGPU GPUs $*" | tee -a "$log"
  t0=$(date +%s)
  timeout -k 30 "$RUN_TIMEOUT" python3 -m torch.distributed.run --standalone --nproc-per-node="$NGPU" \
    tests/gpu/mp_suite.py "$@" 2>&1 | tee -a "$log"
  rc_main=${PIPESTATUS[0]}
  ok_main=$(ranks_ok "$log")
  rc_skew=skipped
  ok_skew=$NGPU
  if [ "$SKEW" = 1 ]; then
    cache="$(mktemp -d /tmp/sollat-skew-cache.XXXXXX)"
    skew_log="$(mktemp /tmp/sollat-skew-log.XXXXXX)"
    echo "== run $i: compile skew (--only skew, empty SOLLAT_CACHE_DIR=$cache)" | tee -a "$log"
    SOLLAT_CACHE_DIR="$cache" SOLLAT_MP_SECTIONS= SOLLAT_MP_SKIP= timeout -k 30 "$SKEW_TIMEOUT" \
      python3 -m torch.distributed.run --standalone --nproc-per-node="$NGPU" tests/gpu/mp_suite.py --only skew \
      2>&1 | tee "$skew_log" | tee -a "$log"
    rc_skew=${PIPESTATUS[0]}
    ok_skew=$(ranks_ok "$skew_log")
    rm -rf "$cache" "$skew_log"
  fi
  secs=$(( $(date +%s) - t0 ))
  fails=$(grep -c " FAIL " "$log")
  if [ "$rc_main" = 0 ] && [ "$ok_main" = "$NGPU" ] && { [ "$rc_skew" = 0 ] || [ "$rc_skew" = skipped ]; } \
     && [ "$ok_skew" = "$NGPU" ]; then verdict=PASS; else verdict=FAIL; status=1; fi
  line="REAL-RANKS RUN $i: $verdict (main: exit $rc_main, $ok_main/$NGPU ranks all passed; skew: exit $rc_skew, $ok_skew/$NGPU ranks; $fails FAIL lines; ${secs} s) log $log"
  echo "$line" | tee -a "$log"
  summary+=("$line")
done
echo "== summary" | tee "$OUT/real-ranks-summary.txt"
printf '%s\n' "${summary[@]}" | tee -a "$OUT/real-ranks-summary.txt"
exit $status
