"""Argument checks of the collectives other than ``all_reduce`` (whose own are
``_CommCore._check_common``): a tensor on the communicator's device, of a dtype the call takes,
within ``MAX_ELEMENTS``; an output of the call's shape, or a new one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..device.dtypes import DType
from ..errors import UnsupportedError

MAX_ELEMENTS = 1 << 34


def collective_tensor(opname: str, x: Any, what: str, device: torch.device,
                      dtype_of: Callable[[torch.dtype, str], DType]) -> DType:
    """A tensor argument of a collective other than all_reduce: a tensor on ``device``, of a dtype
    ``dtype_of(dtype, what)`` accepts (it raises a clear error otherwise), within MAX_ELEMENTS."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{opname}: {what} must be a torch.Tensor, got {type(x).__name__}")
    if x.device != device:
        raise UnsupportedError(f"{opname}: {what} is on {x.device}; this communicator is on {device}")
    dt = dtype_of(x.dtype, what)
    if x.numel() > MAX_ELEMENTS:
        raise UnsupportedError(f"{opname}: {what} has {x.numel()} elements; the limit is {MAX_ELEMENTS}")
    return dt


def collective_out(opname: str, x: torch.Tensor, out: Any, what: str, device: torch.device, shape: tuple[int, ...],
                   dtype_of: Callable[[torch.dtype, str], DType],
                   fits: Callable[[tuple[int, ...]], bool] | None = None) -> torch.Tensor:
    """``out`` checked (or a new tensor of ``shape``): contiguous, on ``device``, the input's
    dtype, ``shape`` (or a shape ``fits`` accepts)."""
    if out is None:
        return torch.empty(shape, dtype=x.dtype, device=x.device)
    collective_tensor(opname, out, what, device, dtype_of)
    ok = fits(tuple(out.shape)) if fits is not None else tuple(out.shape) == shape
    if not ok or out.dtype != x.dtype or not out.is_contiguous():
        raise UnsupportedError(f"{opname}: {what} must be a contiguous {x.dtype} tensor of shape {shape}, got "
                               f"{tuple(out.shape)} {out.dtype}{'' if out.is_contiguous() else ' (not contiguous)'}")
    return out
