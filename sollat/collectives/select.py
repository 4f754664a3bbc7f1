"""Automatic algorithm selection: tuning tables as data.

A table maps message size to an algorithm; above its last rule the communicator falls back to
NCCL (``torch.distributed.all_reduce``), where sollat would lose. Besides sollat's kernels a rule
may hand a size range over to a library (``HANDOVERS``): ``"nccl"`` or ``"torch_twoshot"`` (torch
symmetric memory's two-shot, ``sollat.collectives.handover``), where one of those is faster. ``python -m sollat tune``
measures the present machine and writes a table to ``user_table_dir()``; built-in tables ship in
``sollat/collectives/tuning/*.json``, each with a note of the measurement behind it. Nothing in the docstrings
restates thresholds: the tables are the truth.

A table is keyed by (``gpu``, ``world_size``, ``mode``, ``interconnect``):

* ``gpu``: the device name (``"NVIDIA H200"``) or ``"generic"``; ``world_size`` 0 means any.
* ``mode``: ``"real"`` (measured with one process per GPU under torchrun), ``"virtual"`` (R
  ranks on one GPU, ``tune --ranks R``) or ``"any"`` (``generic.json`` only). A table without
  ``mode`` (an older ``tune``) counts as ``"virtual"``.
* ``interconnect``: ``"nvlink"``, ``"pcie"`` or ``"any"`` (``detect_interconnect``).

Precedence in ``find_table(gpu, world_size, mode=..., interconnect=...)``:

1. Only tables that fit are candidates: their gpu is ``gpu`` or ``"generic"``, their world size
   is ``world_size`` or 0, their interconnect is ``interconnect`` or ``"any"``, and their mode is
   the communicator's or ``"any"``. So a real communicator never uses a virtual-rank table (with
   no real table it gets the generic one); a virtual communicator never uses a real one.
2. Among candidates the most specific wins, compared in this order: exact gpu, exact mode,
   exact world size, the user's table over a built-in one, exact interconnect; ties go to the
   first file by name.

Every rank of a communicator must choose the same table, or for one message size one rank runs
NCCL and another sollat and both hang: the communicator all-gathers ``table_digest`` and calls
``agree``. A table that cannot be read or has wrong fields raises ``UnsupportedError`` naming the
file; ``write_table`` replaces a table atomically.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..device import build, environment
from ..errors import SollatError, TableMismatchError, UnsupportedError
from . import algorithms, rmsnorm_rules, table_schema
from .table_schema import spec

NCCL = "nccl"
TORCH_TWOSHOT = "torch_twoshot"
HANDOVERS = (NCCL, TORCH_TWOSHOT)  # library paths a rule may name (real ranks only)
# torch's two-shot in place on a tensor in symmetric memory (Communicator.empty), with no copy in:
# not a table entry; ``auto`` takes it for such calls where it would hand over.
TORCH_TWOSHOT_ZERO_COPY = "torch_twoshot_zero_copy"
LIBRARY_PATHS = (*HANDOVERS, TORCH_TWOSHOT_ZERO_COPY)  # every plan that is a library call, not a kernel
# The paths ``auto`` takes for large messages on ordinary tensors: in place on a tensor in symmetric
# memory, torch's zero-copy two-shot beat each of them on 2 H200s (docs/benchmarks.md, zero copy
# for large messages and the bulk two-shot: 32.6 / 59.4 / 212.0 us at 8 / 16 / 64 MiB fp32 against
# the bulk two-shot's 36.6 / 65.2 / 218.2), so it takes their sizes there
# (Communicator._symmetric_path).
LARGE_MESSAGE_PATHS = (*HANDOVERS, "twoshot_bulk")
# What torch's two_shot_all_reduce_ serves (torch 2.11: float and bfloat16, sum).
TORCH_TWOSHOT_DTYPES = frozenset({torch.float32, torch.bfloat16})
ANY = "any"
GENERIC = "generic"
MODES = ("real", "virtual")
TUNING_DIR = Path(__file__).parent / "tuning"
logger = logging.getLogger("sollat")
_untuned_logged = False  # log_if_untuned has spoken in this process


# A table file is these dataclasses' fields (table_schema: types, bounds, values, the keys a file
# may leave out); from_dict adds what the fields cannot say (every algorithm exists).
@dataclass(frozen=True)
class Rule:
    max_bytes: int = field(metadata=spec(minimum=0))  # the rule applies to messages of at most this many bytes
    algorithm: str = field(metadata=spec(nonempty=True))  # a sollat algorithm name, or one of HANDOVERS


@dataclass(frozen=True)
class Table:
    gpu: str = field(metadata=spec(nonempty=True))  # e.g. "NVIDIA H200", or "generic"
    world_size: int = field(metadata=spec(minimum=0))  # 0 = any
    rules: tuple[Rule, ...] = field(metadata=spec(sorted_by="max_bytes"))
    note: str = ""
    source: str = field(default="builtin", compare=False, metadata=spec(in_file=False))
    # "real", "virtual" or "any"; a file without one was written before tables had modes: virtual
    mode: str = field(default=ANY, metadata=spec(choices=(*MODES, ANY), absent="virtual"))
    interconnect: str = field(default=ANY, metadata=spec(nonempty=True))  # "nvlink", "pcie", ... or "any"
    # all_reduce_rmsnorm's auto rule (rmsnorm_rules; None: not measured, rmsnorm_rules.rules_for's)
    rmsnorm: rmsnorm_rules.Rules | None = None

    def identity(self) -> dict[str, Any]:
        """What selection depends on: the key and the rules (not the notes, not the source)."""
        d = {"gpu": self.gpu, "world_size": self.world_size, "mode": self.mode,
             "interconnect": self.interconnect,
             "rules": [{"max_bytes": r.max_bytes, "algorithm": r.algorithm} for r in self.rules]}
        if self.rmsnorm is not None:  # absent: the digest of a table without one stays what it was
            d["rmsnorm"] = self.rmsnorm.identity()
        return d

    def handover_bytes(self, name: str) -> int:
        """Largest message a rule hands to library path ``name`` (0: none)."""
        return max((r.max_bytes for r in self.rules if r.algorithm == name), default=0)

    def to_json(self) -> str:
        d = {**self.identity(), "note": self.note}
        if self.rmsnorm is not None:
            d["rmsnorm"] = self.rmsnorm.to_dict()
        return json.dumps(d, indent=2)

    @staticmethod
    def from_dict(d: Any, source: str) -> Table:
        """Validate a parsed table; a wrong one raises ``UnsupportedError`` naming ``source``."""
        def bad(what: str) -> UnsupportedError:
            return UnsupportedError(f"sollat: tuning table {source}: {what}")

        table = dataclasses.replace(table_schema.load(Table, d, bad), source=source)
        for i, r in enumerate(table.rules):
            if r.algorithm not in HANDOVERS:
                try:
                    algorithms.get(r.algorithm)
                except UnsupportedError as exc:
                    raise bad(f"'rules[{i}].algorithm': {exc}") from None
        return table


def user_table_dir() -> Path:
    """``$SOLLAT_CACHE_DIR/tuning`` (default ``~/.cache/sollat/tuning``)."""
    return build.cache_root() / "tuning"


def load_table(path: Path) -> Table:
    """One table file; unreadable, not JSON (e.g. truncated) or wrong fields: ``UnsupportedError``."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UnsupportedError(f"sollat: cannot read tuning table {path}: {exc}") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UnsupportedError(f"sollat: tuning table {path} is not valid JSON (truncated or edited?): {exc}. "
                               "Fix or delete it, or re-run `python -m sollat tune`") from None
    table = Table.from_dict(d, str(path))
    if "mode" not in d and path.parent != TUNING_DIR:
        warnings.warn(f"sollat: tuning table {path} has no 'mode' (written by an older `sollat tune`); it counts "
                      "as virtual-rank and never serves a real communicator. Re-run `python -m sollat tune`",
                      RuntimeWarning, stacklevel=3)
    return table


