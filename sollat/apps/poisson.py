"""Conjugate gradients on the 3-D Poisson equation, rows split across ranks by z-slabs.

The operator is the 7-point Laplacian on an ``n x n x n`` grid with zero Dirichlet boundaries,
``(A u)[z,y,x] = 6 u[z,y,x] - (the six neighbours)``, symmetric positive definite. Rank r owns the
z-planes ``split_planes(n, R)[r]`` of every vector; a matrix-vector product needs one plane of
``p`` from each neighbouring rank (the halo), and each iteration has two dot products, each an
AllReduce of ``nrhs`` numbers (8 bytes each in fp64) on the critical path:

    Ap = A p                     (after the halo exchange of p)
    alpha = (r.r) / (p.Ap)       AllReduce 1
    x += alpha p;  r -= alpha Ap
    beta = (r.r)_new / (r.r)     AllReduce 2
    p = r + beta p

``nrhs`` independent systems are solved together (one AllReduce carries all their dot products).
The right-hand side is ``b = A u*`` for a random ``u*`` generated plane by plane from seeds, so the
problem is the same for every rank count and the error ``|x - u*| / |u*|`` can be reported.

Elementwise updates give the same bits on every decomposition; only the dot products are summed in a
different order, so residual histories of different rank counts agree to rounding, not bitwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .backend_base import AllReduceBackend
from .llama import block_seed, seeded_randn


def split_planes(n: int, world_size: int) -> list[tuple[int, int]]:
    """``[z0, z1)`` of each rank: ``n`` planes split as evenly as possible, the larger slabs first."""
    if world_size < 1 or n < world_size:
        raise ValueError(f"cannot split {n} planes over {world_size} ranks (need 1 <= ranks <= n)")
    base, extra = divmod(n, world_size)
    out, z = [], 0
    for r in range(world_size):
        size = base + (1 if r < extra else 0)
        out.append((z, z + size))
        z += size
    return out


def exact_planes(n: int, nrhs: int, z0: int, z1: int, *, seed: int, device: torch.device,
                 dtype: torch.dtype) -> torch.Tensor:
    """``u*`` on planes ``z0-1 .. z1`` (zero outside ``0..n-1``), padded in y and x: ``[nrhs, z1-z0+2, n+2, n+2]``."""
    out = torch.zeros(nrhs, z1 - z0 + 2, n + 2, n + 2, device=device, dtype=dtype)
    for j, z in enumerate(range(z0 - 1, z1 + 1)):
        if 0 <= z < n:
            out[:, j, 1:-1, 1:-1].copy_(seeded_randn((nrhs, n, n), block_seed(seed, "u*", z), device=device))
    return out


def stencil(padded: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out = A u`` for the interior of ``padded [k, nz+2, n+2, n+2]`` (halo planes and zero pads filled)."""
    c = padded[:, 1:-1, 1:-1, 1:-1]
    torch.mul(c, 6.0, out=out)
    out.sub_(padded[:, :-2, 1:-1, 1:-1]).sub_(padded[:, 2:, 1:-1, 1:-1])
    out.sub_(padded[:, 1:-1, :-2, 1:-1]).sub_(padded[:, 1:-1, 2:, 1:-1])
    out.sub_(padded[:, 1:-1, 1:-1, :-2]).sub_(padded[:, 1:-1, 1:-1, 2:])
    return out


def local_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-system dot product of this rank's part: ``[k, ...] x [k, ...] -> [k]``."""
    return (a * b).sum(dim=(1, 2, 3))


class Halo:
    """Fills the halo planes (index 0 and -1 along z) of each local rank's padded ``p``."""

    def exchange(self, padded: list[torch.Tensor]) -> None:
        raise NotImplementedError


class VirtualHalo(Halo):
    """All ranks in this process: copy the neighbours' boundary planes."""

    def exchange(self, padded: list[torch.Tensor]) -> None:
        for i, p in enumerate(padded):
            if i > 0:
                p[:, 0].copy_(padded[i - 1][:, -2])
            if i + 1 < len(padded):
                p[:, -1].copy_(padded[i + 1][:, 1])


class DistHalo(Halo):
    """One rank per process: NCCL point-to-point (``p2p``) or an all-gather of boundary planes.

    ``p2p`` sends one plane to each neighbour (``batch_isend_irecv``); ``allgather`` moves R times
    more data but uses only a collective. Both run on NCCL whatever the AllReduce backend is.
    """

    def __init__(self, mode: str, rank: int, world_size: int, plane: Sequence[int], *,
                 device: torch.device, dtype: torch.dtype, group: Any = None) -> None:
        if mode not in ("p2p", "allgather"):
            raise ValueError(f"halo mode {mode!r}: expected p2p or allgather")
        self.mode, self.rank, self.world_size, self.group = mode, rank, world_size, group

        def buf(*lead: int) -> torch.Tensor:
            return torch.empty(*lead, *plane, device=device, dtype=dtype)

        self.send = buf(2)  # [0] = my first plane (to rank - 1), [1] = my last plane (to rank + 1)
        self.recv = buf(2)  # [0] = from rank - 1, [1] = from rank + 1
        self.gathered = buf(world_size, 2) if mode == "allgather" else None

    def exchange(self, padded: list[torch.Tensor]) -> None:
        import torch.distributed as dist

        (p,) = padded
        lo, hi = self.rank > 0, self.rank + 1 < self.world_size
        self.send[0].copy_(p[:, 1])
        self.send[1].copy_(p[:, -2])
        if self.gathered is not None:
            dist.all_gather_into_tensor(self.gathered, self.send, group=self.group)
            if lo:
                p[:, 0].copy_(self.gathered[self.rank - 1, 1])
            if hi:
                p[:, -1].copy_(self.gathered[self.rank + 1, 0])
            return
        ops = []
        if lo:
            ops += [dist.P2POp(dist.isend, self.send[0], self.rank - 1, self.group),
                    dist.P2POp(dist.irecv, self.recv[0], self.rank - 1, self.group)]
        if hi:
            ops += [dist.P2POp(dist.isend, self.send[1], self.rank + 1, self.group),
                    dist.P2POp(dist.irecv, self.recv[1], self.rank + 1, self.group)]
        if ops:
            for req in dist.batch_isend_irecv(ops):
                req.wait()
        if lo:
            p[:, 0].copy_(self.recv[0])
        if hi:
            p[:, -1].copy_(self.recv[1])


