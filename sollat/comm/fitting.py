"""How a communicator's kernels are launched so that every block runs at once: a block of one rank
waits for the same block of the others, so all of them must be co-resident. Virtual ranks retry
with fewer blocks when they do not fit; real ranks refuse (their cut must not depend on one GPU's
occupancy). Small virtual-rank grids launch as rank clusters; the fused RMSNorm as row clusters.
A mixin of the communicators (comm_base._CommBase)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..device import launch
from ..errors import UnsupportedError

CLUSTER_MAX_BLOCKS = 4  # virtual ranks: rank clusters up to this many blocks per rank (_clustered)
CLUSTER_MAX_RANKS = 8  # and of at most this many ranks: the portable thread-block cluster size


class LaunchFitting:
    # Set by the communicator's _setup (comm_base) and constructors.
    _entry: str  # "pg" (one rank per GPU) or "vr" (virtual ranks)
    _launch_ranks: int
    _num_sms: int
    _cluster_ranks: bool
    _occupancy: dict[Any, int]
    gpu_name: str
    device: torch.device

    def _fitting_launch(self, opname: str, build_for: Callable[[int], tuple[Any, Any]],
                        max_blocks: int) -> tuple[Any, Any, Any]:
        """(geometry, kernel, launch config) for at most ``max_blocks`` blocks per rank, every block
        co-resident (block b of a rank waits for block b of the others). Virtual ranks retry with
        fewer blocks; real ranks must cut every call identically (epochs agree only then), so their
        grid may not depend on this GPU's occupancy: they refuse instead."""
        while True:
            geo, kernel = build_for(max_blocks)
            row_blocks = getattr(geo, "row_blocks", 1)  # the fused RMSNorm's row clusters
            config = self._launch_config(geo.blocks, geo.threads, row_blocks)
            if self._co_resident(kernel, config, geo.blocks, geo.threads, row_blocks):
                return geo, kernel, config
            if self._entry == "pg":
                raise UnsupportedError(f"{opname}: {geo.blocks} blocks of {geo.threads} threads do not fit at once "
                                       f"on {self.gpu_name}; sollat needs a GPU with at least {geo.blocks} SMs")
            if geo.blocks == 1:
                raise UnsupportedError(f"{opname}: {self._launch_ranks} ranks x 1 block of {geo.threads} threads "
                                       f"cannot be co-resident on {self.gpu_name}")
            per_sm = self._blocks_per_sm(kernel, geo.threads)
            # Fewer blocks; for the fused RMSNorm fewer than a row's cluster means a narrower cluster
            # (its bits do not depend on the cut: rmsnorm_math.h), which build_for then chooses.
            max_blocks = max(1, min((per_sm * self._num_sms) // self._launch_ranks, geo.blocks - 1))

    def _blocks_per_sm(self, kernel: Any, threads: int) -> int:
        key = (id(kernel), threads)
        v = self._occupancy.get(key)
        if v is None:
            v = kernel.occupancy.max_active_blocks_per_multiprocessor(threads, 0)
            self._occupancy[key] = v
        return v

    def _clustered(self, blocks: int) -> bool:
        """Virtual ranks with at most CLUSTER_MAX_BLOCKS blocks per rank launch as rank clusters:
        block b of every rank forms one thread-block cluster, which the hardware starts together
        on one GPC. Measured faster at small sizes and slower at 16 blocks per rank (1 MiB) for
        R >= 4 (docs/benchmarks.md, rank clusters; the cause of the slowdown was not measured). A cluster
        holds at most CLUSTER_MAX_RANKS blocks (the portable size), so wider groups launch as a grid."""
        return self._cluster_ranks and blocks <= CLUSTER_MAX_BLOCKS and self._launch_ranks <= CLUSTER_MAX_RANKS

    def _launch_config(self, blocks: int, threads: int, row_blocks: int = 1) -> Any:
        """Grid (blocks, launch ranks) with PDL on; a rank cluster where ``_clustered``; with
        ``row_blocks`` > 1 (the fused RMSNorm) clusters of that many consecutive blocks of a rank."""
        if row_blocks > 1:  # cuda.core counts clusters in the grid
            return launch.launch_config((blocks // row_blocks, self._launch_ranks), threads, pdl=True,
                                        cluster=(row_blocks, 1))
        if self._clustered(blocks):
            return launch.launch_config((blocks, 1), threads, pdl=True, cluster=(1, self._launch_ranks))
        return launch.launch_config((blocks, self._launch_ranks), threads, pdl=True)

    def _co_resident(self, kernel: Any, config: Any, blocks: int, threads: int, row_blocks: int = 1) -> bool:
        """Whether every block of the launch can run at once (each waits for its peers' blocks)."""
        if row_blocks > 1 or self._clustered(blocks):  # launched as clusters: count those
            clusters = (blocks // row_blocks) * self._launch_ranks if row_blocks > 1 else blocks
            key = (id(kernel), threads, blocks, row_blocks, "clusters")
            v = self._occupancy.get(key)
            if v is None:
                v = kernel.occupancy.max_active_clusters(config, stream=launch.current_stream(self.device))
                self._occupancy[key] = v
            return clusters <= v
        return blocks * self._launch_ranks <= self._blocks_per_sm(kernel, threads) * self._num_sms
