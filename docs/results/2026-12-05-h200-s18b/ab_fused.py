"""A/B of the fused AllReduce + residual + RMSNorm between package trees, on virtual ranks: each
tree in its own process (its path first on PYTHONPATH), trees alternating, every tree twice;
the fused one-shots and the one-shot AllReduce alone at the same bytes, bf16, timed as
scripts/rmsnorm_bench.py times its rows (its Case, graph replay, median, µs).

    python3 ab_fused.py TREE_A TREE_B          # parent: runs the children, prints the rows
    python3 ab_fused.py --child                 # one tree (the sollat on PYTHONPATH)
"""

from __future__ import annotations

import os
import subprocess
import sys

SHAPES = [(r, t, h) for r in (2, 4, 8) for t, h in ((1, 4096), (1, 8192), (2, 8192), (8, 8192), (64, 8192))]


def child() -> None:
    import importlib.util
    from pathlib import Path

    import torch

    import sollat
    from sollat.bench import rmsnorm_sweep as sweep
    from sollat.bench.timing import calls_for, measure_floor, time_calls

    spec = importlib.util.spec_from_file_location("rmsnorm_bench", Path("scripts/rmsnorm_bench.py").resolve())
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    dev = torch.device("cuda", 0)
    print(f"# sollat from {sollat.__file__}; pdl floor {measure_floor(dev, pdl=True).stats.median:.3f}", flush=True)
    for ranks, tokens, hidden in SHAPES:
        shape = sweep.Shape(ranks, "bfloat16", False, tokens, hidden)
        comm = sollat.VirtualCommunicator(ranks, dev)
        case = bench.Case(comm, True, shape, dev, torch.Generator(device=dev).manual_seed(tokens * hidden))
        calls = calls_for(tokens * shape.row_bytes * ranks, 20)
        cells = []
        for algo in ("oneshot_ll", "oneshot_sentinel"):
            t = time_calls(case.fused(algo), calls=calls, replays=15, warmup=1, eager=1, device=dev)
            cells.append(f"{t.stats.median:.2f}")
        t = time_calls(case.all_reduce, calls=calls, replays=15, warmup=1, eager=1, device=dev)
        cells.append(f"{t.stats.median:.2f}")
        print(f"R={ranks} {tokens}x{hidden} " + " ".join(cells), flush=True)
        del case, comm
        torch.cuda.empty_cache()


def main(trees: list[str]) -> None:
    rows: dict[str, list[list[str]]] = {}
    for rep in range(2):
        for tree in trees:
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, os.environ.get("PYTHONPATH", "")]))
            out = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True,
                                 timeout=300)
            print(f"## {tree} rep {rep} rc {out.returncode}\n{out.stdout}{out.stderr[-2000:]}", flush=True)
            for line in out.stdout.splitlines():
                if line.startswith("R="):
                    parts = line.split()
                    rows.setdefault(f"{tree}|{parts[0]} {parts[1]}", []).append(parts[2:])
    print("shape | " + " | ".join(f"{t}: fused_ll fused_sentinel ar" for t in trees))
    for ranks, tokens, hidden in SHAPES:
        key = f"R={ranks} {tokens}x{hidden}"
        cells = []
        for tree in trees:
            got = rows.get(f"{tree}|{key}", [])
            cells.append(" / ".join(" ".join(v) for v in got))
        print(f"{key} | " + " | ".join(cells))


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        child()
    else:
        main(sys.argv[1:])
