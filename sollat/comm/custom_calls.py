"""User-written collectives (``sollat.custom.Collective``) on a communicator: which registered
collective a ``run`` call names, and the checks of its tensors. ``api.py``'s ``run`` calls these,
then plans the call like any other (``plan.Kernels.plan``: geometry, compile, occupancy,
prepacked launch) and launches it like ``all_reduce`` (stream ordering, CUDA-graph capture)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..collectives.algorithms import CustomAlgorithm
from ..collectives.custom import Collective
from ..device.dtypes import DTYPES, DType
from ..errors import UnsupportedError
from .checks import collective_out, collective_tensor


def registered(collectives: Mapping[str, Collective], coll: Any, compiling: bool = False) -> CustomAlgorithm:
    """The algorithm of ``coll`` (a Collective or its name) among the ``collectives`` registered
    at construction, or a clear error."""
    if compiling:
        raise UnsupportedError("run: user-written collectives have no torch.compile custom op yet; call run "
                               "outside the compiled region or wrap it in torch.compiler.disable")
    name = coll.name if isinstance(coll, Collective) else coll
    if not isinstance(name, str):
        raise TypeError(f"run: the collective must be a sollat.custom.Collective or its name, got {type(coll).__name__}")
    mine = collectives.get(name)
    if mine is None:
        here = ", ".join(collectives) or "none"
        raise UnsupportedError(f"run: collective {name!r} is not registered on this communicator (registered: "
                               f"{here}); pass it at construction: collectives=[...]")
    if isinstance(coll, Collective) and coll is not mine and coll.describe() != mine.describe():
        raise UnsupportedError(f"run: collective {name!r} differs from the one registered under that name "
                               f"(given {coll.describe()}; registered {mine.describe()}); a changed source or "
                               "option needs a new communicator")
    return mine.algorithm


def dtype_of(alg: CustomAlgorithm) -> Callable[[torch.dtype, str], DType]:
    """The dtype rule of ``alg``'s tensors: the dtypes its source declares."""
    def check(d: torch.dtype, what: str) -> DType:
        alg.check(d, "")  # a clear error for a dtype the collective does not take
        return DTYPES[d]

    return check


def check_tensor(alg: CustomAlgorithm, x: Any, what: str, device: torch.device) -> DType:
    """An input of ``alg`` on ``device``."""
    return collective_tensor(alg.opname, x, what, device, dtype_of(alg))


def out_tensor(alg: CustomAlgorithm, x: torch.Tensor, out: Any, what: str, world_size: int,
               device: torch.device) -> torch.Tensor:
    """``out`` checked (or a new tensor): contiguous, on ``device``, the input's dtype and the
    collective's output shape (``[world_size, *x.shape]`` for a gathering one). An input may be
    its own output where the kernel allows it."""
    shape = (world_size, *x.shape) if alg.gathers else tuple(x.shape)
    return collective_out(alg.opname, x, out, what, device, shape, dtype_of(alg))
