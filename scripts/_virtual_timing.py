"""Shared by the scripts: one virtual-rank configuration, timed and then checked."""

from __future__ import annotations

import statistics

import torch

import sollat
from sollat.bench.virtual import rank_order_sum, rotating_sets, time_rotating


def timed_checked_us(r: int, algo: str, dtype: torch.dtype, n: int, dev: torch.device, *, sets: int = 4,
                     calls: int = 100, replays: int = 21, repeats: int = 3,
                     cluster_ranks: bool | None = None) -> float:
    """Median over ``repeats`` of the graph-replay median (``calls`` back-to-back calls on ``sets``
    rotating input sets), then one call on poisoned outputs checked bitwise against the rank-order
    sum (fp32 accumulation, one rounding: what every deterministic sollat sum computes)."""
    c = sollat.VirtualCommunicator(r, dev, algorithms=[algo], cluster_ranks=cluster_ranks)
    ins, outs = bufs = rotating_sets(r, n, dtype, dev, sets)
    us = [time_rotating(c, algo, bufs, calls=calls, replays=replays, device=dev).stats.median for _ in range(repeats)]
    ref = rank_order_sum(ins[0])
    for o in outs[0]:
        o.fill_(float("nan"))
    c.all_reduce(ins[0], algo=algo, out=outs[0])
    c.check()
    if not all(torch.equal(o, ref) for o in outs[0]):
        raise AssertionError(f"{algo} R={r} {dtype} n={n}: wrong result")
    return statistics.median(us)
