"""Every figure of one card in one run: its tuning tables, the fused op's sweep, the R sweep and the
goal checks, written under one folder (one GPU, virtual ranks, about eight minutes).

    python3 scripts/card_report.py --out DIR [--budget-s 470] [--ab-base DIR_OR_COMMIT]
    python3 scripts/card_report.py --check DIR          # only the goal checks of a finished run (no GPU)
    python3 scripts/card_report.py --install-tables DIR/tuning   # put a run's tables into the package

Steps, each a child process of the existing tools with its own time limit (what does not fit in
``--budget-s`` is skipped and named in the summary):

1. ``env.txt``: card, driver, commit, date, torch.
2. ``python -m sollat precompile`` (the kernel cache; the later steps compile less).
3. ``python -m sollat tune --ranks R`` for R = 2, 4, 8 (128 B .. 4 MiB) and 16, 32, 64, 72
   (128 B .. 256 KiB): the AllReduce tables in ``tuning/``, the measured times in ``tune/``.
4. ``scripts/rmsnorm_bench.py`` over the full default sweep, deriving each table's fused-op rule
   into the same files (``--write-tables``): ``rmsnorm-full/rmsnorm-bench.json``.
5. The tables are copied into this run's SOLLAT_CACHE_DIR, so ``auto`` follows them from here on;
   then the headline sweep (``rmsnorm/``: R = 2, 8; 4096 and 8192; rows 1 .. 64; bf16) and its FP8
   copy at a few shapes (``rmsnorm-fp8/``).
6. ``scripts/rank_sweep.py`` at 128 B fp32 (R = 2 .. 72, every one-shot, the empty-kernel floor
   before and after): ``rank-sweep.txt`` (the fastest algorithm per R and the ratios to R = 2 go
   to ``checks.json``); ``python -m sollat sol`` beside it (``sol/``).
7. With ``--ab-base``: ``scripts/ab_trees.py``, the base tree's kernels against this tree's,
   interleaved (``ab-narrow.*`` up to 8 ranks, ``ab-wide.*`` above): the one-shots at 128 B and
   8 KiB fp32, ``--ab-ranks``;
   ``--ab-batch8`` adds this tree with the wide one-shot's sum in batches of 8. On a machine without
   the repository's history pass a folder: ``git archive 54e7fdb sollat | tar -x -C .ab/base``.
8. The goal checks (``checks.json``, printed): ``auto`` against its candidates and against
   ar+compiled at every shape of every rmsnorm-bench.json, and each AllReduce table against the
   times it was measured from; the R sweep's ratios to R = 2.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sollat.bench import env, rmsnorm_sweep  # noqa: E402
from sollat.collectives import select  # noqa: E402

NARROW_RANKS = (2, 4, 8)
WIDE_RANKS = (16, 32, 64, 72)
NARROW_SIZES = "128:4M"
WIDE_SIZES = "128:256K"
HEADLINE = ["--ranks", "2,8", "--hidden", "4096,8192", "--rows", "1,2,4,8,16,64", "--dtypes", "bf16", "--fp8", "none"]
FP8_SHAPES = ["--ranks", "2,8", "--hidden", "4096,8192", "--rows", "1,8", "--dtypes", "none", "--fp8", "bf16"]
SWEEP_RANKS = "2,4,8,9,16,32,64,72"
SWEEP_ALGOS = "oneshot_ll,oneshot_sentinel,oneshot_ll_wide"
SWEEP_BYTES = 128
# The R sweep's goals: R = 64 and R = 72 against R = 2 at 128 B, the fastest algorithm at each.
R_GOALS = {64: 2.5, 72: 2.6}
# Steps --skip can leave out: the kernel cache, the tables of 2, 4, 8 ranks, the full fused-op sweep
# (their rules), the headline sweep and its FP8 shapes, the R sweep, the SoL probe, the wide tables.
STEPS = ("precompile", "tune", "full", "rmsnorm", "sweep", "sol", "tune-wide")
DEFAULT_BUDGET_S = 470.0  # seconds for every step: the whole run in about eight minutes


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--out", metavar="DIR", help="run every step on this GPU, writing under DIR")
    what.add_argument("--check", metavar="DIR", help="no GPU: the goal checks of a finished run's DIR")
    what.add_argument("--install-tables", metavar="DIR",
                      help="no GPU: copy DIR's tables into the package's tuning folder, replacing the shipped "
                           "table of the same key (gpu, world size, mode, interconnect)")
    p.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                   help=f"seconds for all steps (default {DEFAULT_BUDGET_S:.0f})")
    p.add_argument("--commit", default=None, help="the commit to record (default: git's, else $SOLLAT_COMMIT)")
    p.add_argument("--ab-base", default=None, metavar="DIR_OR_COMMIT",
                   help="also A/B this tree's kernels against a base: a folder holding a checkout's sollat package, "
                        "or a commit (exported with git archive into a temporary folder)")
    p.add_argument("--ab-ranks", default="2,16,64,72", type=_ranks,
                   help="world sizes of the A/B, 2..72 (default 2,16,64,72)")
    p.add_argument("--ab-batch8", action="store_true",
                   help="also A/B this tree built with the wide one-shot's rank-order sum in batches of 8 "
                        "(SOLLAT_REDUCE_BATCH_WIDE=8, SOLLAT_REDUCE_BATCH_UNROLLED=8)")
    p.add_argument("--skip", default="", help=f"comma list of steps to leave out: {', '.join(STEPS)} (an A/B alone: "
                                              "every one of them with --ab-base)")
    p.add_argument("--tuning-dir", default=str(select.TUNING_DIR), help=argparse.SUPPRESS)
    return p


def _ranks(text: str) -> str:
    try:
        rs = [int(r) for r in text.split(",") if r.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"a comma list of world sizes, got {text!r}") from None
    if not rs or any(not 2 <= r <= 72 for r in rs):
        raise argparse.ArgumentTypeError(f"world sizes in 2..72, got {text!r}")
    return ",".join(map(str, rs))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    a = p.parse_args(argv)
    if a.budget_s <= 0:
        p.error(f"--budget-s must be > 0, got {a.budget_s}")
    a.skip = {s.strip() for s in a.skip.split(",") if s.strip()}
    unknown = a.skip - set(STEPS)
    if unknown:
        p.error(f"--skip: unknown step {sorted(unknown)[0]!r} ({', '.join(STEPS)})")
    return a


class Runner:
    """Child processes under one time budget; each step's output to its log file."""

    def __init__(self, out: Path, budget_s: float) -> None:
        self.out, self.budget_s, self.t0 = out, budget_s, time.monotonic()
        self.steps: list[dict[str, Any]] = []

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.t0)

    def run(self, name: str, cmd: list[str], cap_s: float, reserve_s: float = 0.0) -> bool:
        """Run ``cmd`` for at most ``cap_s`` seconds, leaving ``reserve_s`` (of the default budget,
        scaled to this one) for the steps after it; True when it exits 0."""
        scale = min(1.0, self.budget_s / DEFAULT_BUDGET_S)
        limit = min(cap_s, self.left() - reserve_s * scale)
        if limit < 5:
            self.steps.append({"step": name, "skipped": "no time left", "command": " ".join(cmd)})
            print(f"[{name}] skipped: no time left", flush=True)
            return False
        log = self.out / "logs" / f"{name}.txt"
        log.parent.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        with log.open("w") as f:
            f.write("$ " + " ".join(cmd) + "\n")
            f.flush()
            try:
                rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=limit).returncode
            except subprocess.TimeoutExpired:
                rc = 124
        took = time.monotonic() - start
        self.steps.append({"step": name, "rc": rc, "s": round(took, 1), "limit_s": round(limit, 1),
                           "command": " ".join(cmd), "log": str(log.relative_to(self.out))})
        print(f"[{name}] rc {rc} in {took:.0f} s (limit {limit:.0f} s, {self.left():.0f} s left)", flush=True)
        return rc == 0


