"""``all_reduce_rmsnorm(algo="auto")``'s rule as data: which algorithm serves a call of ``rows`` rows
of ``row_bytes`` bytes each. It lives in the tuning tables beside the AllReduce's rules (the key
``"rmsnorm"`` of a table file, ``select.Table.rmsnorm``), so a table measured on some machine, world
size and mode carries both; ``derive`` regenerates it from scripts/rmsnorm_bench.py's JSON
(``python3 scripts/rmsnorm_bench.py --rules-from rmsnorm-bench.json --write-tables DIR``). A table
without it gets ``rules_for``'s: ``DEFAULT`` on real ranks, ``builtin(world_size)`` on virtual ones.

A table's ``"rmsnorm"``: ``{"rules": [{"max_rows": R, "max_row_bytes": B, "algorithm": A}, ...],
"note": "..."}``. The first rule with ``rows <= R`` and ``row_bytes <= B`` names the algorithm;
past every rule it is ``unfused``. ``A``: ``unfused`` (sollat's AllReduce, then the one-GPU
epilogue), ``oneshot_ll`` or ``oneshot_sentinel`` (a fused kernel), or ``fused`` (the fused one-shot
that the AllReduce table names for the call's bytes). Every algorithm computes the same bits
(docs/design.md, "Arithmetic and batch invariance"), so the rule decides speed only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import table_schema
from .table_schema import spec

FUSED = "fused"
UNFUSED = "unfused"
ALGORITHMS: tuple[str, ...] = (FUSED, UNFUSED, "oneshot_ll", "oneshot_sentinel")
ANY_ROW_BYTES = 1 << 62  # a rule's max_row_bytes that every row meets


# The file format is these dataclasses' fields (table_schema: types, bounds, values).
@dataclass(frozen=True)
class Rule:
    max_rows: int = field(metadata=spec(minimum=1))  # calls of at most this many rows
    max_row_bytes: int = field(metadata=spec(minimum=1))  # ... of at most this many bytes per row (x's dtype)
    algorithm: str = field(metadata=spec(choices=ALGORITHMS))


@dataclass(frozen=True)
class Rules:
    rules: tuple[Rule, ...]
    note: str = ""

    def identity(self) -> list[dict[str, Any]]:
        """What the choice depends on (the rules, not the note): part of a table's digest."""
        return [{"max_rows": r.max_rows, "max_row_bytes": r.max_row_bytes, "algorithm": r.algorithm}
                for r in self.rules]

    def to_dict(self) -> dict[str, Any]:
        return {"rules": self.identity(), "note": self.note}


# Real ranks: a fused one-shot for one or two rows of 16 KiB or more, unfused otherwise: measured on
# 2 H200s with an epilogue launched once per virtual rank (docs/benchmarks.md, the fused RMSNorm on
# two GPUs). The rule of every real-rank table that has not measured its own.
DEFAULT = Rules((Rule(2, (16 << 10) - 1, UNFUSED), Rule(2, ANY_ROW_BYTES, FUSED)),
                note="built-in default: a fused one-shot for 1-2 rows of >= 16 KiB (measured on 2 H200s)")

# Virtual ranks on a card without its own rule (``builtin``): what every rank receives, R x rows x
# row bytes, decides. Derived from the virtual-rank sweeps of one H100 and one H200 (R = 2, 4, 8;
# hidden 4096, 5120, 8192; bf16; docs/design.md, the fused op's ``auto``): up to 256 KiB received
# a fused one-shot beats unfused on both cards (0.77-0.96x; two cells tie on the H200); above it
# rows of at most 8 KiB still do up to 512 KiB and 16 rows, wider ones mostly lose. LL is the faster
# one-shot up to 128 KiB (160 KiB for at most 4 rows), the sentinel one above.
BUILTIN_LL_BYTES = 128 << 10
BUILTIN_LL_FEW_ROWS_BYTES, BUILTIN_FEW_ROWS = 160 << 10, 4
BUILTIN_SENTINEL_BYTES = 256 << 10
BUILTIN_NARROW_ROW_BYTES, BUILTIN_NARROW_BYTES = 8 << 10, 512 << 10
BUILTIN_MAX_ROWS = 16


