"""``VirtualCommunicator``: R ranks in one process on one GPU, one launch for every rank
(rank = blockIdx.y). The same kernels as real ranks; how everything is tested on one GPU."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from ..collectives.custom import Collective, checked_collectives
from ..collectives.validate import (
    algorithm_names,
    check_world_size,
    checked_batch_invariant,
    checked_flag,
    checked_max_blocks,
    cuda_device,
    timeout,
)
from ..device import layout
from ..errors import UnsupportedError
from .api import CollectiveOps
from .state import _record_view, scratch_bytes_per_rank


class VirtualCommunicator(CollectiveOps[Sequence[torch.Tensor], list[torch.Tensor]]):
    """``world_size`` ranks in this process on one GPU; every call launches one kernel for all ranks.

    ``VirtualCommunicator(world_size, device=None, *, timeout_s=None, debug=False, algorithms=None,
    cluster_ranks=None, max_blocks=None, collectives=None, gather_scatter=True, batch_invariant=None)``

    Rank r's blocks are ``blockIdx.y == r``. The grid is sized so that every block is co-resident
    (checked with the occupancy API), since block b of each rank waits for block b of the others.
    With ``cluster_ranks`` (default on; ``SOLLAT_CLUSTER_RANKS=0`` turns it off) small grids launch
    block b of every rank as one thread-block cluster, which the hardware co-schedules on one GPC
    (see ``_clustered``). The kernels are the same either way. ``collectives`` registers
    user-written collectives (``sollat.custom``; run them with ``run``); ``gather_scatter`` gives
    ``all_gather`` / ``reduce_scatter`` their scratch (``sollat.gather_scatter``). ``batch_invariant``
    (None: ``SOLLAT_BATCH_INVARIANT``, ``"1"`` on) as Communicator's: ``auto`` never runs a
    non-deterministic algorithm (``ll128``) and ``algo="ll128"`` raises (virtual ranks have no
    library paths anyway).
    """

    _entry = "vr"

    def __init__(self, world_size: int, device: torch.device | str | int | None = None, *,
                 timeout_s: float | None = None, debug: bool = False,
                 algorithms: Sequence[str] | None = None, cluster_ranks: bool | None = None,
                 max_blocks: int | None = None, collectives: Sequence[Collective] | None = None,
                 gather_scatter: bool = True, batch_invariant: bool | None = None) -> None:
        check_world_size(world_size, "VirtualCommunicator")
        invariant = checked_batch_invariant(batch_invariant, "VirtualCommunicator")
        customs = self._register_collectives(checked_collectives(collectives, "VirtualCommunicator"))
        gs = checked_flag(gather_scatter, "gather_scatter", "VirtualCommunicator")
        timeout_value = timeout(timeout_s)
        names = algorithm_names(algorithms, world_size, "VirtualCommunicator")
        blocks = checked_max_blocks(max_blocks, "VirtualCommunicator", default=0)  # 0: the default, set below
        checked_flag(debug, "debug", "VirtualCommunicator")
        if cluster_ranks is not None:
            checked_flag(cluster_ranks, "cluster_ranks", "VirtualCommunicator")
        dev = cuda_device(device, "VirtualCommunicator")  # the hardware last: argument errors come first
        cap = layout.virtual_block_cap(world_size, torch.cuda.get_device_properties(dev).multi_processor_count)
        blocks = blocks or min(layout.MAX_BLOCKS_VIRTUAL, cap)
        per_rank = scratch_bytes_per_rank(world_size, names, blocks, customs, gs, cap)
        self._scratch = torch.empty(world_size * per_rank, dtype=torch.uint8, device=dev)
        base = self._scratch.data_ptr()
        ptrs = [base + r * per_rank for r in range(world_size)]
        self._setup(world_size, dev, ptrs, world_size, timeout_value, debug, names, blocks, customs, gs, invariant,
                    fused_blocks=cap)
        if cluster_ranks is None:
            cluster_ranks = os.environ.get("SOLLAT_CLUSTER_RANKS", "1") != "0"
        self._cluster_ranks = bool(cluster_ranks)
        self._init_scratch(self._rank_views())
        torch.cuda.synchronize(dev)

    def _rank_views(self) -> list[torch.Tensor]:
        per = self.scratch_bytes_per_rank
        return [self._scratch[r * per:(r + 1) * per] for r in range(self.world_size)]

    def _rank_arg(self) -> int:
        return 0  # rank_base; rank = blockIdx.y

    def _record_views(self) -> list[tuple[int, torch.Tensor]]:
        return [(r, _record_view(v)) for r, v in enumerate(self._rank_views())]

    def _record_args(self) -> tuple[int, int]:
        return self._scratch.data_ptr() + layout.FAULT_RECORD_OFFSET, self.scratch_bytes_per_rank

    # ---- the calling convention (ranks.py): a list of one tensor per rank ------------------------
    def _per_rank(self, value: Any, what: str, opname: str) -> list[Any]:
        ws = self.world_size
        if isinstance(value, torch.Tensor) or not isinstance(value, Sequence) or len(value) != ws:
            got = ("a single tensor" if isinstance(value, torch.Tensor) else f"{len(value)} tensors"
                   if isinstance(value, Sequence) else type(value).__name__)
            raise UnsupportedError(f"{opname}: a VirtualCommunicator of {ws} ranks needs {what} as a list of {ws} "
                                   f"tensors, got {got}")
        return list(value)

    def _per_rank_or_shared(self, value: Any, what: str, opname: str) -> list[Any]:
        return [value] * self.world_size if isinstance(value, torch.Tensor) else self._per_rank(value, what, opname)

    def _result(self, values: list[torch.Tensor]) -> list[torch.Tensor]:
        return values

    def _suffix(self, r: int) -> str:
        return f"[{r}]"

    def reset(self) -> None:
        """Clear a recorded fault and return every buffer and epoch to its initial state."""
        self._reset_local(self._rank_views())

