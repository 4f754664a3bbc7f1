"""sollat: barrier-free GPU collectives near the hardware's speed of light, for PyTorch.

>>> comm = sollat.Communicator()                    # one process per GPU (torchrun)
>>> y = comm.all_reduce(x)                          # algo="auto"
>>> vcomm = sollat.VirtualCommunicator(4)           # 4 ranks on this one GPU
>>> ys = vcomm.all_reduce([x0, x1, x2, x3])
>>> # your own kernel, written with the device API (docs/custom-collectives.md)
>>> coll = sollat.custom.Collective("maxabs", pathlib.Path("maxabs.cu"))
>>> sollat.testing.inject(comm, absent=1)           # fault drills
"""

# No ``from __future__ import annotations`` here: it would leave ``annotations`` in the package's
# namespace. The version has one source, pyproject.toml, through the installed metadata
# (sollat/_version.py).

from . import testing
from ._version import VERSION as __version__
from .collectives import custom, gather_scatter, rmsnorm
from .collectives.algorithms import ALGORITHMS
from .comm.real import Communicator, VirtualCommunicator
from .errors import (
    CallMismatchError,
    CommunicatorFaultedError,
    EnvironmentValueError,
    PeerTimeoutError,
    SetupFailedError,
    SollatError,
    UnsupportedError,
)

__all__ = [
    "ALGORITHMS",
    "CallMismatchError",
    "Communicator",
    "CommunicatorFaultedError",
    "EnvironmentValueError",
    "PeerTimeoutError",
    "SetupFailedError",
    "SollatError",
    "UnsupportedError",
    "VirtualCommunicator",
    "__version__",
    "custom",
    "testing",
]
# Three modules of sollat.collectives the docs name are attributes of the package too
# (``sollat.rmsnorm.reference``, ``sollat.gather_scatter.rank_order_reduce``,
# ``sollat.custom.Collective``); they are imported by their own paths
# (``from sollat.collectives.custom import Collective``). dir() lists them beside __all__. The
# package's other modules are its inside.
_DOCUMENTED_MODULES = {"custom": custom, "gather_scatter": gather_scatter, "rmsnorm": rmsnorm}


def __dir__() -> list[str]:
    return sorted({*__all__, *_DOCUMENTED_MODULES})


def _register_ops() -> None:
    # Imported lazily by the communicators too; registering here makes torch.ops.sollat.* visible.
    from .collectives import ops  # noqa: F401


_register_ops()
