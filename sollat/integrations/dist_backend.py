"""The ``sollat`` backend of ``torch.distributed`` (docs/torch-distributed.md).

``register()`` (also the ``torch.distributed.backends`` entry point, which torch >= 2.14 loads by
itself) makes ``init_process_group("cpu:gloo,cuda:sollat")`` and ``new_group(backend=...)`` build a
sollat group. Its CUDA collectives go to a :class:`~sollat.integrations.dist_router.Router`, which
serves ``all_reduce``, ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` with sollat's
kernels where the group's communicator would, and hands everything else to an inner library
backend built from the same store under its own prefix: NCCL, or gloo where processes of the group
share a GPU (NCCL refuses that), or ``$SOLLAT_DIST_INNER``.

Two routes, by what the installed torch offers:

* ``"backend"`` (torch >= 2.14): a Python subclass of c10d's ``Backend`` (the ``PyBackend``
  trampoline; ``dist.BackendBase`` where torch names it), registered for the CUDA device beside the
  CPU backend torch builds; every call it does not serve is forwarded to the inner backend.
* ``"process_group"`` (torch 2.11 - 2.13, whose ``Backend`` cannot be subclassed in Python): a Python
  ``ProcessGroup`` subclass, which torch puts in place of the whole group. It registers the inner
  backends (gloo for the CPU, the library one for CUDA) on itself, so every call it does not
  override, or does not serve, reaches them through c10d's own dispatch; torch's functional
  collectives reach its Python ``allreduce`` through the registered group name.
"""

from __future__ import annotations

import datetime
import socket
from typing import Any

import torch

from ..device import environment
from ..errors import UnsupportedError
from .dist_router import ROUTERS, Router, inner_all_reduce

BACKEND_NAME = "sollat"
INNER_ENV = "SOLLAT_DIST_INNER"
#: The c10d Backend methods the backend route forwards to the inner backend when it does not serve them
#: (those the installed torch has).
FORWARDED = ("broadcast", "allreduce", "allreduce_coalesced", "reduce", "allgather", "_allgather_base",
             "all_gather_single", "allgather_coalesced", "allgather_into_tensor_coalesced",
             "all_gather_single_coalesced", "gather", "gather_single", "gather_into_tensor", "scatter",
             "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_single", "reduce_scatter_tensor_coalesced",
             "reduce_scatter_single_coalesced", "alltoall_base", "all_to_all_single", "alltoall", "send", "recv",
             "recv_anysource", "barrier", "monitored_barrier")
#: Names of one served call across torch versions: (kind, names).
GATHER_NAMES = ("_allgather_base", "all_gather_single")
SCATTER_NAMES = ("_reduce_scatter_base", "reduce_scatter_single")
GATHER_COALESCED = ("allgather_into_tensor_coalesced", "all_gather_single_coalesced")
SCATTER_COALESCED = ("reduce_scatter_tensor_coalesced", "reduce_scatter_single_coalesced")

_served_device_type = "cuda"


def serve_device_type(device_type: str) -> None:
    """Groups made after this call serve tensors of ``device_type`` (``"cuda"``; the CPU tests serve
    ``"cpu"`` with a stand-in communicator, ``core.set_communicator_factory``)."""
    global _served_device_type
    _served_device_type = device_type


def python_backend_base() -> type | None:
    """c10d's backend base class where Python may subclass it (torch >= 2.14), else None."""
    import torch.distributed as dist
    from torch._C import _distributed_c10d as c10d

    for base in (getattr(dist, "BackendBase", None), c10d.Backend):
        if base is None:
            continue

        class _Probe(base):  # type: ignore[misc, valid-type]
            pass

        try:
            _Probe(0, 1)
        except TypeError:  # "No constructor defined!": no trampoline in this torch
            continue
        return base  # type: ignore[no-any-return]
    return None


def route() -> str:
    """``"backend"`` or ``"process_group"``: how this torch hosts the sollat backend."""
    return "backend" if python_backend_base() is not None else "process_group"


def register(name: str = BACKEND_NAME) -> None:
    """Register the backend ``name`` with ``torch.distributed`` (once; later calls do nothing)."""
    import torch.distributed as dist

    if name.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(name, _create, extended_api=True, devices=["cuda"])


def _inner_kind(store: Any, rank: int, world_size: int) -> str:
    """``$SOLLAT_DIST_INNER`` (nccl or gloo), else gloo without CUDA or where two ranks share a GPU
    (every rank posts its host and device through the store), else nccl."""
    asked = environment.value(INNER_ENV)
    if asked is not None:
        return str(asked)
    if _served_device_type != "cuda" or not torch.cuda.is_available():
        return "gloo"
    mine = f"{socket.gethostname()}|{torch.cuda.current_device()}"
    store.set(f"sollat-inner/{rank}", mine)
    seen = [store.get(f"sollat-inner/{r}").decode() for r in range(world_size)]
    return "gloo" if len(set(seen)) < world_size else "nccl"


