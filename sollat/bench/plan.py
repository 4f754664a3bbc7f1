"""``bench``'s arguments as a plan: the ``--quick`` defaults applied, the names checked."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from .sizes import DEFAULT_SIZES, QUICK_SIZES, parse_int_list, parse_sizes


@dataclass
class BenchPlan:
    """``bench`` arguments with the ``--quick`` defaults applied."""

    sizes: list[int]
    ranks: list[int]
    dtypes: list[str]
    algos: list[str] | None
    peers: list[Any]
    replays: int
    warmup: int
    max_calls: int
    sol_repeats: int
    barrier_ranks: list[int]
    barrier_iters: int
    barrier_repeats: int
    child_timeout: float
    check: bool


def known_algos() -> list[str]:
    """What ``bench --algos`` accepts: every sollat algorithm, ``auto``, and ``auto_symm`` (auto in
    place on symmetric memory, real ranks only)."""
    from ..collectives.algorithms import ALGORITHMS
    from .sweep import AUTO_SYMM

    return [*ALGORITHMS, "auto", AUTO_SYMM]


def plan_bench(a: argparse.Namespace) -> BenchPlan:
    from .barrier import DEFAULT_RANKS as B_RANKS
    from .barrier import QUICK_RANKS as B_QUICK
    from .peers import select_peers
    from .sweep import DTYPES

    dtypes = []
    for d in a.dtypes.split(","):
        d = d.strip()
        if d not in DTYPES:
            raise ValueError(f"unknown dtype {d!r}; use float32, bfloat16 or float16")
        dtypes.append(DTYPES[d])
    algos = None if a.algos in ("all", "") else [x.strip() for x in a.algos.split(",") if x.strip()]
    known = known_algos()
    unknown = [x for x in algos or () if x not in known]
    if unknown:
        raise ValueError(f"unknown algorithm {unknown[0]!r} in --algos; known: {', '.join(known)} "
                         "(auto_symm: under torchrun only), or all")
    return BenchPlan(
        sizes=parse_sizes(a.sizes or (QUICK_SIZES if a.quick else DEFAULT_SIZES)),
        ranks=parse_int_list(a.ranks),
        dtypes=dtypes,
        algos=algos,
        peers=select_peers(a.peers),
        replays=a.replays or (7 if a.quick else 30),
        warmup=1 if a.quick else 3,
        max_calls=a.calls or (50 if a.quick else 100),
        sol_repeats=5 if a.quick else 9,
        barrier_ranks=B_QUICK if a.quick else B_RANKS,
        barrier_iters=500 if a.quick else 1000,
        barrier_repeats=5 if a.quick else 7,
        child_timeout=a.child_timeout or (150.0 if a.quick else 600.0),
        check=not a.no_check,
    )
