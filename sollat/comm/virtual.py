"""``VirtualCommunicator``: R ranks in one process on one GPU, one launch for every rank
(rank = blockIdx.y). The same kernels as real ranks; how everything is tested on one GPU."""

from __future__ import annotations

from collections.abc import Sequence

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
from ..device import environment, layout
from .api import _Communicator
from .ranks import VirtualRanks
from .state import scratch_bytes_per_rank


class VirtualCommunicator(_Communicator[Sequence[torch.Tensor], list[torch.Tensor]]):
    """``world_size`` ranks in this process on one GPU; every call launches one kernel for all ranks.

    ``VirtualCommunicator(world_size, device=None, *, timeout_s=None, debug=False, algorithms=None,
    cluster_ranks=None, max_blocks=None, collectives=None, gather_scatter=True, batch_invariant=None)``

    Rank r's blocks are ``blockIdx.y == r``. The grid is sized so that every block is co-resident
    (checked with the occupancy API), since block b of each rank waits for block b of the others.
    With ``cluster_ranks`` (default on; ``SOLLAT_CLUSTER_RANKS=0`` turns it off) small grids launch
    block b of every rank as one thread-block cluster, which the hardware co-schedules on one GPC
    (see ``fitting.Fitting.clustered``). The kernels are the same either way. ``collectives`` registers
    user-written collectives (``sollat.custom``; run them with ``run``); ``gather_scatter`` gives
    ``all_gather`` / ``reduce_scatter`` their scratch (``sollat.gather_scatter``). ``batch_invariant``
    (None: ``SOLLAT_BATCH_INVARIANT``, ``"1"`` on) as Communicator's: ``auto`` never runs a
    non-deterministic algorithm (``ll128``) and ``algo="ll128"`` raises (virtual ranks have no
    library paths anyway).
    """

    def __init__(self, world_size: int, device: torch.device | str | int | None = None, *,
                 timeout_s: float | None = None, debug: bool = False,
                 algorithms: Sequence[str] | None = None, cluster_ranks: bool | None = None,
                 max_blocks: int | None = None, collectives: Sequence[Collective] | None = None,
                 gather_scatter: bool = True, batch_invariant: bool | None = None) -> None:
        check_world_size(world_size, "VirtualCommunicator")
        invariant = checked_batch_invariant(batch_invariant, "VirtualCommunicator")
        colls = checked_collectives(collectives, "VirtualCommunicator")
        customs = tuple(c.algorithm for c in colls)
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
        scratch = torch.empty(world_size * per_rank, dtype=torch.uint8, device=dev)
        base = scratch.data_ptr()
        ptrs = [base + r * per_rank for r in range(world_size)]
        if cluster_ranks is None:
            cluster_ranks = environment.flag("SOLLAT_CLUSTER_RANKS")
        ranks = VirtualRanks(world_size, scratch)
        super().__init__(ranks, world_size=world_size, device=dev, scratch_ptrs=ptrs, timeout_s=timeout_value,
                         debug=debug, algos=names, max_blocks=blocks, collectives=colls, gather_scatter=gs,
                         batch_invariant=invariant, fused_blocks=cap, cluster_ranks=bool(cluster_ranks))
        self._memory.init_scratch(ranks.scratch_views())
        torch.cuda.synchronize(dev)

    def reset(self) -> None:
        """Clear a recorded fault and return every buffer and epoch to its initial state."""
        self._reset_local()