@dataclass
class RankState:
    """One rank's vectors: ``p`` padded ``[k, nz+2, n+2, n+2]``; the others ``[k, nz, n, n]``."""

    b: torch.Tensor
    x: torch.Tensor
    r: torch.Tensor
    padded_p: torch.Tensor
    ap: torch.Tensor
    exact: torch.Tensor
    rr: torch.Tensor  # [k], global r.r (the same on every rank)

    @property
    def p(self) -> torch.Tensor:
        return self.padded_p[:, 1:-1, 1:-1, 1:-1]


class PoissonCG:
    """CG state of the local ranks ``ranks`` of a ``world_size``-rank decomposition.

    ``iterate(backend)`` does one CG iteration with static shapes and no host reads, so it can be
    captured in a CUDA graph; it appends the new global ``r.r`` to ``history`` at ``it``.
    """

    def __init__(self, n: int, nrhs: int, *, world_size: int, ranks: Sequence[int], device: torch.device | str,
                 dtype: torch.dtype, seed: int = 0, capacity: int = 10000, halo: Halo | None = None) -> None:
        if n < 2 or nrhs < 1:
            raise ValueError(f"need n >= 2 and nrhs >= 1 (got {n}, {nrhs})")
        self.n, self.nrhs, self.world_size = n, nrhs, world_size
        self.ranks = tuple(ranks)
        self.device = torch.device(device)
        self.dtype = dtype
        self.slabs = split_planes(n, world_size)
        self.halo = halo if halo is not None else VirtualHalo()
        self.states: list[RankState] = []
        for r in self.ranks:
            z0, z1 = self.slabs[r]
            u = exact_planes(n, nrhs, z0, z1, seed=seed, device=self.device, dtype=dtype)
            b = stencil(u, torch.empty(nrhs, z1 - z0, n, n, device=self.device, dtype=dtype))
            self.states.append(RankState(
                b=b, x=torch.zeros_like(b), r=torch.zeros_like(b), ap=torch.zeros_like(b),
                padded_p=torch.zeros(nrhs, z1 - z0 + 2, n + 2, n + 2, device=self.device, dtype=dtype),
                exact=u[:, 1:-1, 1:-1, 1:-1].clone(), rr=torch.zeros(nrhs, device=self.device, dtype=dtype)))
        self.capacity = capacity
        self.history = torch.zeros(capacity, nrhs, device=self.device, dtype=dtype)
        self.it = torch.zeros(1, dtype=torch.long, device=self.device)
        self.rr0 = torch.zeros(nrhs, device=self.device, dtype=dtype)

    def reset(self, backend: AllReduceBackend) -> None:
        """``x = 0, r = p = b``; ``r.r`` through ``backend`` (eagerly)."""
        for s in self.states:
            s.x.zero_()
            s.r.copy_(s.b)
            s.padded_p.zero_()
            s.p.copy_(s.b)
        rr = backend.all_reduce([local_dot(s.r, s.r) for s in self.states])
        for s, v in zip(self.states, rr, strict=True):
            s.rr.copy_(v)
        self.rr0.copy_(self.states[0].rr)
        self.history.zero_()
        self.it.zero_()

    def iterate(self, backend: AllReduceBackend) -> None:
        states = self.states
        self.halo.exchange([s.padded_p for s in states])
        pap = backend.all_reduce([local_dot(s.p, stencil(s.padded_p, s.ap)) for s in states])
        for s, d in zip(states, pap, strict=True):
            alpha = torch.where(d > 0, s.rr / d, torch.zeros_like(d)).view(-1, 1, 1, 1)
            s.x.add_(alpha * s.p)
            s.r.sub_(alpha * s.ap)
        rr_new = backend.all_reduce([local_dot(s.r, s.r) for s in states])
        for s, d in zip(states, rr_new, strict=True):
            beta = torch.where(s.rr > 0, d / s.rr, torch.zeros_like(d)).view(-1, 1, 1, 1)
            s.p.mul_(beta).add_(s.r)
            s.rr.copy_(d)
        self.history.index_copy_(0, self.it, states[0].rr.unsqueeze(0))
        self.it.add_(1)

    def global_sums(self, backend: AllReduceBackend, local: Sequence[torch.Tensor]) -> torch.Tensor:
        return backend.all_reduce(list(local))[0]

    def relative_error(self, backend: AllReduceBackend) -> torch.Tensor:
        """``|x - u*| / |u*|`` per system (eager AllReduces through ``backend``)."""
        err = self.global_sums(backend, [local_dot(s.x - s.exact, s.x - s.exact) for s in self.states])
        ref = self.global_sums(backend, [local_dot(s.exact, s.exact) for s in self.states])
        return (err / ref).sqrt()
