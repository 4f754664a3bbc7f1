#!/usr/bin/env bash
# session 5 call C (x2): zero copy in place + AG/RS thresholds on real ranks, AG/RS bench with torch
# symm peers, NCCL window kernel names, the distributed bench (issue 13's bench.json), all tarred
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_COMMIT=$(cat .ab/commit) PYTHONPATH=$PWD SOLLAT_CACHE_DIR=/tmp/sollat-cache
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
R=/tmp/r; mkdir -p $R
el "1 real-rank suite (all sections, no skew launch)"
OUT=$R RUNS=1 SKEW=0 RUN_TIMEOUT=230 timeout 300 bash scripts/real_rank_suite.sh > /dev/null 2>&1
tail -1 $R/real-ranks-summary.txt
grep -h "fail\|FAIL\|symmetric:\|SUMMARY" $R/real-ranks-run1.txt | head -16
el "4 distributed bench"
left=110
timeout $left python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m sollat bench --sizes 4:64M:4 --replays 15 --barrier --no-progress \
  --commit "$SOLLAT_COMMIT" --into $R/bench > $R/bench-console.txt 2>&1
echo "bench rc=$? limit $left s"
python3 - <<'PY'
import json
d = json.load(open("/tmp/r/bench/bench.json"))
rows = d["rows"]
for dt in ("float32", "bfloat16"):
    for n in sorted({r["nbytes"] for r in rows if r["nbytes"]}):
        rs = [r for r in rows if r["dtype"] == dt and r["nbytes"] == n and r["status"] == "ok" and r.get("median_us")]
        peers = [r for r in rs if r["impl"] != "sollat" and not str(r.get("check", "")).startswith("mismatch")]
        best = min(peers, key=lambda r: r["median_us"]) if peers else None
        a = {r["algo"]: r for r in rs if r["impl"] == "sollat" and r["algo"] in ("auto", "auto_symm")}
        bad = [r["algo"] for r in rs if str(r.get("check", "")).startswith("mismatch")]
        if best:
            print(dt, n, " ".join(f"{k} {v['median_us']:.2f} ({v.get('selected','')}) {v['median_us']/best['median_us']:.2f}" for k, v in a.items()),
                  f"best peer {best['impl']} {best['algo']} {best['median_us']:.2f}", "MISMATCH " + ",".join(bad) if bad else "")
PY
el "1b virtual fp8 tests"
CUDA_VISIBLE_DEVICES=0 timeout 130 python3 -m pytest -q tests/gpu/test_rmsnorm.py -k fp8 > $R/gpu-fp8.txt 2>&1; echo "rc=$?"; grep -E "^FAILED|^ERROR|passed|failed" $R/gpu-fp8.txt | head -10
el "2 AG/RS bench real"
timeout 70 python3 -m torch.distributed.run --standalone --nproc-per-node 2 scripts/gather_scatter_bench.py --commit $SOLLAT_COMMIT --into $R/gs-real > $R/gs-real.txt 2>&1; echo "rc=$?"; grep -E "^ *(all_gather|reduce_scatter|floor)|n/a" $R/gs-real.txt | cut -c1-200 | head -30
el "3 NCCL window kernels"
NCCL_DEBUG=INFO timeout 45 python3 -m torch.distributed.run --standalone --nproc-per-node 2 scripts/nccl_window_check.py --into $R/nccl-window > $R/nccl-window.txt 2>&1; echo "rc=$?"
grep -E " B (window|plain)" $R/nccl-window.txt | cut -c1-240; grep -ci "symmetric\|symk" $R/nccl-window.txt; grep -i "symmetric\|symk" $R/nccl-window.txt | sort | uniq -c | sort -rn | head -8 | cut -c1-220
cp .ab/s5c.sh $R/device-script.sh
tar czf $OUT/s5c.tgz -C $R .
el done
