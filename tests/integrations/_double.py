"""A stand-in for ``sollat.Communicator`` on CPU (injected through
``sollat.integrations.core.set_communicator_factory``): it gathers every rank's tensors over the
group's gloo group and computes sollat's own arithmetic on them, the rank-order sum
(``sollat.gather_scatter.rank_order_reduce``: rank 0..R-1, fp32 accumulation for 16-bit types, one
rounding) and the fused AllReduce + residual add + RMSNorm (``sollat.rmsnorm.reference``, and
``fp8_reference`` for the FP8 copy), so a call routed to the wrong group, or not reduced at all,
gives other bits than the workers' references; and it records every call."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from sollat.collectives.gather_scatter import rank_order_reduce
from sollat.collectives.rmsnorm import fp8_reference, reference

DOUBLES: list[RankOrderDouble] = []


class RankOrderDouble:
    def __init__(self, group: Any, device: torch.device, batch_invariant: bool) -> None:
        self.group = group
        self.device = torch.device(device)
        self.batch_invariant = batch_invariant
        self.world_size = dist.get_world_size(group)
        self.calls: list[tuple[Any, ...]] = []
        DOUBLES.append(self)

    def _parts(self, x: torch.Tensor) -> list[torch.Tensor]:
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return parts

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", algo: str = "auto", *,
                   out: torch.Tensor | None = None) -> torch.Tensor:
        self.calls.append(("all_reduce", tuple(tensor.shape), str(tensor.dtype)))
        return rank_order_reduce(self._parts(tensor), op)

    def all_reduce_rmsnorm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                           algo: str = "auto", *, fp8_scale: torch.Tensor | None = None,
                           **kwargs: Any) -> tuple[torch.Tensor, ...]:
        self.calls.append(("all_reduce_rmsnorm", tuple(x.shape), str(x.dtype), fp8_scale is not None))
        y, r = reference(self._parts(x), residual, weight, eps)
        if fp8_scale is None:
            return y, r
        return y, r, fp8_reference(y, fp8_scale)


def counts(kind: str) -> int:
    return sum(1 for d in DOUBLES for c in d.calls if c[0] == kind)