def _load_dir(path: Path) -> list[Table]:
    return [load_table(f) for f in sorted(path.glob("*.json"))] if path.is_dir() else []


def _fits(t: Table, gpu: str, world_size: int, mode: str, interconnect: str) -> bool:
    return (t.gpu in (gpu, GENERIC) and t.world_size in (world_size, 0) and t.mode in (mode, ANY)
            and t.interconnect in (interconnect, ANY))


def find_table(gpu: str, world_size: int, *, mode: str = "real", interconnect: str = ANY) -> Table:
    """The table for a communicator of ``world_size`` ranks on ``gpu``; ``mode`` is ``"real"``
    (one process per GPU; the default, as it never takes a virtual-rank table) or ``"virtual"``.
    Precedence: see the module docstring."""
    if mode not in MODES:
        raise UnsupportedError(f"sollat: find_table mode must be one of {MODES}, got {mode!r}")
    user, builtin = _load_dir(user_table_dir()), _load_dir(TUNING_DIR)
    candidates = [(t, True) for t in user] + [(t, False) for t in builtin]
    fits = [(t, mine) for t, mine in candidates if _fits(t, gpu, world_size, mode, interconnect)]
    if not fits:
        raise SollatError(f"sollat: no tuning table fits ({gpu}, world size {world_size}, {mode}); "
                          f"{TUNING_DIR / 'generic.json'} is missing or was edited")

    def score(c: tuple[Table, bool]) -> tuple[bool, ...]:
        t, mine = c
        return (t.gpu == gpu, t.mode == mode, t.world_size == world_size, mine, t.interconnect == interconnect)

    return max(fits, key=score)[0]  # max keeps the first of equals: file order breaks ties


