"""A/B of source trees' kernels in one device run, interleaved: virtual ranks, graph replay.

    python3 scripts/ab_trees.py --base DIR [--ranks 2,4,8] [--algos oneshot_ll,oneshot_sentinel]
        [--sizes 4,128,8192,65536] [--dtypes float32,bfloat16] [--reps 2] [--json FILE]
    python3 scripts/ab_trees.py --tree old=DIR1 --tree older=DIR2 --tree new=. \\
        --tree unshared=.:SOLLAT_SOME_DEFINE=1 --ref old --precompile 8 ...

Each tree is NAME=DIR[:DEFINE=VALUE,...]: DIR holds a checkout's ``sollat`` package (for example
``git archive 4c1dd9c sollat | tar -x -C DIR``; ``.`` is this checkout), and the defines are
passed to every kernel of that tree (scripts/ab_latency.py --define: a diagnostic variant of one
tree). ``--base DIR`` is ``--tree base=DIR --tree new=.``. For each repetition and world size,
scripts/ab_latency.py runs once per tree (every dtype), each in a process of its own (the same script, the same
public API, the same kernel cache directory: cache keys differ by source and defines), in the
given order on even repetitions and reversed on odd ones. A case's figure per tree is the fastest
of its repetitions' medians (graph replay of 100 calls, median of 25 replays, the slowest rank's);
the table gives every tree's figure and each one divided by the tree named ``new`` (``--ref``).
``--precompile N`` first compiles, in each tree's own Python and N processes at a time, the
virtual-rank instantiations the runs will load (the asked algorithms' kernel files, dtypes and rank
caps, the sum), into the kernel cache the runs share ($SOLLAT_CACHE_DIR), so no timed process
compiles; trees with defines compile theirs when they first run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^AB (\S+) (\S+) (\S+) (\d+) B: ([0-9.]+) us/call")


@dataclass(frozen=True)
class Tree:
    name: str
    path: Path
    defines: tuple[str, ...]


def parse_tree(text: str) -> Tree:
    name, sep, rest = text.partition("=")
    if not sep or not name or not rest:
        raise argparse.ArgumentTypeError(f"--tree wants NAME=DIR[:DEFINE=VALUE,...], got {text!r}")
    path, _, defines = rest.partition(":")
    tree = Tree(name, (ROOT / path).resolve() if path == "." else Path(path).resolve(),
                tuple(d for d in defines.split(",") if d))
    if not (tree.path / "sollat" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(f"--tree {name}: {tree.path} holds no sollat package")
    return tree


# Runs in a tree's own Python (its sollat on PYTHONPATH): argv = algos, dtypes, ranks, jobs. The
# OpSum virtual-rank builds (ab_latency.py sums) of the algorithms' kernel files at the rank caps
# up to 8 (or the most ranks asked), for the device's arch.
_PRECOMPILE_MAIN = """
import multiprocessing, sys, time
from concurrent.futures import ProcessPoolExecutor
try:
    from sollat.collectives import algorithms as A, instantiations as I
    from sollat.device import build as B
except ImportError:  # trees older than the move into sollat/collectives and sollat/device
    from sollat import algorithms as A, build as B, instantiations as I
algos, dtypes, ranks, jobs = sys.argv[1].split(","), sys.argv[2].split(","), sys.argv[3].split(","), int(sys.argv[4])
files = {A.ALGORITHMS[n].kernel_file for n in algos}
cxx = {"float32": "float", "bfloat16": "sollat::bf16", "float16": "sollat::f16", "float64": "double"}
types = {cxx[d] for d in dtypes}
most = max(8, *(int(r) for r in ranks))
arch = B.device_arch()
work = [(f, d, arch) for f, d in I.all_instantiations()
        if f in files and d.get("SOLLAT_FENCE_SYS") != "1" and d.get("SOLLAT_T") in types
        and int(d.get("SOLLAT_MAX_RANKS", "0")) <= most and d.get("SOLLAT_OP", "OpSum") == "OpSum"]
t = time.monotonic()
if __name__ == "__main__":
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(I._compile_one, work))
    print(len(work), "modules for", arch, "in", round(time.monotonic() - t, 1), "s")
