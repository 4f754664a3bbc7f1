"""Which ``torch.distributed`` call sollat serves on a ``sollat`` process group, and how.

Both torch routes (``dist_backend.py``: a Python ``Backend`` on torch >= 2.14, a Python
``ProcessGroup`` below) hand every ``all_reduce``, ``all_gather_into_tensor`` and
``reduce_scatter_tensor`` to one :class:`Router` per group. It answers with a ``Work`` (sollat ran
the call) or ``None`` (the inner library backend must run it). The rule, per call shape (kind,
elements, dtype, op), decided on the first such call and cached:

* the tensors lie on the served device type (CUDA), are contiguous, have a dtype sollat moves and
  1..``MAX_ELEMENTS`` elements (``core.all_reduce_refusal``); the op is sum, avg, max or min;
* every rank of the group makes the same call: the description is agreed through the store
  (``comm/agree.py``), so a call that differs between ranks raises ``CallMismatchError`` on every
  rank instead of sending one rank to sollat and another to the library;
* the group has a sollat communicator (built collectively on the first call the rule gives it,
  through ``core.GroupAdapter``: one scratch per group, at most ``$SOLLAT_DIST_MAX_COMMUNICATORS``
  communicators per process, agreed on by every rank of the group);
* the communicator's own ``algo="auto"`` runs sollat's kernels for it
  (``Communicator.library_path``): where its table hands a size to NCCL, the inner backend runs the
  call (the communicator's hand-over would come back to this group).

``avg`` is the rank-order sum, rounded to the dtype, divided by the world size (a second rounding).
A served call runs on the calling stream, as NCCL's ordering promises: work queued on that stream
after the call sees the result. ``async_op=True`` gets a Work whose ``wait()`` makes the waiting
stream wait on an event recorded after the launch; nothing synchronises the host, so CUDA-graph
capture works.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from ..collectives.select import NCCL
from ..comm import agree
from ..device import environment, faults
from ..errors import UnsupportedError
from . import core

MAX_COMMUNICATORS_ENV = "SOLLAT_DIST_MAX_COMMUNICATORS"
KINDS = ("all_reduce", "all_gather", "reduce_scatter")

_built = 0  # sollat communicators this process built for sollat groups
ROUTERS: dict[str, Router] = {}  # group name -> its router (``dist_backend.router``)


def max_communicators() -> int:
    """``$SOLLAT_DIST_MAX_COMMUNICATORS``: the most sollat groups of this process with their own
    communicator (and scratch); a group beyond it sends every call to its inner backend."""
    return int(environment.value(MAX_COMMUNICATORS_ENV))


def _ops() -> dict[int, str]:
    """sollat's op of a c10d ``RedOpType``, keyed by its ``.value``: a plain int, which the hot path
    hashes far faster than the pybind enum itself."""
    import torch.distributed as dist

    t = dist.ReduceOp.RedOpType
    return {t.SUM.value: "sum", t.AVG.value: "avg", t.MAX.value: "max", t.MIN.value: "min"}


class Router:
    """sollat for one process group. ``group``: a callable giving the ``ProcessGroup`` (resolved
    late: torch names and registers the group after the backend is made). ``device_type``: the
    tensors sollat serves (``"cuda"``; the CPU tests serve ``"cpu"`` with a stand-in communicator).
    ``counts`` records what sollat served and what went to the inner backend."""

    def __init__(self, *, group: Callable[[], Any], rank: int, world_size: int, device_type: str = "cuda") -> None:
        self._group = group
        self.rank = rank
        self.world_size = world_size
        self.device_type = device_type
        self.counts: Counter[str] = Counter()
        self._routes: dict[tuple[Any, ...], bool] = {}
        self._all_reduce_ops: dict[tuple[Any, ...], str] = {}  # the hot path's cache: "" = inner backend
        self._ops = _ops()
        self._adapter: core.GroupAdapter | None = None
        self._agreement: agree.Agreement | None = None
        self._agreement_epoch = 0
        self.comm: Any = None

    # -- the calls (None: the inner backend runs it) --
    def all_reduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        # The hot path: one dict lookup on (elements, dtype, op, is_cuda), then the communicator's
        # own hot path. A new key takes _all_reduce_op, which decides (agreed, cached).
        x = tensors[0]
        red = opts.reduceOp.op.value
        key = (x.numel(), x.dtype, red, x.is_cuda)
        op = self._all_reduce_ops.get(key)
        if op is None:
            op = self._all_reduce_op(x, red, key)
        if not op or len(tensors) != 1 or not x.is_contiguous():
            self.counts["inner:all_reduce"] += 1
            return None
        if op == "avg":
            self.comm.all_reduce(x, "sum", out=x)
            x.div_(self.world_size)
        else:
            self.comm.all_reduce(x, op, out=x)
        self.counts["all_reduce"] += 1
        return work(tensors, opts)

    def _all_reduce_op(self, x: torch.Tensor, red: Any, key: tuple[Any, ...]) -> str:
        """The sollat op of a new all_reduce key, or "" (the inner backend runs it)."""
        op = self._ops.get(red)
        if op is None or x.device.type != self.device_type:
            self._all_reduce_ops[key] = ""
            return ""
        route = self._decide("all_reduce", x, x.numel(), op)
        if route or (("all_reduce", x.numel(), x.dtype, op) in self._routes):  # else: not cached
            self._all_reduce_ops[key] = op if route else ""
        return op if route else ""

    def all_gather(self, out: torch.Tensor, x: torch.Tensor, opts: Any) -> Any:
        n = x.numel()
        if (x.device.type != self.device_type or out.device != x.device or out.dtype != x.dtype
                or out.numel() != n * self.world_size or not x.is_contiguous() or not out.is_contiguous()):
            return None
        route = self._routes.get(("all_gather", n, x.dtype, ""))
        if route is None:
            route = self._decide("all_gather", x, n, "")
        if not route:
            self.counts["inner:all_gather"] += 1
            return None
        self.comm.all_gather(x.view(-1), out=out.view(self.world_size, n))
        self.counts["all_gather"] += 1
        return work([out], opts)

    def reduce_scatter(self, out: torch.Tensor, x: torch.Tensor, opts: Any) -> Any:
        op = self._ops.get(opts.reduceOp.op.value)
        n = x.numel()
        if (op is None or x.device.type != self.device_type or out.device != x.device or out.dtype != x.dtype
                or out.numel() * self.world_size != n or not x.is_contiguous() or not out.is_contiguous()):
            return None
        route = self._routes.get(("reduce_scatter", n, x.dtype, op))
        if route is None:
            route = self._decide("reduce_scatter", x, n, op)
        if not route:
            self.counts["inner:reduce_scatter"] += 1
            return None
        ws = self.world_size
        self.comm.reduce_scatter(x.view(ws, n // ws), out=out.view(1, n // ws), op="sum" if op == "avg" else op)
        if op == "avg":
            out.div_(ws)
        self.counts["reduce_scatter"] += 1
        return work([out], opts)

    # -- the rule --
    def _decide(self, kind: str, x: torch.Tensor, n: int, op: str) -> bool:
        """The route of a new call shape, the same on every rank (cached unless it was decided
        inside a capture or a trace before the communicator existed)."""
        why = core.all_reduce_refusal(x, x.device, None)
        if why is None and kind == "reduce_scatter" and n % self.world_size:
            why = f"{n} elements are not a multiple of {self.world_size} ranks"
        self._agree(f"{kind}|{x.dtype}|{op}|n={n}|{'refused: ' + why if why else 'candidate'}")
        if why is not None:
            self._routes[(kind, n, x.dtype, op)] = False
            return False
        adapter = self._adapter_for(x.device)
        if not adapter.ensure():
            if adapter.unavailable is None:  # a capture or trace before the communicator exists: not cached
                return False
            self._routes[(kind, n, x.dtype, op)] = False
            return False
        self.comm = adapter.comm
        path = self.comm.library_path(kind, n, x.dtype, "sum" if op == "avg" else op)
        route = path is None or (kind == "all_reduce" and path != NCCL)
        self._routes[(kind, n, x.dtype, op)] = route
        return route

    def _agree(self, text: str) -> None:
        # Rounds are numbered per epoch of the group's communicator: a reset() that passed moves every
        # rank to its next epoch, so rounds that drifted apart before it (a rank that agreed on a call
        # its peers ran from their cache: the peers' kernels time out on it, and reset() is due) line
        # up again after it.
        epoch = int(getattr(getattr(self.comm, "_agreement", None), "epoch", 0))
        if self._agreement is None or self._agreement_epoch != epoch:
            store = agree.default_store(self._group())
            if store is None:
                return
            self._agreement = agree.Agreement(store, f"dist/{self._group().group_name}", self.rank,
                                              self.world_size, faults.setup_timeout(), seq=epoch)
            self._agreement_epoch = epoch
        self._agreement.agree(text, "this torch.distributed call (kind|dtype|op|elements|route)")

    def _adapter_for(self, device: torch.device) -> core.GroupAdapter:
        if self._adapter is None:
            group = self._group()
            adapter = core.GroupAdapter(engine="torch.distributed", name=group.group_name, device_group=group,
                                        cpu_group=group, device=device, world_size=self.world_size,
                                        batch_invariant=False, fallback="its inner backend for every call",
                                        refusal=_beyond_cap)
            made = adapter._factory

            def counted(device_group: Any, dev: torch.device, batch_invariant: bool) -> Any:
                global _built
                comm = (made if made is not core.sollat_communicator else _default_communicator)(
                    store_backed(device_group), dev, batch_invariant)
                _built += 1
                return comm

            adapter._factory = counted
            self._adapter = adapter
        return self._adapter


def _beyond_cap() -> str | None:
    """Why this process builds no more communicators (``$SOLLAT_DIST_MAX_COMMUNICATORS``), or None.
    Posted before any rank builds: where one rank is at its cap, no rank of the group builds."""
    cap = max_communicators()
    if _built < cap:
        return None
    return (f"this process has {_built} sollat communicators for torch.distributed groups, the most "
            f"${MAX_COMMUNICATORS_ENV} ({cap}) allows")


_companions: dict[str, Any] = {}  # sollat group name -> the store-backed gloo group of its communicator


def store_backed(group: Any) -> Any:
    """The group a sollat communicator of ``group`` is built on: ``group`` itself where its C++ side
    holds a store (the backend route), else (the process_group route, torch 2.11 - 2.13, whose
    Python ``ProcessGroup`` is made without one: symmetric memory's rendezvous reads its peers'
    handles from the group's store and faults on a group without one) a gloo group of the same
    ranks, made once per sollat group. It carries the communicator's rendezvous and its host-side
    exchanges only; the kernels run on the calling stream of the sollat group's calls. Collective
    over the group's ranks only (``use_local_synchronization``), which all reach it together: the
    communicator is built on a call every rank of the group makes (``Router._decide``)."""
    if getattr(group, "has_store", True):
        return group
    name = group.group_name
    if name not in _companions:
        import torch.distributed as dist

        _companions[name] = dist.new_group(dist.get_process_group_ranks(group), backend="gloo",
                                           use_local_synchronization=True)
    return _companions[name]


def _default_communicator(group: Any, device: torch.device, batch_invariant: bool) -> Any:
    """``sollat.Communicator(group)`` with its own defaults (every algorithm, AllGather and
    ReduceScatter scratch) on ``device``."""
    from ..comm.real import Communicator

    if device.type != "cuda":
        raise UnsupportedError(f"a sollat communicator needs a CUDA device, got {device}")
    with torch.cuda.device(device):
        return Communicator(group)


# ---- Work -----------------------------------------------------------------------------------------
_done: Any = None


def work(tensors: list[torch.Tensor], opts: Any) -> Any:
    """The Work of a call sollat ran on the calling stream. A synchronous call (``asyncOp`` False)
    gets one shared, completed Work: its ``wait()`` returns at once (the stream order already holds).
    An asynchronous one gets a Work on a completed CUDA future, which recorded an event on the
    calling stream: ``wait()`` makes the waiting stream wait on it, with no host synchronisation."""
    if not getattr(opts, "asyncOp", True):
        return _done if _done is not None else _completed(None)
    dev = tensors[0].device
    return _completed(tensors, [dev] if dev.type == "cuda" else None)


def _completed(value: Any, devices: list[torch.device] | None = None) -> Any:
    global _done
    from torch._C._distributed_c10d import _create_work_from_future

    fut: torch.futures.Future[Any] = torch.futures.Future(devices=devices) if devices else torch.futures.Future()
    fut.set_result(value)
    done = _create_work_from_future(fut)
    if value is None:
        _done = done
    return done


def inner_all_reduce(inner: Any, inner_kind: str, router: Router, tensors: list[torch.Tensor], opts: Any) -> Any:
    """The inner backend's all_reduce; gloo has no ``avg``: a sum there, then the division."""
    import torch.distributed as dist

    if inner_kind != "gloo" or opts.reduceOp.op != dist.ReduceOp.RedOpType.AVG:
        return inner.allreduce(tensors, opts)
    summed = dist.AllreduceOptions()
    summed.reduceOp = dist.ReduceOp.SUM
    summed.timeout = opts.timeout
    inner.allreduce(tensors, summed).wait()
    for t in tensors:
        t.div_(router.world_size)
    return work(tensors, opts)
