"""The host side of scripts/rmsnorm_bench.py (AllReduce + residual add + RMSNorm at decode shapes):
its command line, the order of its shapes, the targets each shape is held to, the JSON it writes,
the table it prints, and the tuning-table rules derived from a sweep (``write_tables``). No GPU.

The targets (per shape; ``norm`` = ar+compiled - ar, what the add and the norm cost after the
AllReduce): ``auto`` at most ``ar + 0.25 norm`` up to 16 rows, ``ar + 0.5 norm`` up to 64 rows and
never slower than ar+compiled; the epilogue alone within 1.1x of the compiled add + norm alone over
the same rows.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..collectives import rmsnorm, rmsnorm_rules, select
from . import results

RANKS = (2, 4, 8)
HIDDEN = (4096, 5120, 8192)
ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 512)
DTYPES: dict[str, int] = {"bfloat16": 2, "float16": 2, "float32": 4}  # name -> element bytes
SHORT = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
QUICK = {"ranks": "2,8", "hidden": "4096,8192", "rows": "1,8,64", "dtypes": "bf16", "fp8": "bf16"}
# Row names, in table order. "auto" is the time of the algorithm auto picks (the same launches).
TIMED = ("fused_ll", "fused_sentinel", "unfused", "ar", "ar+compiled", "epilogue", "compiled_norm")
NAMES = ("fused_ll", "fused_sentinel", "auto", "unfused", "ar", "ar+compiled", "epilogue", "compiled_norm")
EPILOGUE_RATIO = 1.1
TARGETS = ((16, 0.25), (64, 0.5))  # (most rows, share of norm auto may add to ar)


@dataclass(frozen=True)
class Shape:
    ranks: int
    dtype: str  # a DTYPES name
    fp8: bool  # with the FP8 copy (fp8_scale)
    tokens: int  # rows per rank
    hidden: int

    @property
    def row_bytes(self) -> int:
        return self.hidden * DTYPES[self.dtype]


def _ints(text: str, what: str, low: int, high: int) -> tuple[int, ...]:
    try:
        vals = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what}: a comma list of integers, got {text!r}") from None
    bad = [v for v in vals if not low <= v <= high]
    if not vals or bad:
        raise argparse.ArgumentTypeError(f"{what}: integers in {low}..{high}, got {text!r}")
    return tuple(dict.fromkeys(vals))


def _dtypes(text: str, what: str) -> tuple[str, ...]:
    if text in ("", "none"):
        return ()
    names = tuple(dict.fromkeys(v.strip() for v in text.split(",")))
    bad = [n for n in names if n not in SHORT]
    if bad:
        raise argparse.ArgumentTypeError(f"{what}: dtypes among {', '.join(SHORT)} (or none), got {', '.join(bad)}")
    return tuple(SHORT[n] for n in names)


def build_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--ranks", default=None, help="virtual ranks, comma list (default 2,4,8; ignored under torchrun)")
    p.add_argument("--hidden", default=None, help="hidden sizes (default 4096,5120,8192)")
    p.add_argument("--rows", default=None, help="rows (tokens) per rank (default 1,2,4,8,16,32,64,128,512)")
    p.add_argument("--dtypes", default=None, help="bf16,fp16,fp32 (default all three)")
    p.add_argument("--fp8", default=None, help="dtypes also run with the FP8 copy (default bf16; none: no FP8 rows)")
    p.add_argument("--quick", action="store_true", help=f"a small sweep: {QUICK}")
    p.add_argument("--calls", type=int, default=20, help="calls per CUDA graph (fewer for large messages)")
    p.add_argument("--replays", type=int, default=10, help="timed replays per row (the median is reported)")
    p.add_argument("--budget-s", type=float, default=0.0,
                   help="start no new shape after this many seconds (0: no limit); the JSON says what ran")
    p.add_argument("--into", default=None, help="folder for rmsnorm-bench.json (rewritten after every shape)")
    p.add_argument("--commit", default=None, help="the commit to record (default: git's)")
    p.add_argument("--ab", action="store_true",
                   help="development: also check and time the fused oneshot_ll_block and the epilogue's A/B builds "
                        "(rmsnorm_epilogue.Variant); one extra line per shape, 'ab' in the JSON rows")
    p.add_argument("--row-lines", type=int, default=None,
                   help="development: rmsnorm.ROW_LINES_PER_BLOCK for this run (how wide a fused row's cluster gets)")
    p.add_argument("--rules-from", default=None, metavar="JSON",
                   help="no measuring: derive all_reduce_rmsnorm's auto rules from this rmsnorm-bench.json")
    p.add_argument("--write-tables", default=None, metavar="DIR",
                   help="write the virtual-rank tuning tables of the measured card and rank counts, with the derived "
                        "rules, into DIR (the shipped tables are sollat/collectives/tuning)")
    p.add_argument("--tables-from", default=str(select.TUNING_DIR), metavar="DIR",
                   help="the tables whose AllReduce rules the written ones keep (default: the shipped ones)")
    return p


def parse_args(argv: Sequence[str] | None, description: str = "") -> argparse.Namespace:
    """The checked command line: ranks, hidden, rows, dtypes and fp8 as tuples (quick: QUICK's)."""
    p = build_parser(description)
    a = p.parse_args(argv)
    try:
        pick = {k: getattr(a, k) if getattr(a, k) is not None else (QUICK[k] if a.quick else None) for k in QUICK}
        a.ranks = _ints(pick["ranks"], "--ranks", 1, 72) if pick["ranks"] else RANKS
        a.hidden = _ints(pick["hidden"], "--hidden", 1, rmsnorm.MAX_HIDDEN) if pick["hidden"] else HIDDEN
        a.rows = _ints(pick["rows"], "--rows", 1, 1 << 20) if pick["rows"] else ROWS
        a.dtypes = _dtypes(pick["dtypes"], "--dtypes") if pick["dtypes"] is not None else tuple(DTYPES)
        a.fp8 = _dtypes(pick["fp8"], "--fp8") if pick["fp8"] is not None else ("bfloat16",)
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    if not a.dtypes and not a.fp8:
        p.error("--dtypes and --fp8 leave nothing to measure")
    if a.calls < 1 or a.replays < 1 or a.budget_s < 0:
        p.error("--calls and --replays must be >= 1 and --budget-s >= 0")
    if a.write_tables is None and a.rules_from is not None:
        p.error("--rules-from needs --write-tables DIR (where the tables go)")
    return a


def plan_shapes(ranks: Iterable[int], dtypes: Iterable[str], fp8: Iterable[str], hidden: Iterable[int],
                rows: Iterable[int]) -> list[Shape]:
    """Every shape, in the order they run: dtype groups bf16, bf16 + FP8, fp16, fp32 (what a run cut
    short by its budget misses is the least used), then hidden, rows, and the rank count innermost
    (every rank count gets each shape before the next one starts)."""
    groups = [(d, False) for d in dtypes] + [(d, True) for d in fp8]
    order = {("bfloat16", False): 0, ("bfloat16", True): 1, ("float16", False): 2, ("float32", False): 3}
    groups.sort(key=lambda g: order.get(g, 4))
    return [Shape(r, d, f, t, h) for d, f in groups for h in hidden for t in rows for r in ranks]


def judge(row: Mapping[str, Any]) -> dict[str, Any]:
    """The targets of one measured row: norm, auto's target and whether it meets it, whether auto
    is never slower than ar+compiled, and the epilogue's ratio to the compiled norm alone."""
    us = row["us"]
    ar, compiled = us.get("ar"), us.get("ar+compiled")
    out: dict[str, Any] = {}
    if ar is not None and compiled is not None and us.get("auto") is not None:
        norm = compiled - ar
        share = next((s for most, s in TARGETS if row["tokens"] <= most), 1.0)
        target = ar + share * norm
        out.update(norm=norm, target=target, auto_meets_target=us["auto"] <= target,
                   auto_not_slower=us["auto"] <= compiled, auto_vs_compiled=us["auto"] / compiled)
    if us.get("epilogue") is not None and us.get("compiled_norm"):
        ratio = us["epilogue"] / us["compiled_norm"]
        out.update(epilogue_ratio=ratio, epilogue_ok=ratio <= EPILOGUE_RATIO)
    return out


# The goals of ``auto`` at each shape (``auto_goals``): at most AUTO_OF_FASTEST times the fastest of
# the algorithms it chooses among, and at most AUTO_OF_COMPILED times ar+compiled.
AUTO_CANDIDATES = ("fused_ll", "fused_sentinel", "unfused")
AUTO_OF_FASTEST = 1.03
AUTO_OF_COMPILED = 1.02


def _passed(row: Mapping[str, Any], name: str) -> bool:
    check = row.get("checks", {}).get(rmsnorm_rules.BENCH_NAMES[name], "bitwise ok")
    return str(check).startswith(("bitwise ok", "ok"))


def auto_goals(row: Mapping[str, Any]) -> dict[str, Any]:
    """One measured row against ``auto``'s goals: the fastest candidate that passed its bitwise
    check, auto / that (``meets_fastest``: at most AUTO_OF_FASTEST) and auto / ar+compiled
    (``meets_compiled``: at most AUTO_OF_COMPILED). An unmeasured side is None."""
    us = row["us"]
    auto = us.get("auto")
    timed = {n: us[n] for n in AUTO_CANDIDATES if us.get(n) is not None and _passed(row, n)}
    out: dict[str, Any] = {"fastest": None, "auto_of_fastest": None, "meets_fastest": None,
                           "auto_of_compiled": None, "meets_compiled": None}
    if auto is None:
        return out
    if timed:
        best = min(timed, key=lambda n: timed[n])
        ratio = auto / timed[best]
        out.update(fastest=best, auto_of_fastest=ratio, meets_fastest=ratio <= AUTO_OF_FASTEST)
    if us.get("ar+compiled"):
        ratio = auto / us["ar+compiled"]
        out.update(auto_of_compiled=ratio, meets_compiled=ratio <= AUTO_OF_COMPILED)
    return out


def check_goals(doc: Mapping[str, Any]) -> dict[str, Any]:
    """At how many shapes of a measured rmsnorm-bench.json ``auto`` meets each goal (``auto_goals``),
    and every shape that misses one (with its pick, the fastest candidate and the ratios)."""
    rows = doc["rows"]
    judged = [(r, auto_goals(r)) for r in rows]
    misses = []
    for r, g in judged:
        if g["meets_fastest"] is False or g["meets_compiled"] is False:
            misses.append({"shape": shape_key(r), "auto_pick": r.get("auto_pick"), **g})
    return {"card": doc.get("meta", {}).get("card"), "commit": doc.get("meta", {}).get("commit"),
            "shapes": len(rows), "of_fastest": AUTO_OF_FASTEST, "of_compiled": AUTO_OF_COMPILED,
            "meets_fastest": sum(g["meets_fastest"] is True for _, g in judged),
            "meets_compiled": sum(g["meets_compiled"] is True for _, g in judged),
            "meets_both": sum(g["meets_fastest"] is True and g["meets_compiled"] is True for _, g in judged),
            "misses": misses}


def format_goals(result: Mapping[str, Any]) -> str:
    """``check_goals``'s result as lines for a log."""
    n = result["shapes"]
    lines = [f"auto on {result['card']} at {result['commit']}: within {result['of_fastest']:.2f}x of the fastest "
             f"candidate at {result['meets_fastest']} of {n} shapes, within {result['of_compiled']:.2f}x of "
             f"ar+compiled at {result['meets_compiled']} of {n}, both at {result['meets_both']} of {n}"]
    for m in result["misses"]:
        f = "-" if m["auto_of_fastest"] is None else f"{m['auto_of_fastest']:.3f}"
        c = "-" if m["auto_of_compiled"] is None else f"{m['auto_of_compiled']:.3f}"
        lines.append(f"  miss {m['shape']}: auto picks {m['auto_pick']}, fastest {m['fastest']}; "
                     f"auto/fastest {f}, auto/ar+compiled {c}")
    return "\n".join(lines)


def shape_key(r: Mapping[str, Any]) -> str:
    return f"R={r['ranks']} {r['dtype']}{'+fp8' if r['fp8'] else ''} {r['tokens']}x{r['hidden']}"


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Counts over the measured rows, and every row that misses a target (what docs/benchmarks.md
    must name)."""
    judged = [(r, judge(r)) for r in rows]
    key = shape_key

    bad_checks = [key(r) for r in rows if any(not str(c).startswith(("bitwise ok", "ok")) for c in r["checks"].values())]
    return {
        "shapes": len(rows),
        "auto_meets_target": sum(bool(j.get("auto_meets_target")) for _, j in judged),
        "auto_not_slower": sum(bool(j.get("auto_not_slower")) for _, j in judged),
        "epilogue_within_1.1x": sum(bool(j.get("epilogue_ok")) for _, j in judged),
        "misses_target": [key(r) for r, j in judged if j.get("auto_meets_target") is False],
        "slower_than_ar+compiled": [key(r) for r, j in judged if j.get("auto_not_slower") is False],
        "epilogue_over_1.1x": [key(r) for r, j in judged if j.get("epilogue_ok") is False],
        "failed_checks": bad_checks,
    }


def report(meta: Mapping[str, Any], floor_us: float | None, rows: Sequence[Mapping[str, Any]], planned: int,
           elapsed_s: float) -> dict[str, Any]:
    """The committed-style document: meta (mode, card, date, commit, command ...), the floor, the rows
    with their targets, the summary, and whether every planned shape ran."""
    return {"meta": dict(meta), "floor_us": floor_us, "planned_shapes": planned, "complete": len(rows) == planned,
            "elapsed_s": elapsed_s, "rows": [{**r, "judge": judge(r)} for r in rows], "summary": summarize(rows)}


def write_report(folder: str | Path, doc: Mapping[str, Any]) -> Path:
    """``folder/rmsnorm-bench.json`` (NaN/Inf as null), written whole: a reader sees the previous or
    the new document."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = results.write_json(folder / "rmsnorm-bench.json.tmp", dict(doc))
    return tmp.replace(folder / "rmsnorm-bench.json")


def header() -> str:
    cols = " ".join(f"{n:>14}" for n in NAMES)
    return f"{'R':>2} {'dtype':>9} {'shape':>10} {cols} {'auto pick':>16} {'auto/arc':>8} {'epi/cn':>6}  checks"


def format_row(row: Mapping[str, Any]) -> str:
    """One table line: µs per step of every row name, auto's pick, auto / ar+compiled, epilogue /
    compiled norm, and the checks that did not pass."""
    us, j = row["us"], judge(row)
    cells = " ".join(f"{us[n]:>14.2f}" if us.get(n) is not None else f"{'-':>14}" for n in NAMES)
    bad = [f"{k}: {v}" for k, v in row["checks"].items() if not str(v).startswith(("bitwise ok", "ok"))]
    arc = f"{j['auto_vs_compiled']:.2f}" if "auto_vs_compiled" in j else "-"
    epi = f"{j['epilogue_ratio']:.2f}" if "epilogue_ratio" in j else "-"
    label = f"{row['dtype'].replace('bfloat', 'bf').replace('float', 'fp')}{'+fp8' if row['fp8'] else ''}"
    return (f"{row['ranks']:>2} {label:>9} {row['tokens']:>4}x{row['hidden']:<5} {cells} {row['auto_pick']:>16} "
            f"{arc:>8} {epi:>6}  {'all bitwise ok' if not bad else '; '.join(bad)}")


def rules_note(meta: Mapping[str, Any], ranks: int) -> str:
    return (f"Measured {meta.get('date', '?')} by scripts/rmsnorm_bench.py (docs/benchmarks.md, the fused RMSNorm sweep) with "
            f"{ranks} VIRTUAL ranks on one {meta.get('card', '?')}: they share one GPU's SMs and L2, so this rule does "
            "not predict NVLink; real-rank tables keep the built-in rule until measured on real ranks. Per (rows, "
            "row bytes) cell the algorithm with the smallest worst ratio to sollat's AllReduce + a torch.compile'd "
            f"add + RMSNorm over the dtypes and FP8 variants measured, a fused kernel only when "
            f"{rmsnorm_rules.MARGIN:.0%} faster than unfused.")


def write_tables(doc: Mapping[str, Any], tables_from: str | Path, into: str | Path) -> list[Path]:
    """For every rank count of a virtual sweep, the shipped (or ``tables_from``) virtual-rank table of
    that card and world size with ``rmsnorm_rules.derive``'s rule, written under its file name into
    ``into``. A rank count without such a table is reported, not invented (its AllReduce rules would
    be missing)."""
    meta = doc["meta"]
    if meta.get("mode") != "virtual":
        raise ValueError(f"rules come from a virtual-rank sweep here, this one is {meta.get('mode')!r}")
    card = meta.get("card")
    written = []
    for r in sorted({int(row["ranks"]) for row in doc["rows"]}):
        found = [(f, t) for f in sorted(Path(tables_from).glob("*.json"))
                 for t in [select.load_table(f)] if t.gpu == card and t.world_size == r and t.mode == "virtual"]
        if not found:
            print(f"no virtual-rank table for {card} at {r} ranks in {tables_from}: none written")
            continue
        path, table = found[0]
        rules = rmsnorm_rules.derive(doc["rows"], r, rules_note(meta, r))
        written.append(select.write_table(replace(table, rmsnorm=rules), Path(into) / path.name))
    return written
