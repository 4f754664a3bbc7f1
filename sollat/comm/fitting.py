"""How a communicator's kernels are launched so that every block runs at once: a block of one rank
waits for the same block of the others, so all of them must be co-resident. Virtual ranks retry
with fewer blocks when they do not fit; real ranks refuse (their cut must not depend on one GPU's
occupancy). Small virtual-rank grids launch as rank clusters; the fused RMSNorm as row clusters."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..device import launch
from ..errors import UnsupportedError

CLUSTER_MAX_BLOCKS = 4  # virtual ranks: rank clusters up to this many blocks per rank (clustered)
CLUSTER_MAX_RANKS = 8  # and of at most this many ranks: the portable thread-block cluster size


class Fitting:
    """The launch geometry rules of one communicator on one GPU, with the occupancy queries they
    need (cached per kernel). ``real``: real ranks (refuse a grid that does not fit);
    ``launch_ranks``: ranks one launch serves; ``cluster_ranks``: small virtual-rank grids launch
    as rank clusters."""

    def __init__(self, *, real: bool, launch_ranks: int, device: torch.device, gpu_name: str, num_sms: int,
                 cluster_ranks: bool) -> None:
        self.real = real
        self.launch_ranks = launch_ranks
        self.device = device
        self.gpu_name = gpu_name
        self.num_sms = num_sms
        self.cluster_ranks = cluster_ranks
        self.occupancy: dict[tuple[Any, ...], int] = {}  # (kernel, threads, ...) -> blocks or clusters

    def fit(self, opname: str, build_for: Callable[[int], tuple[Any, Any]], max_blocks: int) -> tuple[Any, Any, Any]:
        """(geometry, kernel, launch config) for at most ``max_blocks`` blocks per rank, every block
        co-resident (block b of a rank waits for block b of the others). Virtual ranks retry with
        fewer blocks; real ranks must cut every call identically (epochs agree only then), so their
        grid may not depend on this GPU's occupancy: they refuse instead."""
        while True:
            geo, kernel = build_for(max_blocks)
            row_blocks = getattr(geo, "row_blocks", 1)  # the fused RMSNorm's row clusters
            config = self.launch_config(geo.blocks, geo.threads, row_blocks)
            if self.co_resident(kernel, config, geo.blocks, geo.threads, row_blocks):
                return geo, kernel, config
            if self.real:
                raise UnsupportedError(f"{opname}: {geo.blocks} blocks of {geo.threads} threads do not fit at once "
                                       f"on {self.gpu_name}; sollat needs a GPU with at least {geo.blocks} SMs")
            if geo.blocks == 1:
                raise UnsupportedError(f"{opname}: {self.launch_ranks} ranks x 1 block of {geo.threads} threads "
                                       f"cannot be co-resident on {self.gpu_name}")
            per_sm = self.blocks_per_sm(kernel, geo.threads)
            # Fewer blocks; for the fused RMSNorm fewer than a row's cluster means a narrower cluster
            # (its bits do not depend on the cut: rmsnorm_math.h), which build_for then chooses.
            max_blocks = max(1, min((per_sm * self.num_sms) // self.launch_ranks, geo.blocks - 1))

    def blocks_per_sm(self, kernel: Any, threads: int) -> int:
        key = (id(kernel), threads)
        v = self.occupancy.get(key)
        if v is None:
            v = kernel.occupancy.max_active_blocks_per_multiprocessor(threads, 0)
            self.occupancy[key] = v
        return v

    def clustered(self, blocks: int) -> bool:
        """Virtual ranks with at most CLUSTER_MAX_BLOCKS blocks per rank launch as rank clusters:
        block b of every rank forms one thread-block cluster, which the hardware starts together
        on one GPC. Measured faster at small sizes and slower at 16 blocks per rank (1 MiB) for
        R >= 4 (docs/benchmarks.md, rank clusters; the cause of the slowdown was not measured). A cluster
        holds at most CLUSTER_MAX_RANKS blocks (the portable size), so wider groups launch as a grid."""
        return self.cluster_ranks and blocks <= CLUSTER_MAX_BLOCKS and self.launch_ranks <= CLUSTER_MAX_RANKS

    def launch_config(self, blocks: int, threads: int, row_blocks: int = 1) -> Any:
        """Grid (blocks, launch ranks) with PDL on; a rank cluster where ``clustered``; with
        ``row_blocks`` > 1 (the fused RMSNorm) clusters of that many consecutive blocks of a rank."""
        if row_blocks > 1:  # cuda.core counts clusters in the grid
            return launch.launch_config((blocks // row_blocks, self.launch_ranks), threads, pdl=True,
                                        cluster=(row_blocks, 1))
        if self.clustered(blocks):
            return launch.launch_config((blocks, 1), threads, pdl=True, cluster=(1, self.launch_ranks))
        return launch.launch_config((blocks, self.launch_ranks), threads, pdl=True)

    def co_resident(self, kernel: Any, config: Any, blocks: int, threads: int, row_blocks: int = 1) -> bool:
        """Whether every block of the launch can run at once (each waits for its peers' blocks)."""
        if row_blocks > 1 or self.clustered(blocks):  # launched as clusters: count those
            clusters = (blocks // row_blocks) * self.launch_ranks if row_blocks > 1 else blocks
            key = (id(kernel), threads, blocks, row_blocks, "clusters")
            v = self.occupancy.get(key)
            if v is None:
                v = kernel.occupancy.max_active_clusters(config, stream=launch.current_stream(self.device))
                self.occupancy[key] = v
            return clusters <= v
        return blocks * self.launch_ranks <= self.blocks_per_sm(kernel, threads) * self.num_sms
