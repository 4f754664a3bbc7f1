"""Virtual ranks, rotating input sets, timed, then checked: written once for the bench sweep
(``VirtualTarget``), the tuner (``python -m sollat tune``) and the development scripts.

Each input set is R random tensors (one per virtual rank) in the given dtype; each output set
starts as NaN, so an output the kernel never wrote shows. Timing rotates over the sets
(``time_calls`` of ``comm.all_reduce(ins[i % sets], out=outs[i % sets])``), so back-to-back
calls do not read the lines the previous call just wrote.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .timing import GraphTiming, time_calls

Sets = tuple[list[list[Any]], list[list[Any]]]


def rotating_sets(ranks: int, n: int, dtype: Any, device: Any, n_sets: int) -> Sets:
    """``n_sets`` input sets of ``ranks`` random tensors of ``n`` elements, and as many output
    sets filled with NaN."""
    import torch

    ins = [[torch.randn(n, device=device).to(dtype) for _ in range(ranks)] for _ in range(n_sets)]
    outs = [[torch.full((n,), float("nan"), device=device, dtype=dtype) for _ in range(ranks)] for _ in range(n_sets)]
    return ins, outs


def rank_order_sum(inputs: list[Any]) -> Any:
    """The rank-order sum in float32, rounded once to the inputs' dtype (what every deterministic
    sollat sum computes)."""
    ref = inputs[0].float()
    for x in inputs[1:]:
        ref = ref + x.float()
    return ref.to(inputs[0].dtype)


def time_rotating(comm: Any, algo: str, sets: Sets, *, calls: int, replays: int, warmup: int = 2,
                  sync: Callable[[], None] | None = None, device: Any = None) -> GraphTiming:
    """``time_calls`` of ``comm.all_reduce`` rotating over ``sets`` (from ``rotating_sets``)."""
    ins, outs = sets
    k = len(ins)
    return time_calls(lambda i: comm.all_reduce(ins[i % k], op="sum", algo=algo, out=outs[i % k]), calls=calls,
                      replays=replays, warmup=warmup, sync=sync, device=device)
