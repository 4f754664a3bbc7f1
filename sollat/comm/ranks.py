"""The launch ranks of a communicator: which ranks one launch serves, how a call passes their
tensors, and where their scratch and fault records are.

A ``Communicator`` launches for its own rank (``RealRanks``: each argument one tensor, each result
one tensor); a ``VirtualCommunicator`` for all R (``VirtualRanks``: each argument a list of R
tensors, rank r's at ``[r]``, and so is each result). ``api.py`` writes every public op once, over
lists with one entry per launch rank, and asks the communicator's ranks object how its arguments
become those lists and how the lists become its result. The kernel's rank table
(``abi.POINTER_LISTS``) is built from the same lists: one per tensor argument, each padded with
zeros to ``table_ranks`` entries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..collectives import algorithms
from ..device import layout
from ..device.dtypes import DType
from ..errors import UnsupportedError


def record_view(scratch: torch.Tensor) -> torch.Tensor:
    """The fault record in one rank's scratch, as int32 words."""
    off = layout.FAULT_RECORD_OFFSET
    return scratch[off:off + 4 * layout.FAULT_WORDS].view(torch.int32)


class RealRanks:
    """One launch rank, this process's rank ``rank`` of a process group, whose scratch is
    ``scratch`` (this rank's symmetric-memory buffer). Each argument and each result is one
    tensor; the kernel finds its rank in its ``rank_base`` argument."""

    real = True  # a process group: library paths exist, launch grids never depend on occupancy
    launch_ranks = 1
    table_ranks = 1  # the rank table holds this rank's pointers only
    pad: tuple[int, ...] = ()

    def __init__(self, rank: int, scratch: torch.Tensor) -> None:
        self.rank_base = rank
        self.scratch = scratch

    def per_rank(self, value: Any, what: str, opname: str) -> list[Any]:
        """The launch ranks' values of the argument ``what`` (not None)."""
        return [value]

    def per_rank_or_shared(self, value: Any, what: str, opname: str) -> list[Any]:
        """As ``per_rank``, where one tensor may serve every rank (a weight, a scale)."""
        return [value]

    def result(self, values: list[torch.Tensor]) -> torch.Tensor:
        """The caller's result from the launch ranks' tensors."""
        return values[0]

    def suffix(self, r: int) -> str:
        """What follows an argument's name in a message about launch rank ``r``'s tensor."""
        return ""

    def scratch_views(self) -> list[torch.Tensor]:
        """Each launch rank's scratch."""
        return [self.scratch]

    def record_views(self) -> list[tuple[int, torch.Tensor]]:
        """(rank, its fault record as int32 words) for every launch rank."""
        return [(self.rank_base, record_view(self.scratch))]

    def record_args(self, scratch_ptrs: Sequence[int]) -> tuple[int, int]:
        """Kernel arguments: address of launch rank 0's fault record, bytes to the next one."""
        return scratch_ptrs[self.rank_base] + layout.FAULT_RECORD_OFFSET, 0


class VirtualRanks:
    """``world_size`` launch ranks in this process, rank r's scratch the r-th equal slice of
    ``scratch``. Each argument and each result is a list of one tensor per rank; the kernel's
    rank is its ``blockIdx.y`` (``rank_base`` 0) and its rank table has a slot for every rank up
    to the kernels' rank cap."""

    real = False
    rank_base = 0

    def __init__(self, world_size: int, scratch: torch.Tensor) -> None:
        self.world_size = world_size
        self.launch_ranks = world_size
        self.table_ranks = algorithms.max_ranks_template(world_size)
        self.pad = (0,) * (self.table_ranks - world_size)
        self.scratch = scratch

    def per_rank(self, value: Any, what: str, opname: str) -> list[Any]:
        ws = self.world_size
        if isinstance(value, torch.Tensor) or not isinstance(value, Sequence) or len(value) != ws:
            got = ("a single tensor" if isinstance(value, torch.Tensor) else f"{len(value)} tensors"
                   if isinstance(value, Sequence) else type(value).__name__)
            raise UnsupportedError(f"{opname}: a VirtualCommunicator of {ws} ranks needs {what} as a list of {ws} "
                                   f"tensors, got {got}")
        return list(value)

    def per_rank_or_shared(self, value: Any, what: str, opname: str) -> list[Any]:
        return [value] * self.world_size if isinstance(value, torch.Tensor) else self.per_rank(value, what, opname)

    def result(self, values: list[torch.Tensor]) -> list[torch.Tensor]:
        return values

    def suffix(self, r: int) -> str:
        return f"[{r}]"

    def scratch_views(self) -> list[torch.Tensor]:
        per = self.scratch.numel() // self.world_size
        return [self.scratch[r * per:(r + 1) * per] for r in range(self.world_size)]

    def record_views(self) -> list[tuple[int, torch.Tensor]]:
        return [(r, record_view(v)) for r, v in enumerate(self.scratch_views())]

    def record_args(self, scratch_ptrs: Sequence[int]) -> tuple[int, int]:
        return scratch_ptrs[0] + layout.FAULT_RECORD_OFFSET, self.scratch.numel() // self.world_size


Ranks = RealRanks | VirtualRanks


def per_rank_opt(ranks: Ranks, value: Any, what: str, opname: str) -> list[Any] | None:
    """``ranks.per_rank`` of an optional argument (None stays None)."""
    return None if value is None else ranks.per_rank(value, what, opname)


def same_call(ranks: Ranks, opname: str, tensors: list[Any], what: str,
              check: Callable[[Any, str], DType]) -> tuple[DType, list[torch.Tensor]]:
    """Every launch rank's input passes ``check`` and all have one shape and dtype (every rank
    must make the same call); returns the dtype and the inputs made contiguous.

    ``check`` may look only at a tensor's type, device, dtype and shape, so a rank whose
    tensor equals rank 0's in all four passes without it (the virtual ranks' eager path)."""
    t0 = tensors[0]
    dt = check(t0, what + ranks.suffix(0))
    shape, dtype, device = t0.shape, t0.dtype, t0.device
    ins = []
    for r, t in enumerate(tensors):
        if r and not (isinstance(t, torch.Tensor) and t.dtype is dtype and t.shape == shape
                      and t.device == device):
            check(t, what + ranks.suffix(r))
            raise UnsupportedError(f"{opname}: {what}{ranks.suffix(r)} is {tuple(t.shape)} {t.dtype} on "
                                   f"{t.device} but {what}{ranks.suffix(0)} is {tuple(shape)} {dtype} on {device}; "
                                   "every rank must pass the same shape and dtype, on this communicator's device")
        ins.append(t if t.is_contiguous() else t.contiguous())
    return dt, ins


def pointer_table(ranks: Ranks, *lists: Sequence[torch.Tensor]) -> tuple[int, ...]:
    """The kernel's rank table: each list's data pointers, padded with zeros to the table's
    rank count (a real rank's table has one entry per list: no padding)."""
    ptrs: list[int] = []
    for tensors in lists:
        ptrs.extend(t.data_ptr() for t in tensors)
        ptrs.extend(ranks.pad)
    return tuple(ptrs)
