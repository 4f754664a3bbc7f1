"""Result records and the JSON / CSV files they are written to.

One ``Row`` is one (implementation, algorithm, rank count, dtype, message size) measurement, or
one implementation that could not run at all (``nbytes`` is None and ``reason`` says why).
``BarrierRow`` is one (barrier variant, rank count) measurement. Files:

``bench.json``   {"meta", "floor", "sol", "rows"}: everything, re-plottable without a GPU
``bench.csv``    one line per row, with the meta columns repeated (for spreadsheets)
``bench.txt``    the terminal table
``sol.json``     {"meta", "sol"}            ``barrier.json`` / ``barrier.csv``: {"meta", "floor", "rows"}

Every meta names the ``commit`` the code was at and whether the checkout had uncommitted changes
(``dirty``); titles then say ``+dirty``.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from .stats import Stats

SCHEMA_VERSION = 1

# Row.status values.
OK = "ok"
UNSUPPORTED = "unsupported"  # the implementation refuses this size/dtype (reason says why)
ERROR = "error"  # it tried and failed
SKIPPED = "skipped"  # not run in this configuration (e.g. "needs >= 2 GPUs")

IMPL_LABELS = {
    "sollat": "sollat",
    "nccl": "nccl",
    "nccl-window": "nccl symmetric",
    "torch-symm": "torch symm_mem",
}


_MeasurementT = TypeVar("_MeasurementT", bound="_Measurement")


@dataclass(kw_only=True)
class _Measurement:
    """What every record holds: whether it ran and, if it did, the statistics of its samples."""

    status: str = OK
    reason: str = ""
    median_us: float | None = None
    p10_us: float | None = None
    p90_us: float | None = None
    min_us: float | None = None
    max_us: float | None = None
    spread_pct: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == OK and self.median_us is not None

    def set_stats(self: _MeasurementT, s: Stats) -> _MeasurementT:
        self.median_us, self.p10_us, self.p90_us = s.median, s.p10, s.p90
        self.min_us, self.max_us, self.spread_pct = s.min, s.max, s.spread_pct
        return self

    def to_dict(self) -> dict[str, Any]:
        """The fields, the ones that name the record (those without a default) first: the order the
        files have always had them in."""
        values = asdict(self)
        names = [f.name for f in fields(self)]
        naming = [f.name for f in fields(self) if f.default is MISSING and f.default_factory is MISSING]
        return {name: values[name] for name in naming + [n for n in names if n not in naming]}

    @classmethod
    def from_dict(cls: type[_MeasurementT], d: dict[str, Any]) -> _MeasurementT:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass
class Row(_Measurement):
    impl: str  # "sollat", "nccl", "nccl-window", "torch-symm"
    algo: str  # sollat algorithm or "auto"; NCCL "default" or "Ring/LL"...; torch "one_shot"...
    ranks: int  # ranks the implementation actually ran with (1 for world-size-1 references)
    dtype: str  # "float32", "bfloat16"
    nbytes: int | None  # message size per rank; None when the whole implementation was skipped
    calls_per_graph: int = 0
    replays: int = 0
    check: str = ""  # correctness of the timed outputs: "ok", "mismatch (...)", "n/a"
    selected: str = ""  # for algo "auto": the algorithm it picked
    env: dict[str, str] = field(default_factory=dict)  # NCCL_* settings of the child that ran it

    @property
    def label(self) -> str:
        return row_label(self.impl, self.algo, self.ranks)


def row_label(impl: str, algo: str, ranks: int | None = None) -> str:
    """Display name of a line/column: ``sollat oneshot_ll``, ``nccl``, ``nccl Ring/LL`` ..."""
    base = IMPL_LABELS.get(impl, impl)
    name = base if algo in ("", "default") else f"{base} {algo}"
    if ranks == 1:
        name += " (1 rank)"
    return name


@dataclass
class BarrierRow(_Measurement):
    variant: str  # "a2a relaxed", "a2a acq_rel", "nccl lsa"
    ranks: int
    where: str  # "in-kernel" (per barrier inside one launch) or "graph" (one launch per barrier)
    samples: int = 0

    @property
    def label(self) -> str:
        return f"{self.variant} ({self.where})"

    def set_stats(self, s: Stats) -> BarrierRow:
        super().set_stats(s)
        self.samples = s.n
        return self


# ---- the commit ----------------------------------------------------------------------------

DIRTY = "+dirty"


def commit_fields(commit: str | None) -> dict[str, Any]:
    """``{"commit", "dirty"}`` from a commit text as ``env.git_commit()`` gives it (a short hash, with
    ``+dirty`` appended when the checkout had changes)."""
    text = (commit or "").strip()
    return {"commit": text.removesuffix(DIRTY) or "unknown", "dirty": text.endswith(DIRTY)}


def commit_label(meta: dict[str, Any]) -> str:
    """The commit as titles name it: never empty, ``+dirty`` when the checkout had changes."""
    fields = commit_fields(str(meta.get("commit") or ""))
    return fields["commit"] + (DIRTY if fields["dirty"] or meta.get("dirty") else "")


# ---- run folders ---------------------------------------------------------------------------

def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "x"


def make_run_dir(out: str | Path, *, card: str, tag: str, now: _dt.datetime | None = None) -> Path:
    """Create ``out/<YYYYmmdd-HHMMSS>-<card>-<tag>/`` (a suffix keeps it unique) and return it."""
    now = now or _dt.datetime.now()
    base = Path(out) / f"{now:%Y%m%d-%H%M%S}-{_slug(card)}-{_slug(tag)}"
    path, k = base, 1
    while path.exists():
        k += 1
        path = base.with_name(f"{base.name}-{k}")
    path.mkdir(parents=True)
    return path


# ---- JSON ----------------------------------------------------------------------------------

def _clean(obj: Any) -> Any:
    """JSON cannot hold NaN/inf: write them as null."""
    if isinstance(obj, float) and (obj != obj or obj in (float("inf"), float("-inf"))):
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def write_json(path: str | Path, payload: dict[str, Any]) -> Path:
    path = Path(path)
    data = dict(payload)
    data.setdefault("schema", SCHEMA_VERSION)
    for key in ("rows",):
        if key in data:
            data[key] = [r.to_dict() if hasattr(r, "to_dict") else r for r in data[key]]
    path.write_text(json.dumps(_clean(data), indent=1, sort_keys=False) + "\n")
    return path


def read_json(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def load_bench(path: str | Path) -> tuple[dict[str, Any], list[Row]]:
    """(document without rows, rows) of a bench.json."""
    doc = read_json(path)
    rows = [Row.from_dict(r) for r in doc.get("rows", [])]
    return doc, rows


def load_barrier(path: str | Path) -> tuple[dict[str, Any], list[BarrierRow]]:
    doc = read_json(path)
    rows = [BarrierRow.from_dict(r) for r in doc.get("rows", [])]
    return doc, rows


# ---- CSV -----------------------------------------------------------------------------------

BENCH_META_COLUMNS = ("card", "mode", "date", "commit", "dirty")
BENCH_CSV_COLUMNS = (
    "impl", "algo", "label", "ranks", "dtype", "bytes", "status", "reason", "median_us", "p10_us", "p90_us",
    "min_us", "max_us", "spread_pct", "calls_per_graph", "replays", "check", "selected", "env",
    "floor_us", "sol_us",
) + BENCH_META_COLUMNS


def _fmt(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, dict):
        return " ".join(f"{k}={val}" for k, val in sorted(v.items()))
    return v


def _write_csv(path: str | Path, columns: Sequence[str], lines: Iterable[Sequence[Any]]) -> Path:
    path = Path(path)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for line in lines:
            w.writerow([_fmt(v) for v in line])
    return path


def write_bench_csv(path: str | Path, rows: Iterable[Row], *, meta: dict[str, Any],
                    floor_us: float | None, sol_us: float | None) -> Path:
    meta_values = [meta.get(k, "") for k in BENCH_META_COLUMNS]

    def line(r: Row) -> list[Any]:
        d = r.to_dict()
        return [d["impl"], d["algo"], r.label, d["ranks"], d["dtype"], d["nbytes"], d["status"], d["reason"],
                d["median_us"], d["p10_us"], d["p90_us"], d["min_us"], d["max_us"], d["spread_pct"],
                d["calls_per_graph"], d["replays"], d["check"], d["selected"], d["env"], floor_us, sol_us,
                *meta_values]

    return _write_csv(path, BENCH_CSV_COLUMNS, (line(r) for r in rows))


BARRIER_CSV_COLUMNS = ("variant", "where", "ranks", "status", "reason", "median_us", "p10_us", "p90_us",
                       "min_us", "max_us", "spread_pct", "samples") + BENCH_META_COLUMNS


def write_barrier_csv(path: str | Path, rows: Iterable[BarrierRow], *, meta: dict[str, Any]) -> Path:
    meta_values = [meta.get(k, "") for k in BENCH_META_COLUMNS]
    row_columns = BARRIER_CSV_COLUMNS[:-len(BENCH_META_COLUMNS)]
    return _write_csv(path, BARRIER_CSV_COLUMNS,
                      ([r.to_dict()[c] for c in row_columns] + meta_values for r in rows))


def read_csv(path: str | Path) -> list[dict[str, str]]:
    with Path(path).open(newline="") as f:
        return list(csv.DictReader(f))


def ok_rows(rows: Sequence[Row]) -> list[Row]:
    return [r for r in rows if r.ok]
