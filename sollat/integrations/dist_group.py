"""The ``process_group`` route of the sollat backend (torch 2.11 - 2.13; ``dist_backend.py``).

torch puts a Python ``ProcessGroup`` returned by a backend's creator in place of the whole group,
so this class carries the group's other devices too: it registers the inner backends on itself
(gloo for CPU tensors, the library backend for CUDA ones), and every collective it does not
override, or does not serve, reaches them through c10d's own dispatch (``super()``). The
functional collectives resolve the group by its registered name and call its Python ``allreduce``,
``_allgather_base`` and ``_reduce_scatter_base`` through torch's ``ProcessGroup`` trampoline.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

from .dist_router import Router, inner_all_reduce


class SollatProcessGroup(dist.ProcessGroup):
    """A sollat group: its router, and the inner backends it hands every other call to.

    It is made with the (rank, size) constructor, the only one a Python subclass has, so its C++
    side holds no store, and symmetric memory's rendezvous, which takes the store from the group,
    cannot run on it. So ``has_store`` is False, and the router builds the group's sollat
    communicator on a gloo group of the same ranks (``dist_router.store_backed``)."""

    has_store = False

    def __init__(self, store: Any, rank: int, size: int, router: Router, inner: Any, cpu: Any,
                 inner_kind: str) -> None:
        super().__init__(rank, size)  # the (store, rank, size) constructor makes no Python subclass
        self.router, self.inner, self.inner_kind = router, inner, inner_kind
        custom = dist.ProcessGroup.BackendType.CUSTOM
        self._register_backend(torch.device("cpu"), custom, cpu)
        if torch.cuda.is_available() or router.device_type == "cuda":
            self._register_backend(torch.device("cuda"), custom, inner)
        self._set_default_backend(custom)

    def allreduce(self, tensors: Any, opts: Any = None) -> Any:  # type: ignore[override]
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        if opts is None or not isinstance(opts, dist.AllreduceOptions):
            opts = _allreduce_options(opts)
        done = self.router.all_reduce(tensors, opts)
        if done is not None:
            return done
        if tensors and tensors[0].device.type == self.router.device_type:
            return inner_all_reduce(self.inner, self.inner_kind, self.router, tensors, opts)
        return super().allreduce(tensors, opts)

    def _allgather_base(self, out: torch.Tensor, x: torch.Tensor, opts: Any = None) -> Any:  # type: ignore[override]
        opts = opts if opts is not None else c10d.AllgatherOptions()
        done = self.router.all_gather(out, x, opts)
        return super()._allgather_base(out, x, opts) if done is None else done

    def _reduce_scatter_base(self, out: torch.Tensor, x: torch.Tensor,  # type: ignore[override]
                             opts: Any = None) -> Any:
        opts = opts if opts is not None else c10d.ReduceScatterOptions()
        done = self.router.reduce_scatter(out, x, opts)
        return super()._reduce_scatter_base(out, x, opts) if done is None else done

    def allgather_into_tensor_coalesced(self, outs: list[torch.Tensor], xs: list[torch.Tensor],  # type: ignore[override]
                                        opts: Any = None) -> Any:
        opts = opts if opts is not None else c10d.AllgatherOptions()
        done = self.router.all_gather(outs[0], xs[0], opts) if len(xs) == 1 == len(outs) else None
        return super().allgather_into_tensor_coalesced(outs, xs, opts) if done is None else done

    def reduce_scatter_tensor_coalesced(self, outs: list[torch.Tensor], xs: list[torch.Tensor],  # type: ignore[override]
                                        opts: Any = None) -> Any:
        opts = opts if opts is not None else c10d.ReduceScatterOptions()
        done = self.router.reduce_scatter(outs[0], xs[0], opts) if len(xs) == 1 == len(outs) else None
        return super().reduce_scatter_tensor_coalesced(outs, xs, opts) if done is None else done

    # torch 2.13 names them so too (dist.all_gather_into_tensor, reduce_scatter_tensor, the functional
    # collectives); where both names exist, the C++ side calls the first through the trampoline.
    all_gather_single = _allgather_base
    reduce_scatter_single = _reduce_scatter_base
    all_gather_single_coalesced = allgather_into_tensor_coalesced
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced


def _allreduce_options(op: Any) -> Any:
    """``allreduce(tensors, op)`` as torch's own group accepts it: a ReduceOp (or None: sum)."""
    opts = dist.AllreduceOptions()
    if op is not None:
        opts.reduceOp = op
    return opts
