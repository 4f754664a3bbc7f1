"""The AllReduce backends the apps run on, without the switch that picks one (``backends.py``).

``AllReduceBackend`` (argument checks, call tracing) and ``CallRecord`` (one traced call), and the
plain backends: the rank-order ``ReferenceBackend``, ``NoOpBackend``, ``NcclBackend`` and sollat's
``SollatVirtualBackend`` / ``SollatDistBackend``. The fused backends (``fused.py``) build on these;
``backends.make_backend`` builds any of them from its spec.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

OPS: tuple[str, ...] = ("sum", "max", "min")


@dataclass(frozen=True)
class CallRecord:
    """One traced AllReduce call: its op, dtype and the message size of one rank in bytes; for a fused
    AllReduce + RMSNorm (``fused.FUSED_OP``) also the row length and eps."""

    op: str
    dtype: torch.dtype
    nbytes: int
    hidden: int = 0
    eps: float = 0.0


class AllReduceBackend:
    """Base class: argument checks and call tracing; subclasses implement ``_all_reduce``."""

    name: str
    world_size: int
    n_local: int  # how many ranks' shards each call takes
    # Reduces in rank order 0..R-1 (16-bit sums accumulated in fp32, rounded once): results are bitwise
    # reproducible, equal on every rank, and equal between any two backends that do so. sollat backends
    # answer per call (rank_order_for), since ``auto`` may pick a nondeterministic algorithm or NCCL.
    rank_order: bool

    def __init__(self, name: str, world_size: int, n_local: int, rank_order: bool) -> None:
        if world_size < 1:
            raise ValueError(f"{name}: world size must be >= 1, got {world_size}")
        self.name = name
        self.world_size = world_size
        self.n_local = n_local
        self.rank_order = rank_order
        self._trace: list[CallRecord] | None = None

    def all_reduce(self, shards: Sequence[torch.Tensor], op: str = "sum") -> list[torch.Tensor]:
        """``all_reduce(shards, op="sum") -> list[Tensor]``: reduce over ranks; entry i is rank i's result."""
        if op not in OPS:
            raise ValueError(f"{self.name}.all_reduce: op {op!r} is not one of {', '.join(OPS)}")
        if len(shards) != self.n_local:
            raise ValueError(f"{self.name}.all_reduce: expected {self.n_local} shard(s), got {len(shards)}")
        first = shards[0]
        for s in shards[1:]:
            if s.shape != first.shape or s.dtype != first.dtype or s.device != first.device:
                raise ValueError(f"{self.name}.all_reduce: shards differ in shape, dtype or device "
                                 f"({tuple(first.shape)} {first.dtype} {first.device} vs "
                                 f"{tuple(s.shape)} {s.dtype} {s.device})")
        if self._trace is not None:
            self._trace.append(CallRecord(op, first.dtype, first.numel() * first.element_size()))
        return self._all_reduce(list(shards), op)

    def _all_reduce(self, shards: list[torch.Tensor], op: str) -> list[torch.Tensor]:
        raise NotImplementedError

    def algorithm_for(self, call: CallRecord) -> str:
        """Name of what runs ``call`` (the sollat algorithm ``auto`` resolves to, or this backend's name)."""
        return self.name

    def rank_order_for(self, calls: Sequence[CallRecord]) -> bool:
        """Whether every one of ``calls`` reduces in rank order (see ``rank_order``)."""
        return self.rank_order

    def replay_call(self, call: CallRecord, device: torch.device) -> Callable[[], None]:
        """A function that makes ``call`` again (same op, dtype and size) on zero buffers of its own:
        one step's AllReduces timed alone."""
        n = call.nbytes // torch.empty((), dtype=call.dtype).element_size()
        bufs = [torch.zeros(n, dtype=call.dtype, device=device) for _ in range(self.n_local)]

        def run() -> None:
            self.all_reduce(bufs, op=call.op)

        return run

    @contextlib.contextmanager
    def tracing(self) -> Iterator[list[CallRecord]]:
        """``with backend.tracing() as calls:`` records every all_reduce made inside the block."""
        previous = self._trace
        calls: list[CallRecord] = []
        self._trace = calls
        try:
            yield calls
        finally:
            self._trace = previous

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} world_size={self.world_size}>"


def rank_order_reduce(shards: Sequence[torch.Tensor], op: str) -> torch.Tensor:
    """Reduce ``shards`` in rank order 0..R-1. Sums of 16-bit types accumulate in fp32 and round once."""
    acc_dtype = torch.float32 if shards[0].dtype in (torch.float16, torch.bfloat16) else shards[0].dtype
    acc = shards[0].to(acc_dtype, copy=True)
    for s in shards[1:]:
        if op == "sum":
            acc.add_(s.to(acc_dtype))
        elif op == "max":
            torch.maximum(acc, s.to(acc_dtype), out=acc)
        else:
            torch.minimum(acc, s.to(acc_dtype), out=acc)
    return acc.to(shards[0].dtype)


class ReferenceBackend(AllReduceBackend):
    """Virtual ranks: the rank-order reduction in plain torch, on whatever device the shards live."""

    def __init__(self, world_size: int, name: str = "reference") -> None:
        super().__init__(name, world_size, world_size, rank_order=True)

    def _all_reduce(self, shards: list[torch.Tensor], op: str) -> list[torch.Tensor]:
        total = rank_order_reduce(shards, op)
        return [total] + [total.clone() for _ in shards[1:]]


