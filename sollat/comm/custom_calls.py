"""Running user-written collectives (``sollat.custom.Collective``) on a communicator: argument
checks, planning (``_CommBase._plan``, the same as for the AllReduce: geometry, compile, occupancy,
prepacked launch) and the first-use agreement. Both communicators mix it in; their ``run`` methods
(``comm/real.py``, ``virtual.py``) add the tensor handling of their own calling convention and
launch through ``_CommBase._launch`` (stream ordering, CUDA-graph capture) like ``all_reduce``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..collectives.algorithms import CustomAlgorithm
from ..collectives.custom import Collective
from ..device.dtypes import DTYPES, DType
from ..errors import UnsupportedError
from .base import _CommBase, _Plan


class CustomCalls(_CommBase):
    """``run`` support shared by ``Communicator`` and ``VirtualCommunicator``."""

    _collectives: dict[str, Collective] = {}  # none until _register_collectives (read-only default)

    def _register_collectives(self, collectives: Sequence[Collective]) -> tuple[CustomAlgorithm, ...]:
        """Remember the collectives registered at construction; their algorithms get regions."""
        self._collectives = {c.name: c for c in collectives}
        return tuple(c.algorithm for c in collectives)

    @property
    def collectives(self) -> tuple[str, ...]:
        """Names of the user-written collectives registered at construction."""
        return tuple(self._collectives)

    def _collective(self, coll: Any, compiling: bool = False) -> CustomAlgorithm:
        """The registered algorithm of ``coll`` (a Collective or its name), or a clear error."""
        if compiling:
            raise UnsupportedError("run: user-written collectives have no torch.compile custom op yet; call run "
                                   "outside the compiled region or wrap it in torch.compiler.disable")
        name = coll.name if isinstance(coll, Collective) else coll
        if not isinstance(name, str):
            raise TypeError(f"run: the collective must be a sollat.custom.Collective or its name, got {type(coll).__name__}")
        mine = self._collectives.get(name)
        if mine is None:
            here = ", ".join(self._collectives) or "none"
            raise UnsupportedError(f"run: collective {name!r} is not registered on this communicator (registered: "
                                   f"{here}); pass it at construction: collectives=[...]")
        if isinstance(coll, Collective) and coll is not mine and coll.describe() != mine.describe():
            raise UnsupportedError(f"run: collective {name!r} differs from the one registered under that name "
                                   f"(given {coll.describe()}; registered {mine.describe()}); a changed source or "
                                   "option needs a new communicator")
        return mine.algorithm

    @staticmethod
    def _run_dtype_of(alg: CustomAlgorithm) -> Callable[[torch.dtype, str], DType]:
        def dtype_of(d: torch.dtype, what: str) -> DType:
            alg.check(d, "")  # a clear error for a dtype the collective does not take
            return DTYPES[d]

        return dtype_of

    def _run_tensor(self, alg: CustomAlgorithm, x: Any, what: str) -> DType:
        return self._collective_tensor(alg.opname, x, what, self._run_dtype_of(alg))

    def _run_out_shape(self, alg: CustomAlgorithm, x: torch.Tensor) -> tuple[int, ...]:
        return (self.world_size, *x.shape) if alg.gathers else tuple(x.shape)

    def _run_out(self, alg: CustomAlgorithm, x: torch.Tensor, out: Any, what: str) -> torch.Tensor:
        """``out`` checked (or a new tensor): contiguous, on this device, the input's dtype and the
        collective's output shape. An input may be its own output where the kernel allows it."""
        return self._collective_out(alg.opname, x, out, what, self._run_out_shape(alg, x), self._run_dtype_of(alg))

    def _run_plan(self, alg: CustomAlgorithm, n: int, dt: DType) -> _Plan:
        """As ``_call_plan``: cached; a new call shape is compiled (the user's source, this
        communicator's defines), then agreed on by every rank before its first launch."""
        key = ("custom", alg.name, n, dt.torch_dtype)
        entry = self._calls.get(key)
        if entry is None:
            entry = self._plan(alg.name, dt, "", n)
            self._agreement.agree(f"{alg.name}|{dt.short}|n={n}", "this call (collective|dtype|elements)")
            self._calls[key] = entry
        assert not isinstance(entry, str)
        return entry