def r_sweep_summary(text: str, byte_size: int = SWEEP_BYTES) -> dict[str, Any]:
    """scripts/rank_sweep.py's output: per R the fastest algorithm at ``byte_size`` (median µs),
    the floors, and each R's time over R = 2's against R_GOALS."""
    best: dict[int, tuple[str, float]] = {}
    floors = []
    for line in text.splitlines():
        m = re.match(r"^SWEEP (\d+) (\S+) (\d+) ([0-9.]+) ([0-9.]+) ([0-9.]+)(.*)$", line)
        if m and int(m.group(3)) == byte_size and "WRONG" not in m.group(7):
            r, algo, us = int(m.group(1)), m.group(2), float(m.group(4))
            if r not in best or us < best[r][1]:
                best[r] = (algo, us)
        f = re.match(r"^FLOOR plain ([0-9.]+) pdl ([0-9.]+)", line)
        if f:
            floors.append({"plain_us": float(f.group(1)), "pdl_us": float(f.group(2))})
    wrong = [line for line in text.splitlines() if line.startswith("SWEEP") and "WRONG" in line]
    base = best.get(2, (None, None))[1]
    ratios = {r: us / base for r, (_, us) in best.items()} if base else {}
    goals = {str(r): {"ratio": ratios.get(r), "goal": g, "met": ratios[r] <= g if r in ratios else None}
             for r, g in R_GOALS.items()}
    return {"bytes": byte_size, "fastest": {str(r): {"algorithm": a, "us": us} for r, (a, us) in sorted(best.items())},
            "ratio_to_r2": {str(r): v for r, v in sorted(ratios.items())}, "goals": goals, "floors": floors,
            "wrong": wrong}


