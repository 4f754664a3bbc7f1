"""A/B of two source trees' kernels in one device run, interleaved: virtual ranks, graph replay.

    python3 scripts/ab_trees.py --base DIR [--ranks 2,4,8] [--algos oneshot_ll,oneshot_sentinel]
        [--sizes 4,128,8192,65536] [--dtypes float32,bfloat16] [--reps 2] [--json FILE]

DIR holds another checkout's ``sollat`` package (for example ``git archive 4c1dd9c sollat | tar -x
-C DIR``). For each repetition and world size, scripts/ab_latency.py runs once with DIR first on
PYTHONPATH ("base") and once with this checkout ("new"), alternately, each in a process of its own
(the same script, the same public API, the same kernel cache directory: cache keys differ by
source). A case's figure per tree is the fastest of its repetitions' medians (graph replay of
100 calls, median of 25 replays, the slowest rank's); the table gives both and new / base.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^AB (\S+) (\S+) (\S+) (\d+) B: ([0-9.]+) us/call")


def run_tree(tree: Path, tag: str, ranks: int, a: argparse.Namespace) -> list[tuple[str, str, str, int, float]]:
    env = dict(os.environ, PYTHONPATH=str(tree), NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
               NVSHMEM_DISABLE_NVLS="1", PYTHONUNBUFFERED="1")
    rows = []
    for dtype in a.dtypes.split(","):
        cmd = [sys.executable, str(ROOT / "scripts" / "ab_latency.py"), "--virtual", str(ranks), "--algos", a.algos,
               "--sizes", a.sizes, "--dtype", dtype, "--tag", f"{tag}:R{ranks}"]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout)
        if out.returncode != 0:
            print(f"{tag} R={ranks} {dtype}: exit {out.returncode}\n{out.stderr[-2000:]}", flush=True)
            continue
        for line in out.stdout.splitlines():
            m = LINE.match(line)
            if m:
                if "WRONG" in line:
                    print(f"WRONG RESULT: {line}", flush=True)
                rows.append((tag, m.group(2), m.group(3), int(m.group(4)), float(m.group(5))))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", type=Path, required=True, help="a directory holding the other tree's sollat package")
    p.add_argument("--ranks", default="2,4,8")
    p.add_argument("--algos", default="oneshot_ll,oneshot_sentinel,twoshot_ll,twoshot_sentinel")
    p.add_argument("--sizes", default="4,128,8192,65536")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args()
    if not (a.base / "sollat" / "__init__.py").is_file():
        raise SystemExit(f"ab_trees: {a.base} holds no sollat package")
    best: dict[tuple[str, str, str, int, int], float] = {}
    for rep in range(a.reps):
        for ranks in (int(r) for r in a.ranks.split(",")):
            for tag, tree in (("base", a.base), ("new", ROOT)) if rep % 2 == 0 else (("new", ROOT), ("base", a.base)):
                for t, algo, dtype, nbytes, us in run_tree(tree, tag, ranks, a):
                    key = (t, algo, dtype, nbytes, ranks)
                    best[key] = min(us, best.get(key, us))
                    print(f"RUN rep {rep} {t} {algo} {dtype} R={ranks} {nbytes} B: {us:.3f} us", flush=True)
                if a.json:  # after every run: a cut-off call keeps what it measured
                    a.json.write_text(json.dumps({"base": str(a.base), "rows": table(best)}, indent=1))
    print(f"{'algorithm':18s} {'dtype':9s} {'R':>2s} {'bytes':>6s} {'base us':>8s} {'new us':>8s} {'new/base':>8s}")
    for r in table(best):
        print(f"{r['algorithm']:18s} {r['dtype']:9s} {r['ranks']:2d} {r['bytes']:6d} {r['base_us']:8.3f} "
              f"{r['new_us']:8.3f} {r['ratio']:8.3f}")


def table(best: dict[tuple[str, str, str, int, int], float]) -> list[dict[str, object]]:
    """Every case both trees measured: the fastest of each tree's repetitions and new / base."""
    rows: list[dict[str, object]] = []
    for (t, algo, dtype, nbytes, ranks), us in sorted(best.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][4], kv[0][3])):
        base = best.get(("base", algo, dtype, nbytes, ranks))
        if t == "new" and base is not None:
            rows.append({"algorithm": algo, "dtype": dtype, "ranks": ranks, "bytes": nbytes, "base_us": base,
                         "new_us": us, "ratio": us / base})
    return rows


if __name__ == "__main__":
    main()