class NoOpBackend(AllReduceBackend):
    """Returns its inputs: each rank keeps its own partial. Exact for a world of one."""

    def __init__(self, world_size: int, n_local: int) -> None:
        super().__init__("noop", world_size, n_local, rank_order=world_size == 1)

    def _all_reduce(self, shards: list[torch.Tensor], op: str) -> list[torch.Tensor]:
        return shards


def _sollat_algorithm(algo: str, op: str) -> str:
    """The algorithm to request for ``op``: the forced one, or ``auto`` where it cannot do ``op``.

    LL128 atomic only adds (NVLink's 128-byte atomic add), so a run forcing it still needs the
    selector for the ``max``/``min`` of greedy sampling.
    """
    if algo == "auto":
        return algo
    from sollat.collectives.algorithms import ALGORITHMS

    alg = ALGORITHMS.get(algo)
    if alg is not None and op not in alg.ops:
        return "auto"
    return algo


class _SollatMixin(AllReduceBackend):
    comm: Any
    algo: str

    def _check_algo(self) -> None:
        if self.algo != "auto" and self.algo not in self.comm.algorithms:
            raise ValueError(f"sollat:{self.algo}: unknown algorithm; this communicator has "
                             f"{', '.join(self.comm.algorithms)}")

    def algorithm_for(self, call: CallRecord) -> str:
        algo = _sollat_algorithm(self.algo, call.op)
        select = getattr(self.comm, "selected_algorithm", None)
        if algo == "auto" and select is not None:
            return str(select(call.nbytes, call.dtype, call.op))
        return algo

    def rank_order_for(self, calls: Sequence[CallRecord]) -> bool:
        from sollat.collectives.algorithms import ALGORITHMS

        for call in calls:
            alg = ALGORITHMS.get(self.algorithm_for(call))  # None for "nccl"
            if alg is None or not alg.deterministic:
                return False
        return True


class SollatVirtualBackend(_SollatMixin):
    """All R ranks in this process on one GPU, through ``sollat.VirtualCommunicator`` (one launch per call)."""

    def __init__(self, world_size: int, device: torch.device, algo: str = "auto",
                 comm: Any | None = None) -> None:
        if comm is None:
            import sollat

            comm = sollat.VirtualCommunicator(world_size, device=device)
        label = "sollat" if algo == "auto" else f"sollat:{algo}"
        super().__init__(label, world_size, world_size, rank_order=False)
        self.comm = comm
        self.algo = algo
        self._check_algo()

    def _all_reduce(self, shards: list[torch.Tensor], op: str) -> list[torch.Tensor]:
        return list(self.comm.all_reduce(shards, op=op, algo=_sollat_algorithm(self.algo, op)))


def _dist_op(op: str) -> Any:
    import torch.distributed as dist

    return {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]


class NcclBackend(AllReduceBackend):
    """One process per GPU: ``torch.distributed.all_reduce`` in place on the process group (NCCL)."""

    def __init__(self, group: Any | None = None) -> None:
        import torch.distributed as dist

        # NCCL sums in ring/tree order: reproducible for one configuration, but not rank order.
        super().__init__("nccl", dist.get_world_size(group), 1, rank_order=False)
        self.group = group

    def _all_reduce(self, shards: list[torch.Tensor], op: str) -> list[torch.Tensor]:
        import torch.distributed as dist

        dist.all_reduce(shards[0], op=_dist_op(op), group=self.group)
        return shards


class SollatDistBackend(_SollatMixin):
    """One process per GPU: ``sollat.Communicator`` over the process group."""

    def __init__(self, group: Any | None = None, algo: str = "auto", comm: Any | None = None) -> None:
        import torch.distributed as dist

        if comm is None:
            import sollat

            comm = sollat.Communicator(group=group)
        label = "sollat" if algo == "auto" else f"sollat:{algo}"
        super().__init__(label, dist.get_world_size(group), 1, rank_order=False)
        self.comm = comm
        self.algo = algo
        self._check_algo()

    def _all_reduce(self, shards: list[torch.Tensor], op: str) -> list[torch.Tensor]:
        return [self.comm.all_reduce(shards[0], op=op, algo=_sollat_algorithm(self.algo, op))]


class DistSollatBackend(_SollatMixin):
    """One process per GPU, as a user's code runs: plain ``torch.distributed.all_reduce`` in place on a
    group of the ``sollat`` backend (``sollat.integrations.dist_backend``, docs/torch-distributed.md)
    over ``group``'s ranks. Its first call, made here, builds the group's communicator."""

    def __init__(self, group: Any | None = None, device: torch.device | None = None) -> None:
        import torch.distributed as dist

        from sollat.integrations import dist_backend

        dist_backend.register()
        ranks = None if group is None else dist.get_process_group_ranks(group)
        self.group = dist.new_group(ranks, backend="cpu:gloo,cuda:sollat")
        dev = device if device is not None else torch.device("cuda", torch.cuda.current_device())
        dist.all_reduce(torch.zeros(1, device=dev), group=self.group)
        comm = dist_backend.router(self.group).comm
        if comm is None:
            raise ValueError("dist_sollat: the sollat group has no communicator (the log says why)")
        super().__init__("dist_sollat", dist.get_world_size(self.group), 1, rank_order=False)
        self.comm = comm
        self.algo = "auto"

    def _all_reduce(self, shards: list[torch.Tensor], op: str) -> list[torch.Tensor]:
        import torch.distributed as dist

        dist.all_reduce(shards[0], op=_dist_op(op), group=self.group)
        return shards
