"""A stand-in for ``sollat.Communicator`` on CPU (injected through
``sollat.integrations.core.set_communicator_factory``): it really reduces, in rank order 0..R-1
in float64 over the group's gloo group, with one rounding, so that a call routed to the wrong group
or not reduced at all gives a wrong result; and it records every call."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

DOUBLES: list[RankOrderDouble] = []


class RankOrderDouble:
    def __init__(self, group: Any, device: torch.device, batch_invariant: bool) -> None:
        self.group = group
        self.device = torch.device(device)
        self.batch_invariant = batch_invariant
        self.world_size = dist.get_world_size(group)
        self.calls: list[tuple[Any, ...]] = []
        DOUBLES.append(self)

    def _sum(self, x: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        acc = parts[0].to(torch.float64)
        for p in parts[1:]:  # rank order
            acc = acc + p.to(torch.float64)
        return acc

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", algo: str = "auto", *,
                   out: torch.Tensor | None = None) -> torch.Tensor:
        self.calls.append(("all_reduce", tuple(tensor.shape), str(tensor.dtype)))
        return self._sum(tensor).to(tensor.dtype)

    def all_reduce_rmsnorm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                           algo: str = "auto", *, fp8_scale: torch.Tensor | None = None,
                           **kwargs: Any) -> tuple[torch.Tensor, ...]:
        self.calls.append(("all_reduce_rmsnorm", tuple(x.shape), str(x.dtype), fp8_scale is not None))
        r = (self._sum(x) + residual.to(torch.float64)).to(x.dtype)  # sollat/collectives/rmsnorm.py's arithmetic
        rf = r.float()
        y = (rf * torch.rsqrt(rf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)
        if fp8_scale is None:
            return y, r
        q = (y.float() / fp8_scale.reshape(())).clamp(-448, 448).to(torch.float8_e4m3fn)
        return y, r, q


def counts(kind: str) -> int:
    return sum(1 for d in DOUBLES for c in d.calls if c[0] == kind)