def log_if_untuned(table: Table, gpu: str, world_size: int, mode: str) -> bool:
    """The first time in this process that a communicator finds no table measured on its card
    (``table`` is the generic one), one INFO line on the ``sollat`` logger says so and how to make
    one. Returns whether it logged."""
    global _untuned_logged
    if _untuned_logged or table.gpu == gpu:
        return False
    _untuned_logged = True
    how = f"python -m sollat tune --ranks {world_size}" if mode == "virtual" else \
        f"torchrun --nproc-per-node {world_size} -m sollat tune"
    logger.info("sollat: no tuning table was measured on %s (%d ranks, %s); algo='auto' follows the built-in rules "
                "(%s). `%s` measures one for this card.", gpu, world_size, mode, table.source, how)
    return True


def table_digest(table: Table) -> str:
    """sha256 (hex) of the table's canonical JSON: key and rules, not note or source. Equal
    digests on every rank mean equal choices for every call."""
    canonical = json.dumps(table.identity(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def agree(digests: Sequence[str], names: Sequence[str]) -> None:
    """Raise ``TableMismatchError`` unless every rank's table digest is the same.
    ``digests[r]`` and ``names[r]`` (its ``source``) are rank r's, as all-gathered."""
    if len(digests) != len(names):
        raise ValueError(f"agree: {len(digests)} digests but {len(names)} names")
    if len(set(digests)) <= 1:
        return
    groups: dict[str, list[int]] = {}
    for rank, d in enumerate(digests):
        groups.setdefault(d, []).append(rank)
    lines = []
    for d, ranks in groups.items():
        who = "rank" if len(ranks) == 1 else "ranks"
        srcs = ", ".join(dict.fromkeys(names[r] for r in ranks))
        lines.append(f"  {who} {', '.join(map(str, ranks))}: {srcs} (digest {d[:12]})")
    raise TableMismatchError(
        "sollat: the ranks chose different algo='auto' tuning tables, so one could run NCCL while another "
        "runs sollat for the same call and both would hang:\n" + "\n".join(lines) +
        "\nGive every rank the same table (copy one file into $SOLLAT_CACHE_DIR/tuning on every host, or "
        "delete the user tables everywhere), or pass algo= explicitly.")


def write_table(table: Table, path: Path) -> Path:
    """Write ``table`` to ``path`` atomically (temporary file in the same directory, fsync,
    ``os.replace``): a reader sees the old table or the new one, never part of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    build.atomic_write(path, (table.to_json() + "\n").encode(), mode=0o644)
    return path


def detect_interconnect(device_index: int) -> str:
    """``$SOLLAT_INTERCONNECT`` if set; else ``"nvlink"`` when NVML reports an active NVLink on the
    device, ``"pcie"`` when it reports none, and ``"any"`` when NVML cannot tell."""
    forced = environment.value("SOLLAT_INTERCONNECT")
    if forced is not None:
        return str(forced)
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda._get_nvml_device_index(device_index))
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                if pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED:
                    return "nvlink"
            except pynvml.NVMLError:
                break  # no NVLink on this device, or past its last link
        return "pcie"
    except Exception:
        return ANY


def handover_serves(name: str, dtype: torch.dtype, op: str, nbytes: int) -> bool:
    """Whether library path ``name`` can reduce ``nbytes`` of this dtype with this op (torch's
    two-shot wants a multiple of 4 bytes: an odd bfloat16 count goes elsewhere)."""
    if name in (TORCH_TWOSHOT, TORCH_TWOSHOT_ZERO_COPY):
        return dtype in TORCH_TWOSHOT_DTYPES and op == "sum" and nbytes % 4 == 0
    return name == NCCL


def own_pick_limit(table: Table, available: Sequence[str], world_size: int) -> int | None:
    """The largest message size up to which ``choose`` over ``available`` picks what it would pick
    with every sollat algorithm enabled: the ``max_bytes`` of the rule before the first rule that
    names a sollat algorithm which runs at ``world_size`` and is not in ``available`` (0 when that
    is the first rule; ``None`` when there is none). Above it a communicator built with fewer
    algorithms (an engine's, for its footprint) would serve a size with a slower fallback."""
    below = 0
    for rule in table.rules:
        if rule.algorithm not in HANDOVERS and rule.algorithm not in available:
            alg = algorithms.ALGORITHMS.get(rule.algorithm)
            if alg is not None and alg.runs_on(world_size):
                return below
        below = max(below, rule.max_bytes)
    return None


def choose(table: Table, nbytes: int, dtype: torch.dtype, op: str, *, deterministic: bool,
           handovers: frozenset[str] | set[str], available: tuple[str, ...], batch_invariant: bool = False) -> str:
    """Algorithm for one call. Skips rules whose algorithm cannot serve (dtype, op, determinism,
    a library path the communicator does not have: ``handovers``) and moves on to the next one
    that can; past the last rule, NCCL if present, else the last sollat algorithm that can serve.
    ``batch_invariant``: as with no ``handovers`` and ``deterministic=True`` (only sollat's
    rank-order algorithms, whose bits do not depend on which of them runs: never a library path,
    never ``ll128``); where none serves, ``UnsupportedError``."""
    if batch_invariant:
        handovers, deterministic = frozenset(), True
    last_ok: str | None = None
    for rule in table.rules:
        if rule.algorithm in HANDOVERS:
            if nbytes <= rule.max_bytes and rule.algorithm in handovers and handover_serves(rule.algorithm, dtype, op, nbytes):
                return rule.algorithm
            continue
        if rule.algorithm not in available:
            continue
        alg = algorithms.get(rule.algorithm)
        if dtype not in alg.dtypes or op not in alg.ops or (deterministic and not alg.deterministic):
            continue
        last_ok = rule.algorithm
        if nbytes <= rule.max_bytes:
            return rule.algorithm
    if NCCL in handovers:
        return NCCL
    if last_ok is not None:
        return last_ok
    for name in available:
        alg = algorithms.get(name)
        if dtype in alg.dtypes and op in alg.ops and (alg.deterministic or not deterministic):
            return name
    raise UnsupportedError(f"all_reduce: no algorithm serves dtype {dtype}, op {op!r}")
