"""Shared by the development scripts: one virtual-rank configuration, timed and then checked."""

from __future__ import annotations

import statistics

import torch

import sollat
from sollat.bench.timing import time_calls


def timed_checked_us(r: int, algo: str, dtype: torch.dtype, n: int, dev: torch.device, *, sets: int = 4,
                     calls: int = 100, replays: int = 21, repeats: int = 3,
                     cluster_ranks: bool | None = None) -> float:
    """Median over ``repeats`` of the graph-replay median (``calls`` back-to-back calls on ``sets``
    rotating input sets), then one call on poisoned outputs checked bitwise against the rank-order
    sum (fp32 accumulation, one rounding: what every deterministic sollat sum computes)."""
    c = sollat.VirtualCommunicator(r, dev, algorithms=[algo], cluster_ranks=cluster_ranks)
    ins = [[torch.randn(n, device=dev).to(dtype) for _ in range(r)] for _ in range(sets)]
    outs = [[torch.empty_like(x) for x in s] for s in ins]
    us = [time_calls(lambda i: c.all_reduce(ins[i % sets], algo=algo, out=outs[i % sets]), calls=calls,
                     replays=replays, device=dev).stats.median for _ in range(repeats)]
    ref = ins[0][0].float()
    for x in ins[0][1:]:
        ref = ref + x.float()
    for o in outs[0]:
        o.fill_(float("nan"))
    c.all_reduce(ins[0], algo=algo, out=outs[0])
    c.check()
    if not all(torch.equal(o, ref.to(dtype)) for o in outs[0]):
        raise AssertionError(f"{algo} R={r} {dtype} n={n}: wrong result")
    return statistics.median(us)
