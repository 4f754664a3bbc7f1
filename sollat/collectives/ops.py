"""``torch.library`` custom ops, so ``torch.compile`` keeps sollat calls in its graph.

One op per public collective, for both communicators: its tensors come as lists with one
entry per launch rank (sollat/comm/ranks.py: one on a Communicator, R on a VirtualCommunicator),
and so do its results. The communicator is referenced by its integer id (sollat/collectives/registry.py).
Eager calls skip this layer (the public methods call the implementation directly, which keeps the
eager overhead low); ``torch.compile`` traces through these ops, whose fake implementations only
describe the outputs; their eager bodies run the communicator's checked path (sollat/comm/api.py).
"""

from __future__ import annotations

import torch

from . import gather_scatter as gs
from .registry import lookup_comm


def _like(xs: list[torch.Tensor], copies: int = 1) -> list[torch.Tensor]:
    return [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(copies) for x in xs]


@torch.library.custom_op("sollat::all_reduce", mutates_args=())
def all_reduce(xs: list[torch.Tensor], comm_id: int, op: str, algo: str, deterministic: bool) -> list[torch.Tensor]:
    return lookup_comm(comm_id)._all_reduce_ranks(xs, op, algo, None, deterministic)  # type: ignore[attr-defined]


@all_reduce.register_fake
def _(xs: list[torch.Tensor], comm_id: int, op: str, algo: str, deterministic: bool) -> list[torch.Tensor]:
    return _like(xs)


@torch.library.custom_op("sollat::all_reduce_rmsnorm", mutates_args=())
def all_reduce_rmsnorm(xs: list[torch.Tensor], residuals: list[torch.Tensor], weights: list[torch.Tensor],
                       comm_id: int, eps: float, algo: str) -> list[torch.Tensor]:
    """Functional form (new outputs): every launch rank's output, then every one's new residual;
    the public method copies into ``out``/``residual_out`` when they are given, which the compiler
    may turn back into in-place writes."""
    ys, rs = lookup_comm(comm_id)._all_reduce_rmsnorm_ranks(xs, residuals, weights, eps, algo,  # type: ignore[attr-defined]
                                                           None, None)
    return [*ys, *rs]


@all_reduce_rmsnorm.register_fake
def _(xs: list[torch.Tensor], residuals: list[torch.Tensor], weights: list[torch.Tensor], comm_id: int, eps: float,
      algo: str) -> list[torch.Tensor]:
    return _like(xs, 2)


@torch.library.custom_op("sollat::all_reduce_rmsnorm_fp8", mutates_args=())
def all_reduce_rmsnorm_fp8(xs: list[torch.Tensor], residuals: list[torch.Tensor], weights: list[torch.Tensor],
                           scales: list[torch.Tensor], comm_id: int, eps: float, algo: str) -> list[torch.Tensor]:
    """With the float8_e4m3fn copies of the outputs (``scales``: one float32 element on the device
    each, read by the kernel, never on the host): outputs, new residuals, then the copies."""
    ys, rs, qs = lookup_comm(comm_id)._all_reduce_rmsnorm_ranks(xs, residuals, weights, eps, algo,  # type: ignore[attr-defined]
                                                               None, None, None, scales)
    return [*ys, *rs, *qs]


@all_reduce_rmsnorm_fp8.register_fake
def _(xs: list[torch.Tensor], residuals: list[torch.Tensor], weights: list[torch.Tensor], scales: list[torch.Tensor],
      comm_id: int, eps: float, algo: str) -> list[torch.Tensor]:
    return _like(xs, 2) + [torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device) for x in xs]


@torch.library.custom_op("sollat::gather_scatter", mutates_args=())
def gather_scatter(xs: list[torch.Tensor], comm_id: int, kind: str, op: str, algo: str) -> list[torch.Tensor]:
    """``all_gather`` (kind "all_gather") or ``reduce_scatter``, into new tensors."""
    return lookup_comm(comm_id)._gs_ranks(kind, xs, None, op, algo)  # type: ignore[attr-defined]


@gather_scatter.register_fake
def _(xs: list[torch.Tensor], comm_id: int, kind: str, op: str, algo: str) -> list[torch.Tensor]:
    ws = lookup_comm(comm_id).world_size  # type: ignore[attr-defined]
    shape = gs.gather_shape if kind == "all_gather" else gs.scatter_shape
    return [x.new_empty(shape(x.shape, ws)) for x in xs]
