"""The built-in AllGather and ReduceScatter on a communicator (``sollat.gather_scatter`` has the
shape rules, the size rule and the references): argument checks, the output tensor, and the plan
of one call (cached; a new call shape is compiled and agreed on by every rank before its first
launch, as for ``all_reduce``). Both communicators mix it in; their ``all_gather`` /
``reduce_scatter`` methods add the tensor handling of their calling convention and launch through
``_CommBase._launch`` (stream ordering, CUDA-graph capture).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..collectives import gather_scatter
from ..collectives.select import NCCL
from ..device.dtypes import DTYPES, OPS, DType
from ..errors import UnsupportedError
from .base import _CommBase, _Plan


class GatherScatterCalls(_CommBase):
    """``all_gather`` / ``reduce_scatter`` support shared by ``Communicator`` and ``VirtualCommunicator``."""

    _gather_scatter: bool = False  # set by _setup (read-only default)

    @property
    def gather_scatter(self) -> bool:
        """Whether this communicator has the built-in AllGather/ReduceScatter scratch regions."""
        return self._gather_scatter

    def _gs_args(self, kind: str, op: str, algo: str) -> None:
        """The call's op and algo (before any tensor is looked at)."""
        if kind == "reduce_scatter" and op not in OPS:
            raise UnsupportedError(f"reduce_scatter: op {op!r} is not supported; supported ops: {', '.join(OPS)}")
        if not isinstance(algo, str) or algo not in gather_scatter.ALGOS:
            raise UnsupportedError(f"{kind}: algo must be one of {', '.join(gather_scatter.ALGOS)}, got {algo!r}")
        if algo == NCCL and self._entry != "pg":
            raise UnsupportedError(f"{kind}: algo='nccl' needs a process group (Communicator), not a VirtualCommunicator")
        if algo == NCCL and kind == "reduce_scatter" and self._batch_invariant:
            raise UnsupportedError("reduce_scatter: algo='nccl' hands the call to torch.distributed, whose reduction "
                                   "order is not fixed; this communicator is batch-invariant (batch_invariant=True or "
                                   "SOLLAT_BATCH_INVARIANT=1): use 'auto', 'll' or 'sentinel'")

    @staticmethod
    def _gs_dtype_of(kind: str) -> Callable[[torch.dtype, str], DType]:
        def dtype_of(d: torch.dtype, what: str) -> DType:
            dt = DTYPES.get(d)
            if dt is None:
                ok = ", ".join(str(t).replace("torch.", "") for t in DTYPES)
                raise UnsupportedError(f"{kind}: {what} has dtype {d}; supported: {ok}")
            return dt

        return dtype_of

    def _gs_tensor(self, kind: str, x: Any, what: str) -> DType:
        return self._collective_tensor(kind, x, what, self._gs_dtype_of(kind))

    def _gs_out(self, kind: str, x: torch.Tensor, out: Any, what: str) -> torch.Tensor:
        """``out`` checked (or a new tensor): contiguous, on this device, the input's dtype, the
        call's output shape (all_gather also takes the concatenated shape)."""
        ws = self.world_size
        if kind == "all_gather":
            return self._collective_out(kind, x, out, what, gather_scatter.gather_shape(x.shape, ws),
                                        self._gs_dtype_of(kind),
                                        lambda shape: gather_scatter.gather_out_ok(shape, x.shape, ws))
        return self._collective_out(kind, x, out, what, gather_scatter.scatter_shape(x.shape, ws),
                                    self._gs_dtype_of(kind))

    def _gs_into(self, kind: str, y: torch.Tensor, out: Any, x: torch.Tensor, what: str) -> torch.Tensor:
        """Under torch.compile: the custom op's new ``y``, copied into ``out`` when one is given
        (checked like an eager ``out``; the compiler may turn the copy back into a direct write)."""
        if out is None:
            return y
        self._gs_out(kind, x, out, what)
        return out.copy_(y.reshape(out.shape))

    @staticmethod
    def _gs_no_overlap(kind: str, ins: list[torch.Tensor], out: torch.Tensor, what: str) -> None:
        """Other threads (and, on virtual ranks, other ranks) write ``out`` while inputs are read."""
        o0, o1 = out.data_ptr(), out.data_ptr() + out.numel() * out.element_size()
        for x in ins:
            x0 = x.data_ptr()
            if out.numel() and x.numel() and o0 < x0 + x.numel() * x.element_size() and x0 < o1:
                raise UnsupportedError(f"{kind}: {what} overlaps an input or another output; each output must be a separate tensor")

    def _invariant_reduce_scatter(self, nbytes_per_peer: int) -> str:
        """Batch-invariant mode: the sollat ReduceScatter where ``auto`` would hand the call to
        torch.distributed (above the size rule: the sentinel, which serves every size in passes),
        or a clear error where there is none (no built-in scratch)."""
        if not self._gather_scatter:
            raise UnsupportedError("reduce_scatter: this communicator is batch-invariant, which needs sollat's rank-order "
                                   "ReduceScatter, but it was constructed with gather_scatter=False (no scratch for it); "
                                   "construct it with gather_scatter=True")
        return gather_scatter.resolve("reduce_scatter", "sentinel", nbytes_per_peer, library=self._entry == "pg",
                                      enabled=True)

    def _gs_plan(self, kind: str, n: int, dt: DType, op: str, algo: str) -> _Plan | str:
        """Plan of one call or ``"nccl"`` (cached). A new call shape is compiled, then agreed on by
        every rank (comm/agree.py) before its first launch."""
        key = ("gather_scatter", kind, n, dt.torch_dtype, op, algo)
        entry = self._calls.get(key)
        if entry is None:
            nbytes = gather_scatter.bytes_per_peer(kind, n, dt.size, self.world_size)
            name = gather_scatter.resolve(kind, algo, nbytes, library=self._entry == "pg", enabled=self._gather_scatter)
            if name == NCCL and kind == "reduce_scatter" and self._batch_invariant:
                name = self._invariant_reduce_scatter(nbytes)
            entry = NCCL if name == NCCL else self._plan(name, dt, op, n)
            self._agreement.agree(f"{kind}:{name}|{dt.short}|{op}|n={n}", "this call (algorithm|dtype|op|elements)")
            self._calls[key] = entry
        return entry