def table_checks(out: Path) -> list[dict[str, Any]]:
    """Each tune measurement (tune/*.json) against the table written from it (tuning/)."""
    from sollat import tune

    found = []
    tables = [select.load_table(f) for f in sorted((out / "tuning").glob("*.json"))]
    for f in sorted((out / "tune").glob("*.json")):
        doc = json.loads(f.read_text())
        mine = [t for t in tables if t.gpu == doc["card"] and t.world_size == doc["ranks"] and t.mode == doc["mode"]]
        if not mine:
            found.append({"measurement": f.name, "error": "no table of this card and world size in tuning/"})
            continue
        found.append({"measurement": f.name, "table": Path(mine[0].source).name, **tune.allreduce_goal(doc, mine[0])})
    return found


def checks(out: Path) -> dict[str, Any]:
    """Every goal check of a run's folder (no GPU): written to checks.json and printed."""
    result: dict[str, Any] = {"rmsnorm": {}, "allreduce_tables": table_checks(out)}
    for sub in ("rmsnorm", "rmsnorm-fp8", "rmsnorm-full"):
        f = out / sub / "rmsnorm-bench.json"
        if f.exists():
            doc = json.loads(f.read_text())
            result["rmsnorm"][sub] = {**rmsnorm_sweep.check_goals(doc), "summary": doc.get("summary")}
            print(f"== {sub}\n{rmsnorm_sweep.format_goals(result['rmsnorm'][sub])}")
    for t in result["allreduce_tables"]:
        if "error" in t:
            print(f"== AllReduce {t['measurement']}: {t['error']}")
            continue
        print(f"== AllReduce {t['table']}: auto within {t['within']:.2f}x of the fastest at {t['met']} of "
              f"{t['sizes']} sizes" + "".join(f"\n  miss {m['bytes']} B: {m['auto']} {m['ratio']:.3f}x of {m['fastest']}"
                                             for m in t["misses"]))
    sweep = out / "rank-sweep.txt"
    if sweep.exists():
        result["r_sweep"] = r_sweep_summary(sweep.read_text())
        rs = result["r_sweep"]
        line = "  ".join(f"R={r} {v['us']:.2f} ({v['algorithm']})" for r, v in rs["fastest"].items())
        print(f"== R sweep at {rs['bytes']} B fp32: {line}")
        for r, g in rs["goals"].items():
            ratio = "-" if g["ratio"] is None else f"{g['ratio']:.2f}"
            print(f"  R={r} / R=2: {ratio} (goal {g['goal']}, {'met' if g['met'] else 'NOT met'})")
        if rs["wrong"]:
            print(f"  WRONG results: {rs['wrong'][:3]}")
    (out / "checks.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    return result


def install_tables(src: Path, tuning_dir: Path) -> list[Path]:
    """Copy ``src``'s tables into ``tuning_dir``; a shipped table of the same key is removed first
    (one file per key, so ``find_table`` never has to break a tie)."""
    written = []
    shipped = {f: select.load_table(f) for f in sorted(tuning_dir.glob("*.json"))}
    for f in sorted(src.glob("*.json")):
        t = select.load_table(f)
        key = (t.gpu, t.world_size, t.mode, t.interconnect)
        for old, ot in shipped.items():
            if (ot.gpu, ot.world_size, ot.mode, ot.interconnect) == key and old.name != f.name and old.exists():
                old.unlink()
                print(f"removed {old} (same key as {f.name})")
        written.append(Path(shutil.copyfile(f, tuning_dir / f.name)))
        print(f"installed {written[-1]}")
    return written


def base_tree(spec: str) -> Path:
    """``--ab-base``: a folder with a sollat package as is, else a commit exported by git archive."""
    p = Path(spec)
    if (p / "sollat").is_dir():
        return p.resolve()
    tmp = Path(tempfile.mkdtemp(prefix="sollat-ab-base-"))
    archive = subprocess.run(["git", "archive", spec, "sollat"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
    return tmp


def measure(a: argparse.Namespace) -> int:
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env.apply_safety_env()  # inherited by every child
    os.environ.setdefault("SOLLAT_CACHE_DIR", str(Path(tempfile.gettempdir()) / "sollat-card-report-cache"))
    os.environ["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    commit = env.git_commit(a.commit)
    py = sys.executable
    run = Runner(out, a.budget_s)
    env_lines = [f"commit {commit}", f"date {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
                 f"command {' '.join([sys.executable, *sys.argv])}"]
    for cmd in (["nvidia-smi", "-L"], ["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,temperature.gpu",
                                       "--format=csv"], [py, "-c", "import torch; print('torch', torch.__version__)"]):
        try:
            env_lines.append(subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip())
        except (OSError, subprocess.TimeoutExpired) as exc:
            env_lines.append(f"{cmd[0]}: {exc}")
    (out / "env.txt").write_text("\n".join(env_lines) + "\n")
    print("\n".join(env_lines), flush=True)

    tuning, tune_json = out / "tuning", out / "tune"
    tuning.mkdir(exist_ok=True)
    tune_json.mkdir(exist_ok=True)
    if "precompile" not in a.skip:
        run.run("precompile", [py, "-m", "sollat", "precompile", "-j", str(max(1, (os.cpu_count() or 2))),
                               "--no-progress"], cap_s=130, reserve_s=330)
    for r in NARROW_RANKS if "tune" not in a.skip else ():
        run.run(f"tune-ws{r}", [py, "-m", "sollat", "tune", "--ranks", str(r), "--sizes", NARROW_SIZES,
                                "--out", str(tuning), "--json", str(tune_json / f"tune-ws{r}.json")],
                cap_s=60, reserve_s=280)
    bench = [py, "scripts/rmsnorm_bench.py", "--commit", commit]
    if "full" not in a.skip:
        run.run("rmsnorm-full", [*bench, "--into", str(out / "rmsnorm-full"), "--budget-s", "75",
                                 "--write-tables", str(tuning), "--tables-from", str(tuning)], cap_s=110, reserve_s=200)
    user = Path(os.environ["SOLLAT_CACHE_DIR"]) / "tuning"  # select.user_table_dir() of the children
    user.mkdir(parents=True, exist_ok=True)
    for f in tuning.glob("*.json"):
        shutil.copyfile(f, user / f.name)
    if "rmsnorm" not in a.skip:
        run.run("rmsnorm", [*bench, "--into", str(out / "rmsnorm"), *HEADLINE], cap_s=60, reserve_s=140)
        run.run("rmsnorm-fp8", [*bench, "--into", str(out / "rmsnorm-fp8"), *FP8_SHAPES], cap_s=40, reserve_s=100)
    sweep = [py, "scripts/rank_sweep.py", "--ranks", SWEEP_RANKS, "--sizes", str(SWEEP_BYTES), "--dtype", "float32",
             "--algos", SWEEP_ALGOS]
    if "sweep" not in a.skip and run.run("rank-sweep", sweep, cap_s=90, reserve_s=10):
        shutil.copyfile(out / "logs" / "rank-sweep.txt", out / "rank-sweep.txt")
    if "sol" not in a.skip:
        run.run("sol", [py, "-m", "sollat", "sol", "--quick", "--no-progress", "--into", str(out / "sol"),
                        "--commit", commit], cap_s=60, reserve_s=10)
    if "tune-wide" not in a.skip:
        for r in WIDE_RANKS:
            run.run(f"tune-ws{r}", [py, "-m", "sollat", "tune", "--ranks", str(r), "--sizes", WIDE_SIZES, "--dtype",
                                    "float32", "--out", str(tuning), "--json", str(tune_json / f"tune-ws{r}.json")],
                    cap_s=60, reserve_s=5)
    base = None
    if a.ab_base:
        try:
            base = base_tree(a.ab_base)
        except (OSError, subprocess.CalledProcessError) as exc:
            run.steps.append({"step": "ab", "skipped": f"no base tree from {a.ab_base!r}: {exc}"})
            print(f"[ab] skipped: {a.ab_base!r} is no folder with a sollat package and git cannot export it ({exc}); "
                  "pass a folder (git archive COMMIT sollat | tar -x -C DIR)", flush=True)
    if base is not None:
        trees = ["--tree", f"base={base}"]
        if a.ab_batch8:
            trees += ["--tree", "batch8=.:SOLLAT_REDUCE_BATCH_WIDE=8,SOLLAT_REDUCE_BATCH_UNROLLED=8"]
        ranks = [int(r) for r in a.ab_ranks.split(",") if r.strip()]
        for part, rs, algos in (("narrow", [r for r in ranks if r <= 8], "oneshot_ll,oneshot_sentinel"),
                                ("wide", [r for r in ranks if r > 8], SWEEP_ALGOS)):  # the wide one-shot: R >= 9
            if rs:
                run.run(f"ab-{part}", [py, "scripts/ab_trees.py", *trees, "--tree", "new=.",
                                       "--ranks", ",".join(map(str, rs)), "--algos", algos, "--sizes", "128,8192",
                                       "--dtypes", "float32", "--reps", "2", "--json", str(out / f"ab-{part}.json")],
                        cap_s=600)
                if (out / "logs" / f"ab-{part}.txt").exists():
                    shutil.copyfile(out / "logs" / f"ab-{part}.txt", out / f"ab-{part}.txt")
    (out / "steps.json").write_text(json.dumps({"commit": commit, "budget_s": a.budget_s, "steps": run.steps},
                                               indent=1) + "\n")
    checks(out)
    failed = [s["step"] for s in run.steps if s.get("rc") not in (0, None)]
    skipped = [s["step"] for s in run.steps if "skipped" in s]
    print(f"steps failed: {failed or 'none'}; skipped: {skipped or 'none'}; tables in {tuning} "
          f"(install: python3 scripts/card_report.py --install-tables {tuning})")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    if a.check:
        checks(Path(a.check))
        return 0
    if a.install_tables:
        install_tables(Path(a.install_tables), Path(a.tuning_dir))
        return 0
    return measure(a)


if __name__ == "__main__":
    sys.exit(main())
