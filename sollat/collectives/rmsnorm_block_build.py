"""The one-block-per-row fused AllReduce + RMSNorm kernel's build facts
(kernels/allreduce_rmsnorm_block.cu): which of its algorithms pipeline their passes, and its
threads per block by instantiation."""

from __future__ import annotations

from ..device import abi

# The one-block-per-row algorithms whose passes are pipelined (SOLLAT_RMSNORM_BLOCK_PIPE=1).
RMSNORM_BLOCK_PIPELINED = frozenset({"rmsnorm_oneshot_ll_block_pipe"})
# The one-block-per-row kernel's threads per block (its __launch_bounds__, module define
# SOLLAT_RMSNORM_BLOCK_THREADS) by (rank cap, slots): abi.MAX_THREADS where its 128 registers per
# thread hold the instantiation without a spill for sm_90 and sm_100 (ptxas -v), else 256 (up to
# 255 registers). The (4, 2) build's FP8 variant spilled at 512 for sm_100 (16-bit types).
# The pipelined build (RMSNORM_BLOCK_PIPELINED) keeps a second buffer and the next pass's lines:
# at 512 threads its (4, 2) instantiations spilled (16 bytes, 16-bit types). The slots each build
# has (algorithms.py) are those that fit 255 registers: 4 slots at 8 ranks (and, pipelined, at 4)
# spilled for sm_100.
RMSNORM_BLOCK_WIDE_THREADS: frozenset[tuple[int, int]] = frozenset({(2, 1), (2, 2), (4, 1)})
RMSNORM_BLOCK_PIPE_WIDE_THREADS: frozenset[tuple[int, int]] = frozenset({(2, 1), (2, 2), (4, 1)})
RMSNORM_BLOCK_NARROW_THREADS = 256


def rmsnorm_block_threads(max_ranks: int, slots: int, pipelined: bool = False) -> int:
    """Most threads per block of the one-block-per-row fused kernel's (rank cap, slots) instantiation
    (``pipelined``: its build with pipelined passes)."""
    wide = RMSNORM_BLOCK_PIPE_WIDE_THREADS if pipelined else RMSNORM_BLOCK_WIDE_THREADS
    return abi.MAX_THREADS if (max_ranks, slots) in wide else RMSNORM_BLOCK_NARROW_THREADS