"""


def precompile_tree(tree: Tree, a: argparse.Namespace) -> None:
    env = dict(os.environ, PYTHONPATH=str(tree.path), NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
               NVSHMEM_DISABLE_NVLS="1", PYTHONUNBUFFERED="1")
    out = subprocess.run([sys.executable, "-c", _PRECOMPILE_MAIN, a.algos, a.dtypes, a.ranks, str(a.precompile)],
                         env=env, capture_output=True, text=True, timeout=a.timeout)
    print(f"precompile {tree.name}: exit {out.returncode} {out.stdout.strip()[-300:]} {out.stderr.strip()[-2000:]}",
          flush=True)


def run_tree(tree: Tree, ranks: int, a: argparse.Namespace) -> list[tuple[str, str, int, float]]:
    env = dict(os.environ, PYTHONPATH=str(tree.path), NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
               NVSHMEM_DISABLE_NVLS="1", PYTHONUNBUFFERED="1")
    rows = []
    cmd = [sys.executable, str(ROOT / "scripts" / "ab_latency.py"), "--virtual", str(ranks), "--algos", a.algos,
           "--sizes", a.sizes, "--dtype", a.dtypes, "--tag", f"{tree.name}:R{ranks}"]
    for d in tree.defines:
        cmd += ["--define", d]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout)
    if out.returncode != 0:
        print(f"{tree.name} R={ranks}: exit {out.returncode}\n{out.stderr[-2000:]}", flush=True)
    for line in out.stdout.splitlines():  # a run cut short keeps the cases it measured
        m = LINE.match(line)
        if m:
            if "WRONG" in line:
                print(f"WRONG RESULT ({tree.name}): {line}", flush=True)
            rows.append((m.group(2), m.group(3), int(m.group(4)), float(m.group(5))))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", type=Path, default=None, help="shorthand for --tree base=DIR --tree new=.")
    p.add_argument("--tree", type=parse_tree, action="append", default=[], help="NAME=DIR[:DEFINE=VALUE,...]")
    p.add_argument("--ref", default="new", help="the tree every other one is divided by")
    p.add_argument("--ranks", default="2,4,8")
    p.add_argument("--algos", default="oneshot_ll,oneshot_sentinel,twoshot_ll,twoshot_sentinel")
    p.add_argument("--sizes", default="4,128,8192,65536")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--precompile", type=int, default=0, metavar="N",
                   help="compile each tree's kernels first, N processes at a time (0: no)")
    a = p.parse_args()
    trees: list[Tree] = list(a.tree)
    if a.base is not None:
        trees = [parse_tree(f"base={a.base}"), parse_tree("new=.")] + trees
    names = [t.name for t in trees]
    if len(set(names)) != len(names) or a.ref not in names:
        raise SystemExit(f"ab_trees: trees {names} must have distinct names and include --ref {a.ref!r}")
    if a.precompile > 0:
        for tree in trees:
            if not tree.defines:
                precompile_tree(tree, a)
    best: dict[tuple[str, str, str, int, int], float] = {}
    for rep in range(a.reps):
        for ranks in (int(r) for r in a.ranks.split(",")):
            for tree in trees if rep % 2 == 0 else trees[::-1]:
                for algo, dtype, nbytes, us in run_tree(tree, ranks, a):
                    key = (tree.name, algo, dtype, nbytes, ranks)
                    best[key] = min(us, best.get(key, us))
                    print(f"RUN rep {rep} {tree.name} {algo} {dtype} R={ranks} {nbytes} B: {us:.3f} us", flush=True)
                if a.json:  # after every run: a cut-off call keeps what it measured
                    a.json.write_text(json.dumps({"trees": {t.name: {"path": str(t.path), "defines": list(t.defines)}
                                                            for t in trees},
                                                  "ref": a.ref, "rows": table(best, names, a.ref)}, indent=1))
    others = [n for n in names if n != a.ref]
    print(f"{'algorithm':18s} {'dtype':9s} {'R':>2s} {'bytes':>6s} " + " ".join(f"{n[:10]:>10s}" for n in names) + " "
          + " ".join(f"{(a.ref + '/' + n)[:16]:>16s}" for n in others))
    for r in table(best, names, a.ref):
        us, ratio = r["us"], r["ratio"]
        assert isinstance(us, dict) and isinstance(ratio, dict)
        print(f"{r['algorithm']:18s} {r['dtype']:9s} {r['ranks']:2d} {r['bytes']:6d} "
              + " ".join(f"{us[n]:10.3f}" if n in us else f"{'-':>10s}" for n in names) + " "
              + " ".join(f"{ratio[n]:16.3f}" if n in ratio else f"{'-':>16s}" for n in others))


def table(best: dict[tuple[str, str, str, int, int], float], names: list[str], ref: str) -> list[dict[str, object]]:
    """Every case the reference tree measured: each tree's fastest repetition, and ref / tree."""
    rows: list[dict[str, object]] = []
    cases = sorted({k[1:] for k in best if k[0] == ref}, key=lambda c: (c[0], c[1], c[3], c[2]))
    for algo, dtype, nbytes, ranks in cases:
        us = {n: best[(n, algo, dtype, nbytes, ranks)] for n in names if (n, algo, dtype, nbytes, ranks) in best}
        ratio = {n: us[ref] / v for n, v in us.items() if n != ref}
        rows.append({"algorithm": algo, "dtype": dtype, "ranks": ranks, "bytes": nbytes, "us": us, "ratio": ratio})
    return rows


if __name__ == "__main__":
    main()