def builtin(world_size: int) -> Rules:
    """The virtual-rank rule of ``world_size`` ranks on a card without its own: per row count up to
    BUILTIN_MAX_ROWS, ``oneshot_ll`` while R x rows x row bytes is at most BUILTIN_LL_BYTES
    (BUILTIN_LL_FEW_ROWS_BYTES up to BUILTIN_FEW_ROWS rows), ``oneshot_sentinel`` up to
    BUILTIN_SENTINEL_BYTES (BUILTIN_NARROW_BYTES for rows of at most BUILTIN_NARROW_ROW_BYTES),
    ``unfused`` past them."""
    if world_size < 1:
        raise ValueError(f"builtin: world_size must be >= 1, got {world_size}")
    rules: list[Rule] = []
    for rows in range(1, BUILTIN_MAX_ROWS + 1):
        per = world_size * rows  # row bytes -> bytes received
        ll = (BUILTIN_LL_FEW_ROWS_BYTES if rows <= BUILTIN_FEW_ROWS else BUILTIN_LL_BYTES) // per
        sentinel = max(BUILTIN_SENTINEL_BYTES // per, min(BUILTIN_NARROW_ROW_BYTES, BUILTIN_NARROW_BYTES // per))
        if ll >= 1:
            rules.append(Rule(rows, ll, "oneshot_ll"))
        if sentinel > ll:
            rules.append(Rule(rows, sentinel, "oneshot_sentinel"))
    return Rules(tuple(rules), note=f"built-in virtual-rank rule for {world_size} ranks (H100 and H200 sweeps)")


def rules_for(rules: Rules | None, world_size: int, real: bool) -> Rules:
    """The rule ``auto`` follows: a table's own, else DEFAULT on real ranks and ``builtin`` on
    virtual ones."""
    if rules is not None:
        return rules
    return DEFAULT if real else builtin(world_size)


def parse(d: Any, bad: Callable[[str], Exception]) -> Rules:
    """A table's ``"rmsnorm"`` object, checked against ``Rules``; ``bad(what)`` makes the error
    that names the table."""
    return table_schema.load(Rules, d, bad, "rmsnorm")


def choose(rules: Rules | None, rows: int, row_bytes: int, fused: str) -> str:
    """The public algorithm name for a call (``rules`` None: DEFAULT); ``fused``: the one-shot the
    AllReduce table names for the call's bytes (what a ``fused`` rule stands for)."""
    for rule in (DEFAULT if rules is None else rules).rules:
        if rows <= rule.max_rows and row_bytes <= rule.max_row_bytes:
            return fused if rule.algorithm == FUSED else rule.algorithm
    return UNFUSED


def switch_rows(rules: Rules | None, row_bytes: int, most: int) -> set[int]:
    """Row counts (both sides, up to ``most``) at which ``choose`` changes for rows of ``row_bytes``:
    where a batch-invariance test must look."""
    out: set[int] = set()
    prev = choose(rules, 1, row_bytes, FUSED)
    for rows in range(2, most + 1):
        now = choose(rules, rows, row_bytes, FUSED)
        if now != prev:
            out |= {rows - 1, rows}
        prev = now
    return out


# scripts/rmsnorm_bench.py's row names of the algorithms a rule may name.
BENCH_NAMES: dict[str, str] = {"fused_ll": "oneshot_ll", "fused_sentinel": "oneshot_sentinel", "unfused": UNFUSED}
BASELINE = "ar+compiled"  # what auto must not be slower than
MARGIN = 0.03  # a fused kernel is named only where it beats unfused by this fraction at every shape of a cell


def cell_winner(shapes: Iterable[Mapping[str, Any]], margin: float = MARGIN) -> str:
    """The algorithm for one (rows, row bytes) cell from its measured shapes (bench rows: dtypes,
    hidden sizes, with and without the FP8 copy): the one with the smallest worst ratio to
    ``BASELINE`` over the shapes, a fused one only when it beats ``unfused`` by ``margin`` and
    passed its bitwise check at every shape."""
    shapes = list(shapes)

    def worst(name: str) -> float:
        ratios = []
        for s in shapes:
            us = s["us"]
            check = str(s.get("checks", {}).get(BENCH_NAMES[name], "bitwise ok"))
            if name not in us or not check.startswith(("bitwise ok", "ok")):
                return float("inf")
            base = us.get(BASELINE) or 1.0
            ratios.append(us[name] / base)
        return max(ratios) if ratios else float("inf")

    best_unfused = worst(UNFUSED)
    fused = min(("fused_ll", "fused_sentinel"), key=worst)
    return BENCH_NAMES[fused] if worst(fused) < best_unfused * (1.0 - margin) else UNFUSED


def derive(bench_rows: Iterable[Mapping[str, Any]], world_size: int, note: str, margin: float = MARGIN) -> Rules:
    """The rule of one world size from a bench sweep: a grid over the measured row counts and row
    sizes, each cell's ``cell_winner`` for the calls up to that cell (rows in (previous measured,
    this], row bytes likewise); calls past the largest measured rows or row bytes get ``unfused``
    (nothing measured says a fused kernel wins there). Rows sharing one rule list collapse into
    the larger row count's."""
    rows = [r for r in bench_rows if r["ranks"] == world_size]
    if not rows:
        raise ValueError(f"the bench has no rows for {world_size} ranks")
    cells: dict[tuple[int, int], list[Mapping[str, Any]]] = {}
    for r in rows:
        cells.setdefault((int(r["tokens"]), int(r["row_bytes"])), []).append(r)
    row_counts = sorted({t for t, _ in cells})
    widths = sorted({b for _, b in cells})
    groups: list[tuple[int, list[Rule]]] = []
    for t in row_counts:
        group: list[Rule] = []
        for b in widths:
            alg = cell_winner(cells[(t, b)], margin) if (t, b) in cells else UNFUSED
            if group and group[-1].algorithm == alg:
                group[-1] = Rule(t, b, alg)
            else:
                group.append(Rule(t, b, alg))
        groups.append((t, group))
    merged: list[list[Rule]] = []
    for i, (_, group) in enumerate(groups):  # a group equal to the next one is served by it
        if i + 1 < len(groups) and [(g.max_row_bytes, g.algorithm) for g in group] == \
                [(g.max_row_bytes, g.algorithm) for g in groups[i + 1][1]]:
            continue
        merged.append(group)
    flat = [rule for group in merged for rule in group]
    while flat and flat[-1].algorithm == UNFUSED:  # past every rule it is unfused anyway
        flat.pop()
    return Rules(tuple(flat), note)
