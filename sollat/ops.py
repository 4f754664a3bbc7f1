"""``torch.library`` custom ops, so ``torch.compile`` keeps sollat calls in its graph.

The communicator is referenced by its integer id (sollat/registry.py). Eager calls skip
this layer (the public methods call the implementation directly, which keeps the eager overhead
low); ``torch.compile`` traces through these ops, whose fake implementations only describe the
outputs.
"""

from __future__ import annotations

import torch

from . import gather_scatter as gs
from .registry import lookup_comm


@torch.library.custom_op("sollat::all_reduce", mutates_args=())
def all_reduce(x: torch.Tensor, comm_id: int, op: str, algo: str, deterministic: bool) -> torch.Tensor:
    return lookup_comm(comm_id)._all_reduce_impl(x, op, algo, None, deterministic)  # type: ignore[attr-defined]


@all_reduce.register_fake
def _(x: torch.Tensor, comm_id: int, op: str, algo: str, deterministic: bool) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("sollat::all_reduce_virtual", mutates_args=())
def all_reduce_virtual(xs: list[torch.Tensor], comm_id: int, op: str, algo: str,
                       deterministic: bool) -> list[torch.Tensor]:
    return lookup_comm(comm_id)._all_reduce_impl(xs, op, algo, None, deterministic)  # type: ignore[attr-defined]


@all_reduce_virtual.register_fake
def _(xs: list[torch.Tensor], comm_id: int, op: str, algo: str, deterministic: bool) -> list[torch.Tensor]:
    return [torch.empty_like(x, memory_format=torch.contiguous_format) for x in xs]


@torch.library.custom_op("sollat::all_reduce_rmsnorm", mutates_args=())
def all_reduce_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, comm_id: int, eps: float,
                       algo: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Functional form (new outputs); the public method copies into ``out``/``residual_out``
    when they are given, which the compiler may turn back into in-place writes."""
    return lookup_comm(comm_id)._all_reduce_rmsnorm_impl(x, residual, weight, eps, algo, None, None)  # type: ignore[attr-defined]


@all_reduce_rmsnorm.register_fake
def _(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, comm_id: int, eps: float,
      algo: str) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            torch.empty_like(x, memory_format=torch.contiguous_format))


@torch.library.custom_op("sollat::all_reduce_rmsnorm_virtual", mutates_args=())
def all_reduce_rmsnorm_virtual(xs: list[torch.Tensor], residuals: list[torch.Tensor], weights: list[torch.Tensor],
                               comm_id: int, eps: float, algo: str) -> list[torch.Tensor]:
    """Every rank's output, then every rank's new residual (one list of 2R tensors)."""
    ys, rs = lookup_comm(comm_id)._all_reduce_rmsnorm_impl(xs, residuals, weights, eps, algo, None, None)  # type: ignore[attr-defined]
    return [*ys, *rs]


@all_reduce_rmsnorm_virtual.register_fake
def _(xs: list[torch.Tensor], residuals: list[torch.Tensor], weights: list[torch.Tensor], comm_id: int, eps: float,
      algo: str) -> list[torch.Tensor]:
    return [torch.empty_like(x, memory_format=torch.contiguous_format) for x in [*xs, *xs]]


@torch.library.custom_op("sollat::all_reduce_rmsnorm_fp8", mutates_args=())
def all_reduce_rmsnorm_fp8(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                           comm_id: int, eps: float, algo: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """With the float8_e4m3fn copy of y (``scale``: one float32 element on the device, read by the
    kernel, never on the host): (y, residual_out, q)."""
    y, r, q = lookup_comm(comm_id)._all_reduce_rmsnorm_impl(x, residual, weight, eps, algo, None, None,  # type: ignore[attr-defined]
                                                           scale, None)
    return y, r, q


@all_reduce_rmsnorm_fp8.register_fake
def _(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, comm_id: int, eps: float,
      algo: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            torch.empty_like(x, memory_format=torch.contiguous_format),
            torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device))


@torch.library.custom_op("sollat::all_reduce_rmsnorm_fp8_virtual", mutates_args=())
def all_reduce_rmsnorm_fp8_virtual(xs: list[torch.Tensor], residuals: list[torch.Tensor], weights: list[torch.Tensor],
                                   scales: list[torch.Tensor], comm_id: int, eps: float, algo: str) -> list[torch.Tensor]:
    """Every rank's output, every rank's new residual, then every rank's FP8 copy (3R tensors)."""
    ys, rs, qs = lookup_comm(comm_id)._all_reduce_rmsnorm_impl(xs, residuals, weights, eps, algo, None, None,  # type: ignore[attr-defined]
                                                              scales, None)
    return [*ys, *rs, *qs]


@all_reduce_rmsnorm_fp8_virtual.register_fake
def _(xs: list[torch.Tensor], residuals: list[torch.Tensor], weights: list[torch.Tensor], scales: list[torch.Tensor],
      comm_id: int, eps: float, algo: str) -> list[torch.Tensor]:
    return ([torch.empty_like(x, memory_format=torch.contiguous_format) for x in [*xs, *xs]]
            + [torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device) for x in xs])


def _gs_shape(kind: str, shape: torch.Size, world_size: int) -> tuple[int, ...]:
    return gs.gather_shape(shape, world_size) if kind == "all_gather" else gs.scatter_shape(shape, world_size)


@torch.library.custom_op("sollat::gather_scatter", mutates_args=())
def gather_scatter(x: torch.Tensor, comm_id: int, kind: str, op: str, algo: str) -> torch.Tensor:
    """``all_gather`` (kind "all_gather") or ``reduce_scatter`` of one rank, into a new tensor."""
    return lookup_comm(comm_id)._gs_call(kind, x, None, op, algo)  # type: ignore[attr-defined]


@gather_scatter.register_fake
def _(x: torch.Tensor, comm_id: int, kind: str, op: str, algo: str) -> torch.Tensor:
    return x.new_empty(_gs_shape(kind, x.shape, lookup_comm(comm_id).world_size))  # type: ignore[attr-defined]


@torch.library.custom_op("sollat::gather_scatter_virtual", mutates_args=())
def gather_scatter_virtual(xs: list[torch.Tensor], comm_id: int, kind: str, op: str, algo: str) -> list[torch.Tensor]:
    return lookup_comm(comm_id)._gs_virtual(kind, xs, None, op, algo)  # type: ignore[attr-defined]


@gather_scatter_virtual.register_fake
def _(xs: list[torch.Tensor], comm_id: int, kind: str, op: str, algo: str) -> list[torch.Tensor]:
    ws = lookup_comm(comm_id).world_size  # type: ignore[attr-defined]
    return [x.new_empty(_gs_shape(kind, x.shape, ws)) for x in xs]
