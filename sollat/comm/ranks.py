"""The calling convention of the public ops: what one call passes for each launch rank.

A launch serves its launch ranks: a ``Communicator`` its own rank (each argument one tensor), a
``VirtualCommunicator`` all R (each argument a list of R tensors). ``api.py`` writes every public
op once, over lists with one entry per launch rank; each face says how its arguments become those
lists and how the lists become its results (the four hooks below). The kernel's rank table
(``abi.POINTER_LISTS``) is built from the same lists: one per tensor argument, each padded to the
table's rank count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..device.dtypes import DType
from ..errors import UnsupportedError
from .base import _CommBase


class RankConvention(_CommBase):
    """Per-launch-rank argument lists, their one shape check and the kernel's pointer table."""

    # ---- the hooks, one definition in each face (real.py, virtual.py) ---------------------------
    def _per_rank(self, value: Any, what: str, opname: str) -> list[Any]:
        """The launch ranks' values of the argument ``what`` (not None)."""
        raise NotImplementedError

    def _per_rank_or_shared(self, value: Any, what: str, opname: str) -> list[Any]:
        """As ``_per_rank``, but one tensor may serve every rank (a weight, a scale)."""
        return self._per_rank(value, what, opname)

    def _result(self, values: list[torch.Tensor]) -> Any:
        """The caller's result from the launch ranks' tensors."""
        raise NotImplementedError

    def _suffix(self, r: int) -> str:
        """What follows an argument's name in a message about launch rank ``r``'s tensor."""
        raise NotImplementedError

    # ---- shared -------------------------------------------------------------------------------
    def _per_rank_opt(self, value: Any, what: str, opname: str) -> list[Any] | None:
        return None if value is None else self._per_rank(value, what, opname)

    def _rank_inputs(self, opname: str, tensors: list[Any], what: str,
                     check: Callable[[Any, str], DType]) -> tuple[DType, list[torch.Tensor]]:
        """Every launch rank's input passes ``check`` and all have one shape and dtype (every rank
        must make the same call); returns the dtype and the inputs made contiguous.

        ``check`` may look only at a tensor's type, device, dtype and shape, so a rank whose
        tensor equals rank 0's in all four passes without it (the virtual ranks' eager path)."""
        t0 = tensors[0]
        dt = check(t0, what + self._suffix(0))
        shape, dtype, device = t0.shape, t0.dtype, t0.device
        ins = []
        for r, t in enumerate(tensors):
            if r and not (isinstance(t, torch.Tensor) and t.dtype is dtype and t.shape == shape
                          and t.device == device):
                check(t, what + self._suffix(r))
                raise UnsupportedError(f"{opname}: {what}{self._suffix(r)} is {tuple(t.shape)} {t.dtype} on "
                                       f"{t.device} but {what}{self._suffix(0)} is {tuple(shape)} {dtype} on {device}; "
                                       "every rank must pass the same shape and dtype, on this communicator's device")
            ins.append(t if t.is_contiguous() else t.contiguous())
        return dt, ins

    def _pointer_table(self, *lists: Sequence[torch.Tensor]) -> tuple[int, ...]:
        """The kernel's rank table: each list's data pointers, padded with zeros to the table's
        rank count (a real rank's table has one entry per list: no padding)."""
        ptrs: list[int] = []
        for tensors in lists:
            ptrs.extend(t.data_ptr() for t in tensors)
            ptrs.extend(self._pad)
        return tuple(ptrs)

    # ---- library paths (only a Communicator has them) ---------------------------------------------
    def _zero_copy(self, x: torch.Tensor, y: torch.Tensor) -> bool:
        """Whether an in-place call on ``x`` may use a library's zero-copy path (symmetric memory)."""
        return False

    def _library_all_reduce(self, path: str, x: torch.Tensor, y: torch.Tensor, op: str) -> None:
        raise AssertionError(f"a {type(self).__name__} never hands a call over (got {path!r})")

    def _library_gather_scatter(self, kind: str, x: torch.Tensor, y: torch.Tensor, op: str) -> None:
        raise AssertionError(f"a {type(self).__name__} never hands a call over ({kind})")
