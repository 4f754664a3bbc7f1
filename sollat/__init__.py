"""sollat: barrier-free GPU collectives near the hardware's speed of light, for PyTorch.

>>> comm = sollat.Communicator()                    # one process per GPU (torchrun)
>>> y = comm.all_reduce(x)                          # algo="auto"
>>> vcomm = sollat.VirtualCommunicator(4)           # 4 ranks on this one GPU
>>> ys = vcomm.all_reduce([x0, x1, x2, x3])
>>> # your own kernel, written with the device API (docs/custom-collectives.md)
>>> coll = sollat.custom.Collective("maxabs", pathlib.Path("maxabs.cu"))
"""

from __future__ import annotations

from . import custom
from .algorithms import ALGORITHMS
from .communicator import Communicator, VirtualCommunicator
from .errors import (
    CallMismatchError,
    CommunicatorFaultedError,
    PeerTimeoutError,
    SollatError,
    UnsupportedError,
)

__version__ = "0.1.0"

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
]


def _register_ops() -> None:
    # Imported lazily by the communicators too; registering here makes torch.ops.sollat.* visible.
    from . import ops  # noqa: F401


_register_ops()
