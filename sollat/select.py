"""Automatic algorithm selection: tuning tables as data.

A table is keyed by (GPU model, world size) and maps message size to an algorithm; above its
last rule the communicator falls back to NCCL (``torch.distributed.all_reduce``), where sollat
would lose. ``python -m sollat tune`` measures the present machine and writes a table to the user
cache; built-in tables ship in ``sollat/tuning/*.json``, each with a note of the measurement
behind it. Nothing in the docstrings restates thresholds: the tables are the truth.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from . import algorithms
from .errors import UnsupportedError

NCCL = "nccl"
TUNING_DIR = Path(__file__).parent / "tuning"


@dataclass(frozen=True)
class Rule:
    max_bytes: int  # the rule applies to messages of at most this many bytes
    algorithm: str  # a sollat algorithm name, or "nccl"


@dataclass(frozen=True)
class Table:
    gpu: str  # e.g. "NVIDIA H200", or "generic"
    world_size: int  # 0 = any
    rules: tuple[Rule, ...]
    note: str = ""
    source: str = field(default="builtin", compare=False)

    def to_json(self) -> str:
        d = asdict(self)
        d.pop("source")
        return json.dumps(d, indent=2)

    @staticmethod
    def from_dict(d: dict, source: str) -> Table:
        rules = tuple(Rule(int(r["max_bytes"]), str(r["algorithm"])) for r in d["rules"])
        for r in rules:
            if r.algorithm != NCCL:
                algorithms.get(r.algorithm)
        if list(rules) != sorted(rules, key=lambda r: r.max_bytes):
            raise ValueError(f"{source}: rules must be sorted by max_bytes")
        return Table(str(d["gpu"]), int(d["world_size"]), rules, str(d.get("note", "")), source)


def user_table_dir() -> Path:
    root = os.environ.get("SOLLAT_CACHE_DIR")
    return (Path(root) if root else Path.home() / ".cache" / "sollat") / "tuning"


def _load_dir(path: Path) -> list[Table]:
    tables = []
    if path.is_dir():
        for f in sorted(path.glob("*.json")):
            tables.append(Table.from_dict(json.loads(f.read_text()), str(f)))
    return tables


def find_table(gpu: str, world_size: int) -> Table:
    """User-tuned table for (gpu, world size) if any, else the built-in one, else the generic one."""
    for source in (_load_dir(user_table_dir()), _load_dir(TUNING_DIR)):
        exact = [t for t in source if t.gpu == gpu and t.world_size == world_size]
        if exact:
            return exact[0]
    for source in (_load_dir(TUNING_DIR),):
        anyws = [t for t in source if t.gpu == gpu and t.world_size == 0]
        if anyws:
            return anyws[0]
    generic = [t for t in _load_dir(TUNING_DIR) if t.gpu == "generic"]
    if not generic:
        raise RuntimeError("sollat: no built-in tuning table found (sollat/tuning/generic.json missing)")
    return generic[0]


def choose(table: Table, nbytes: int, dtype: torch.dtype, op: str, *, deterministic: bool,
           nccl_available: bool, available: tuple[str, ...]) -> str:
    """Algorithm for one call. Skips rules whose algorithm cannot serve (dtype, op, determinism)
    and moves on to the next one that can; past the last rule, NCCL if present, else the last
    sollat algorithm that can serve."""
    last_ok: str | None = None
    for rule in table.rules:
        if rule.algorithm == NCCL:
            if nbytes <= rule.max_bytes and nccl_available:
                return NCCL
            continue
        if rule.algorithm not in available:
            continue
        alg = algorithms.get(rule.algorithm)
        if dtype not in alg.dtypes or op not in alg.ops or (deterministic and not alg.deterministic):
            continue
        last_ok = rule.algorithm
        if nbytes <= rule.max_bytes:
            return rule.algorithm
    if nccl_available:
        return NCCL
    if last_ok is not None:
        return last_ok
    for name in available:
        alg = algorithms.get(name)
        if dtype in alg.dtypes and op in alg.ops and (alg.deterministic or not deterministic):
            return name
    raise UnsupportedError(f"all_reduce: no algorithm serves dtype {dtype}, op {op!r}")
