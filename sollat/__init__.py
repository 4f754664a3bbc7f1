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
# namespace. The version has one source, pyproject.toml: read there in a source checkout, from the
# installed metadata otherwise (sollat/_version.py).
import sys as _sys
from pathlib import Path as _Path

from . import testing
from ._version import package_version as _package_version
from .collectives import custom, gather_scatter, rmsnorm
from .collectives.algorithms import ALGORITHMS
from .comm.real import Communicator, VirtualCommunicator
from .errors import (
    CallMismatchError,
    CommunicatorFaultedError,
    PeerTimeoutError,
    SollatError,
    UnsupportedError,
)

__version__ = _package_version(_Path(__file__).resolve().parent)

__all__ = [
    "ALGORITHMS",
    "CallMismatchError",
    "Communicator",
    "CommunicatorFaultedError",
    "PeerTimeoutError",
    "SollatError",
    "UnsupportedError",
    "VirtualCommunicator",
    "__version__",
    "custom",
    "testing",
]
# Modules README names by path (sollat.rmsnorm.algo_reference, sollat.gather_scatter.*_reference,
# sollat.custom.Collective): they live in sollat.collectives and are importable under these names
# too (``import sollat.rmsnorm``, ``from sollat.custom import Collective``); dir() lists them
# beside __all__. The package's other modules are its inside.
_DOCUMENTED_MODULES = {"custom": custom, "gather_scatter": gather_scatter, "rmsnorm": rmsnorm}
for _name, _module in _DOCUMENTED_MODULES.items():
    _sys.modules[f"{__name__}.{_name}"] = _module


def __dir__() -> list[str]:
    return sorted({*__all__, *_DOCUMENTED_MODULES})


def _register_ops() -> None:
    # Imported lazily by the communicators too; registering here makes torch.ops.sollat.* visible.
    from .collectives import ops  # noqa: F401


_register_ops()
