"""Shared by the eager-cost scripts: the host time of a call, with and without launches."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def host_us(fn: Callable[[], object], iters: int = 20000, runs: int = 5) -> float:
    """µs per call of ``fn`` in a loop of ``iters`` (no synchronisation: for host-only steps), the
    fastest of ``runs`` runs: host noise (other tenants, clock changes) only ever adds time."""
    best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        best = min(best, (time.perf_counter() - t) / iters * 1e6)
    return best


def run_us(fn: Callable[[], object], calls: int, before: Callable[[], object] | None = None) -> float:
    """One eager run: synchronize (and ``before()``, e.g. a barrier between ranks), then ``calls``
    back-to-back calls of ``fn`` and one synchronize; wall time per call in µs."""
    torch.cuda.synchronize()
    if before is not None:
        before()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / calls * 1e6


def eager_us(fn: Callable[[], object], calls: int, runs: int = 5,
             before: Callable[[], object] | None = None) -> float:
    """The fastest of ``runs`` runs (``run_us``) after 50 warm-up calls: host-bound when a call's
    GPU time is shorter than its host time, and host noise only ever adds time."""
    for _ in range(50):
        fn()
    return min(run_us(fn, calls, before) for _ in range(runs))
