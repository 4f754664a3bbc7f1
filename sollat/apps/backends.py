"""The AllReduce switch the apps run on: NCCL, sollat ``auto``, a forced sollat algorithm, or a reference.

``backend.all_reduce(shards, op="sum") -> list[Tensor]``

``shards`` holds one tensor per tensor-parallel rank *that this process owns*:

* virtual ranks (one process, one device, all R ranks): R tensors, one per rank, in rank order;
* one process per GPU (torchrun): one tensor, this rank's.

The result is a list of the same length; entry i is what rank i ends up with. A backend may reduce in
place, so the inputs must not be used afterwards (NCCL through ``torch.distributed`` does; sollat
returns new tensors). Every call works under CUDA-graph capture.

========================  ===========================================================================
spec                      what runs
========================  ===========================================================================
``nccl``                  ``torch.distributed.all_reduce`` (one process per GPU). With virtual ranks
                          NCCL cannot run R ranks on one GPU, so it means ``reference``.
``sollat``                sollat, ``algo="auto"``.
``sollat:<algo>``         sollat with that algorithm forced for sums (``max``/``min`` fall back to
                          ``auto`` when the algorithm only adds, as LL128 atomic does).
``reference`` / ``cpu``   virtual ranks only: a rank-order sum in torch, 16-bit types accumulated in
                          fp32 and rounded once, the same arithmetic as sollat's deterministic kernels.
``sollat_fused[:<algo>]`` decode only: sollat, with each AllReduce that a residual add and RMSNorm
                          follow fused with them into one ``all_reduce_rmsnorm`` call (``fused.py``).
``noop``                  returns the inputs: a stand-in used to time a step without its AllReduces,
                          and the exact AllReduce of a world of one.
========================  ===========================================================================
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

OPS: tuple[str, ...] = ("sum", "max", "min")
KINDS: tuple[str, ...] = ("nccl", "sollat", "sollat_fused", "reference", "cpu", "noop")
SOLLAT_KINDS: tuple[str, ...] = ("sollat", "sollat_fused")  # need a CUDA device; take an algorithm


@dataclass(frozen=True)
class CallRecord:
    """One traced AllReduce call: its op, dtype and the message size of one rank in bytes; for a fused
    AllReduce + RMSNorm (``fused.FUSED_OP``) also the row length and eps."""

    op: str
    dtype: torch.dtype
    nbytes: int
    hidden: int = 0
    eps: float = 0.0


@dataclass(frozen=True)
class BackendSpec:
    kind: str  # one of KINDS
    algo: str  # sollat algorithm ("auto" unless forced); "" for the others

    @property
    def label(self) -> str:
        if self.kind in SOLLAT_KINDS:
            return self.kind if self.algo == "auto" else f"{self.kind}:{self.algo}"
        return self.kind


def parse_backend_spec(spec: str) -> BackendSpec:
    """``parse_backend_spec("sollat:oneshot_ll") -> BackendSpec("sollat", "oneshot_ll")``; ValueError if unknown."""
    text = spec.strip()
    kind, sep, algo = text.partition(":")
    if kind not in KINDS:
        raise ValueError(f"backend {spec!r}: unknown kind {kind!r}; expected one of {', '.join(KINDS)} "
                         f"or sollat:<algorithm>")
    if kind in SOLLAT_KINDS:
        if sep and not algo:
            raise ValueError(f"backend {spec!r}: missing algorithm name after '{kind}:'")
        if kind == "sollat_fused":
            from .fused import check_fused_algo

            check_fused_algo(algo or "auto")
        return BackendSpec(kind, algo or "auto")
    if sep:
        raise ValueError(f"backend {spec!r}: only sollat and sollat_fused take an algorithm "
                         f"(sollat:<algorithm>)")
    return BackendSpec(kind, "")


def parse_backend_list(text: str) -> list[BackendSpec]:
    """Comma-separated specs, e.g. ``"nccl,sollat,sollat:oneshot_ll"``; duplicates are an error."""
    specs = [parse_backend_spec(s) for s in text.split(",") if s.strip()]
    if not specs:
        raise ValueError("no backend given")
    labels = [s.label for s in specs]
    dup = {x for x in labels if labels.count(x) > 1}
    if dup:
        raise ValueError(f"backend listed twice: {', '.join(sorted(dup))}")
    return specs


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
    from sollat.algorithms import ALGORITHMS

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
        from sollat.algorithms import ALGORITHMS

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


def make_backend(spec: BackendSpec | str, *, world_size: int, device: torch.device | str,
                 distributed: bool, group: Any | None = None) -> AllReduceBackend:
    """Build the backend ``spec`` names.

    ``distributed=False``: virtual ranks, all ``world_size`` ranks in this process on ``device``.
    ``distributed=True``: one rank per process over ``group`` (torch.distributed must be initialised).
    """
    if isinstance(spec, str):
        spec = parse_backend_spec(spec)
    device = torch.device(device)
    if spec.kind == "noop":
        return NoOpBackend(world_size, 1 if distributed else world_size)
    if distributed:
        if spec.kind == "nccl":
            return NcclBackend(group)
        if spec.kind == "sollat":
            return SollatDistBackend(group, spec.algo)
        if spec.kind == "sollat_fused":
            from .fused import SollatFusedDistBackend

            return SollatFusedDistBackend(group, spec.algo)
        raise ValueError(f"backend {spec.label!r} runs only with virtual ranks (--virtual-tp); "
                         f"under torchrun use nccl, sollat or sollat_fused")
    if spec.kind in ("reference", "cpu"):
        return ReferenceBackend(world_size, name=spec.kind)
    if spec.kind == "nccl":
        # NCCL cannot host R ranks on one GPU; its stand-in is the rank-order sum.
        return ReferenceBackend(world_size, name="nccl(reference)")
    if device.type != "cuda":
        raise ValueError(f"backend {spec.label!r} needs a CUDA device, got {device}")
    if spec.kind == "sollat_fused":
        from .fused import SollatFusedVirtualBackend

        return SollatFusedVirtualBackend(world_size, device, spec.algo)
    return SollatVirtualBackend(world_size, device, spec.algo)


def resolve_placement(parser: Any, env: Any, *, virtual: int | None, virtual_flag: str, device: str | None,
                      check_whole: bool, check_flag: str) -> tuple[bool, int, str]:
    """(distributed, world size, device) for an app: torchrun (one process per GPU) or ``virtual``
    ranks in this process. Contradictory options end through ``parser.error`` (exit status 2)."""
    distributed = "WORLD_SIZE" in env and "RANK" in env
    if distributed:
        if virtual is not None:
            parser.error(f"{virtual_flag} runs every rank in one process; do not combine it with torchrun")
        if device is not None:
            parser.error("--device is set by torchrun (cuda:LOCAL_RANK)")
        if check_whole:
            parser.error(f"{check_flag} needs the whole problem on one device: use {virtual_flag}")
        return True, int(env["WORLD_SIZE"]), f"cuda:{int(env.get('LOCAL_RANK', '0'))}"
    world = 1 if virtual is None else virtual
    if world < 1:
        parser.error(f"{virtual_flag} must be >= 1")
    return False, world, device or ("cuda" if torch.cuda.is_available() else "cpu")


def setup_device(distributed: bool, device_name: str, app: str) -> torch.device:
    """The device an app runs on; under torchrun also the NCCL process group (once)."""
    device = torch.device(device_name)
    if distributed:
        import torch.distributed as dist

        torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group("nccl", device_id=device)
        return device
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit(f"{app}: no CUDA device; use --device cpu")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    return device


def teardown(distributed: bool) -> None:
    """Destroy the process group an app created (no-op for virtual ranks)."""
    if distributed:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
