"""The rule of sollat's engine plugins: which calls sollat serves (pure functions of the call and
of values the ranks have agreed on, ``core.GroupAdapter.ensure``).

The rule (``all_reduce_refusal``, ``rmsnorm_refusal``, ``domain_refusal``):

* the group's sollat communicator exists: constructed collectively, lazily, on every rank of the
  group (world size 2..72, every rank on one host, and the construction succeeded on every rank:
  symmetric memory mapped every peer's scratch; agreed through the process group's store with a
  timeout, so that no rank routes to sollat while another routes to the engine, and no rank
  waits on a peer that failed);
* the tensor lies on the communicator's device, is contiguous, has 1 .. ``MAX_ELEMENTS`` elements
  and a dtype sollat reduces (float32, bfloat16, float16, float64; the fused RMSNorm: the first
  three, a weight ``[hidden]`` of x's dtype, a residual of x's shape and dtype, hidden <= 65536,
  the FP8 scale one float32 element on the device);
* outside batch-invariant mode, the message (x) is at most the engine limit
  (``$SOLLAT_ENGINE_MAX_BYTES``, ``settings.py``), and at most the size above which the
  communicator's table picks an algorithm the engine's communicator leaves out
  (``GroupAdapter.own_limit``). In batch-invariant mode there is no size limit: a threshold would
  send one row through two implementations at two batch sizes, which that mode forbids (sollat
  cuts a large message into passes over the same scratch).

Everything else goes to the engine's path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..collectives.rmsnorm import DTYPES_SUPPORTED as RMSNORM_DTYPES
from ..collectives.rmsnorm import MAX_HIDDEN
from ..comm.base import MAX_ELEMENTS
from ..device.dtypes import DTYPES
from ..device.layout import MAX_RANKS
from .settings import MAX_BYTES_ENV

__all__ = ["ALL_REDUCE_DTYPES", "MIN_WORLD_SIZE", "all_reduce_refusal", "domain_refusal", "rmsnorm_refusal"]

ALL_REDUCE_DTYPES: tuple[torch.dtype, ...] = tuple(DTYPES)
MIN_WORLD_SIZE = 2


# ---- the rule -----------------------------------------------------------------------------------
def all_reduce_refusal(x: Any, device: torch.device | None, max_bytes: int | None = None) -> str | None:
    """``None`` when a sum all-reduce of ``x`` is sollat's to serve on a communicator on ``device``
    (``None``: no communicator) with the engine limit ``max_bytes`` (``None``: none), else why not
    (the engine serves it)."""
    if device is None:
        return "no sollat communicator"
    if not isinstance(x, torch.Tensor):
        return f"not a tensor ({type(x).__name__})"
    if x.device != device:
        return f"on {x.device}, the communicator is on {device}"
    if x.dtype not in DTYPES:
        return f"dtype {x.dtype}"
    n = x.numel()
    if n == 0:
        return "empty"
    if n > MAX_ELEMENTS:
        return f"{n} elements > {MAX_ELEMENTS}"
    if not x.is_contiguous():
        return "not contiguous"
    if max_bytes is not None and n * x.element_size() > max_bytes:
        return f"{n * x.element_size()} bytes > {MAX_BYTES_ENV} ({max_bytes})"
    return None


def rmsnorm_refusal(x: Any, residual: Any, weight: Any, device: torch.device | None,
                    fp8_scale: Any = None, max_bytes: int | None = None) -> str | None:
    """``None`` when AllReduce + residual add + RMSNorm (+ the static FP8 copy with ``fp8_scale``)
    is sollat's to serve in one call (``Communicator.all_reduce_rmsnorm``), else why not."""
    why = all_reduce_refusal(x, device, max_bytes)
    if why is not None:
        return why
    if x.dtype not in RMSNORM_DTYPES:
        return f"dtype {x.dtype} (the fused RMSNorm takes float32, bfloat16, float16)"
    if x.dim() < 1 or x.shape[-1] > MAX_HIDDEN:
        return f"hidden {x.shape[-1] if x.dim() else 0} > {MAX_HIDDEN}" if x.dim() else "a 0-d tensor"
    if (not isinstance(residual, torch.Tensor) or residual.shape != x.shape or residual.dtype != x.dtype
            or residual.device != x.device or not residual.is_contiguous()):
        return "residual is not a contiguous tensor of x's shape, dtype and device"
    if (not isinstance(weight, torch.Tensor) or tuple(weight.shape) != (x.shape[-1],) or weight.dtype != x.dtype
            or weight.device != x.device):
        return "weight is not [hidden] of x's dtype and device"
    if fp8_scale is not None and (not isinstance(fp8_scale, torch.Tensor) or fp8_scale.dtype != torch.float32
                                  or fp8_scale.numel() != 1 or fp8_scale.device != x.device):
        return "fp8 scale is not one float32 element on x's device"
    return None


def domain_refusal(world_size: int, hosts: Sequence[str]) -> str | None:
    """``None`` when a group of ``world_size`` ranks on ``hosts`` (one entry per rank) can be one
    sollat communicator: 2..72 ranks on one host (one NVLink domain; whether every peer's memory
    can really be mapped is what the construction itself finds out)."""
    if not MIN_WORLD_SIZE <= world_size <= MAX_RANKS:
        return f"world size {world_size} (sollat serves {MIN_WORLD_SIZE}..{MAX_RANKS} ranks)"
    if len(set(hosts)) > 1:
        return f"the group spans hosts {sorted(set(hosts))} (sollat serves one host's GPUs)"
    return None
