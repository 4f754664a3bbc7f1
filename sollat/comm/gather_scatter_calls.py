"""The built-in AllGather and ReduceScatter on a communicator (``sollat.gather_scatter`` has the
shape rules, the size rule and the references): the checks of a call's arguments, its output
tensor, and which path serves it. ``api.py``'s ``all_gather`` / ``reduce_scatter`` call these
in that order, then plan and launch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..collectives import gather_scatter
from ..collectives.select import NCCL
from ..device.dtypes import DTYPES, OPS, DType
from ..errors import UnsupportedError
from .checks import collective_out, collective_tensor


def check_args(kind: str, op: str, algo: str, *, real: bool, batch_invariant: bool) -> None:
    """The call's op and algo (before any tensor is looked at), on real ranks (``real``) or
    virtual ones, of a batch-invariant communicator or not."""
    if kind == "reduce_scatter" and op not in OPS:
        raise UnsupportedError(f"reduce_scatter: op {op!r} is not supported; supported ops: {', '.join(OPS)}")
    if not isinstance(algo, str) or algo not in gather_scatter.ALGOS:
        raise UnsupportedError(f"{kind}: algo must be one of {', '.join(gather_scatter.ALGOS)}, got {algo!r}")
    if algo == NCCL and not real:
        raise UnsupportedError(f"{kind}: algo='nccl' needs a process group (Communicator), not a VirtualCommunicator")
    if algo == NCCL and kind == "reduce_scatter" and batch_invariant:
        raise UnsupportedError("reduce_scatter: algo='nccl' hands the call to torch.distributed, whose reduction "
                               "order is not fixed; this communicator is batch-invariant (batch_invariant=True or "
                               "SOLLAT_BATCH_INVARIANT=1): use 'auto', 'll' or 'sentinel'")


def dtype_of(kind: str) -> Callable[[torch.dtype, str], DType]:
    """The dtype rule of ``kind``'s tensors: every dtype sollat moves."""
    def check(d: torch.dtype, what: str) -> DType:
        dt = DTYPES.get(d)
        if dt is None:
            ok = ", ".join(str(t).replace("torch.", "") for t in DTYPES)
            raise UnsupportedError(f"{kind}: {what} has dtype {d}; supported: {ok}")
        return dt

    return check


def check_tensor(kind: str, x: Any, what: str, device: torch.device) -> DType:
    """An input of ``kind`` on ``device``."""
    return collective_tensor(kind, x, what, device, dtype_of(kind))


def out_tensor(kind: str, x: torch.Tensor, out: Any, what: str, world_size: int, device: torch.device) -> torch.Tensor:
    """``out`` checked (or a new tensor): contiguous, on ``device``, the input's dtype, the call's
    output shape (all_gather also takes the concatenated shape)."""
    if kind == "all_gather":
        return collective_out(kind, x, out, what, device, gather_scatter.gather_shape(x.shape, world_size),
                              dtype_of(kind), lambda shape: gather_scatter.gather_out_ok(shape, x.shape, world_size))
    return collective_out(kind, x, out, what, device, gather_scatter.scatter_shape(x.shape, world_size),
                          dtype_of(kind))


def into(kind: str, y: torch.Tensor, out: Any, x: torch.Tensor, what: str, world_size: int,
         device: torch.device) -> torch.Tensor:
    """Under torch.compile: the custom op's new ``y``, copied into ``out`` when one is given
    (checked like an eager ``out``; the compiler may turn the copy back into a direct write)."""
    if out is None:
        return y
    out_tensor(kind, x, out, what, world_size, device)
    return out.copy_(y.reshape(out.shape))


def no_overlap(kind: str, ins: list[torch.Tensor], out: torch.Tensor, what: str) -> None:
    """Other threads (and, on virtual ranks, other ranks) write ``out`` while inputs are read."""
    o0, o1 = out.data_ptr(), out.data_ptr() + out.numel() * out.element_size()
    for x in ins:
        x0 = x.data_ptr()
        if out.numel() and x.numel() and o0 < x0 + x.numel() * x.element_size() and x0 < o1:
            raise UnsupportedError(f"{kind}: {what} overlaps an input or another output; each output must be a separate tensor")


def resolve(kind: str, algo: str, nbytes_per_peer: int, *, real: bool, enabled: bool, batch_invariant: bool) -> str:
    """The algorithm of one call, or ``"nccl"``: ``gather_scatter.resolve``'s choice, except that
    a batch-invariant communicator keeps a ReduceScatter on sollat's kernels where ``auto`` would
    hand it to torch.distributed (above the size rule: the sentinel, which serves every size in
    passes), or raises where it has no scratch for them (``enabled`` False)."""
    name = gather_scatter.resolve(kind, algo, nbytes_per_peer, library=real, enabled=enabled)
    if name == NCCL and kind == "reduce_scatter" and batch_invariant:
        if not enabled:
            raise UnsupportedError("reduce_scatter: this communicator is batch-invariant, which needs sollat's "
                                   "rank-order ReduceScatter, but it was constructed with gather_scatter=False (no "
                                   "scratch for it); construct it with gather_scatter=True")
        name = gather_scatter.resolve("reduce_scatter", "sentinel", nbytes_per_peer, library=real, enabled=True)
    return name