def _library_backend(kind: str, store: Any, rank: int, world_size: int, timeout: datetime.timedelta) -> Any:
    from torch._C import _distributed_c10d as c10d

    if kind == "gloo":
        return c10d.ProcessGroupGloo(store, rank, world_size, timeout)
    opts = c10d.ProcessGroupNCCL.Options()
    opts._timeout = timeout
    return c10d.ProcessGroupNCCL(store, rank, world_size, opts)


def _create(backend_opts: Any, pg_options: Any = None) -> Any:
    import torch.distributed as dist

    store, rank, size = backend_opts.store, backend_opts.group_rank, backend_opts.group_size
    timeout, group_name = backend_opts.timeout, backend_opts.group_id
    kind = _inner_kind(dist.PrefixStore("sollat-probe/", store), rank, size)
    inner = _library_backend(kind, dist.PrefixStore(f"sollat-{kind}/", store), rank, size, timeout)
    base = python_backend_base()
    if base is not None:
        router = Router(group=lambda: _resolve(group_name), rank=rank, world_size=size,
                        device_type=_served_device_type)
        ROUTERS[group_name] = router
        return _backend_class(base)(rank, size, router, inner, kind)
    from .dist_group import SollatProcessGroup

    pg: Any = None
    router = Router(group=lambda: pg, rank=rank, world_size=size, device_type=_served_device_type)
    cpu = inner if kind == "gloo" else _library_backend("gloo", dist.PrefixStore("sollat-cpu/", store), rank, size,
                                                         timeout)
    pg = SollatProcessGroup(store, rank, size, router, inner, cpu, kind)
    ROUTERS[group_name] = router
    return pg


def router(group: Any = None) -> Router:
    """The router of a sollat group (None: the default group): its ``counts`` (what sollat served,
    what went to the inner backend) and its ``comm`` (the group's sollat communicator once built:
    ``reset()`` after a fault, ``sollat.testing``)."""
    import torch.distributed as dist

    name = (group if group is not None else dist.group.WORLD).group_name
    if name not in ROUTERS:
        raise UnsupportedError(f"group {name!r} is not a sollat group (init_process_group('cpu:gloo,cuda:sollat') "
                               "or new_group(backend='cpu:gloo,cuda:sollat') makes one)")
    return ROUTERS[name]


def _resolve(group_name: str) -> Any:
    from torch._C import _distributed_c10d as c10d

    return c10d._resolve_process_group(group_name)


_classes: dict[type, type] = {}


def _backend_class(base: type) -> type:
    """The backend route's class on ``base`` (made once)."""
    if base in _classes:
        return _classes[base]

    def forward(name: str) -> Any:
        def call(self: Any, *args: Any) -> Any:
            return getattr(self.inner, name)(*args)
        call.__name__ = name
        return call

    def allreduce(self: Any, tensors: list[torch.Tensor], opts: Any) -> Any:
        done = self.router.all_reduce(tensors, opts)
        return inner_all_reduce(self.inner, self.inner_kind, self.router, tensors, opts) if done is None else done

    def gathered(name: str) -> Any:
        def call(self: Any, out: torch.Tensor, x: torch.Tensor, opts: Any) -> Any:
            done = self.router.all_gather(out, x, opts)
            return getattr(self.inner, name)(out, x, opts) if done is None else done
        return call

    def scattered(name: str) -> Any:
        def call(self: Any, out: torch.Tensor, x: torch.Tensor, opts: Any) -> Any:
            done = self.router.reduce_scatter(out, x, opts)
            return getattr(self.inner, name)(out, x, opts) if done is None else done
        return call

    def coalesced(name: str, serve: str) -> Any:
        def call(self: Any, outs: list[torch.Tensor], xs: list[torch.Tensor], opts: Any) -> Any:
            done = getattr(self.router, serve)(outs[0], xs[0], opts) if len(outs) == 1 == len(xs) else None
            return getattr(self.inner, name)(outs, xs, opts) if done is None else done
        return call

    def __init__(self: Any, rank: int, size: int, router: Router, inner: Any, inner_kind: str) -> None:
        base.__init__(self, rank, size)  # type: ignore[misc]
        self.router, self.inner, self.inner_kind = router, inner, inner_kind

    def getBackendName(self: Any) -> str:  # noqa: N802 (c10d's name)
        return BACKEND_NAME

    body: dict[str, Any] = {name: forward(name) for name in FORWARDED if hasattr(base, name)}
    body.update({n: gathered(n) for n in GATHER_NAMES}, **{n: scattered(n) for n in SCATTER_NAMES})
    body.update({n: coalesced(n, "all_gather") for n in GATHER_COALESCED})
    body.update({n: coalesced(n, "reduce_scatter") for n in SCATTER_COALESCED})
    body.update(__init__=__init__, allreduce=allreduce, getBackendName=getBackendName,
                __doc__="sollat's c10d backend (torch >= 2.14).")
    cls = type("SollatBackend", (base,), body)
    _classes[base] = cls
    return cls
