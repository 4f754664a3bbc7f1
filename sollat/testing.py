"""Fault injection for tests and drills (public: the real-rank suite and users' own tests use it),
and the hooks of the diagnostic scripts (scripts/): diagnostic kernel builds (``set_defines``),
a launch-geometry override (``override_block_threads``) and host-overhead probes
(``bare_launch``, ``borrowed_communicator``). The scripts use no private member of
the library.

With ``inject``, kernels are built with ``SOLLAT_TEST_HOOKS`` (production builds never read the hooks), and
the hooks are read from device memory at run time, so they can be turned on after a CUDA graph
was captured with them (``inject`` first with no hook, capture, then ``inject`` the fault).

* ``absent=r``: every kernel of rank r returns at once without sending (a peer that died or never
  arrived); its peers time out, name r, and every rank raises.
* ``mismatch=r``: rank r flips a bit of its call signature (a peer that called with other
  arguments); LL-flagged algorithms detect it on the device.

On real ranks the absent rank's call returns at once without committing its epochs, so that rank
must make no further call until the fault has been raised (``check()``) and ``reset()`` ran: a
further call would send the next call's lines under the faulted call's epochs (a real dead peer
makes no further calls; the protocol model, docs/protocol-model.md, shows the difference).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from .device import launch, layout
from .device.dtypes import DTYPES


def _communicator(comm: Any, who: str) -> Any:
    """``comm`` if it is a sollat communicator, else an UnsupportedError naming what it got."""
    from .comm.api import _Communicator
    from .errors import UnsupportedError

    if not isinstance(comm, _Communicator):
        raise UnsupportedError(f"sollat.testing.{who}: comm must be a sollat.Communicator or "
                               f"sollat.VirtualCommunicator, got {comm!r} ({type(comm).__name__})")
    return comm


def _rank_or_none(value: object, what: str, comm: Any) -> None:
    from .errors import UnsupportedError

    ws = comm.world_size
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < ws):
        raise UnsupportedError(f"sollat.testing.inject: {what} must be a rank 0..{ws - 1} or None, got {value!r}")


def inject(comm: Any, *, absent: int | None = None, mismatch: int | None = None, armed: bool = True) -> None:
    """Turn the hooks on for ``comm`` (call it on every rank; it synchronises this device).
    ``armed=True`` with no fault builds the hook-reading kernels without a fault, for capture.
    ``absent`` and ``mismatch`` are ranks of ``comm`` (or None)."""
    comm = _communicator(comm, "inject")
    _rank_or_none(absent, "absent", comm)
    _rank_or_none(mismatch, "mismatch", comm)
    comm._set_test_hooks(absent=absent, mismatch=mismatch, armed=armed)


def clear(comm: Any) -> None:
    """Back to production kernels, no fault injected."""
    _communicator(comm, "clear")._set_test_hooks(absent=None, mismatch=None, armed=False)


def set_defines(comm: Any, defines: dict[str, str], *, kernel_files: Mapping[str, str] | None = None) -> None:
    """Extra NVRTC defines for every kernel ``comm`` builds from now on (diagnostic builds, such
    as ``SOLLAT_FENCE_SYS=0`` to measure what the system-scope fences cost). ``kernel_files``
    (algorithm -> file of csrc/kernels or csrc/probes, e.g. ``{"oneshot_ll": "my_variant.cu"}``) builds
    those algorithms from another kernel file with the same entry points instead. Results of such
    builds may be wrong on purpose; call it on every rank. ``set_defines(comm, {})`` undoes it."""
    comm._extra_defines = defines
    comm._set_kernel_files(dict(kernel_files or {}))


@contextlib.contextmanager
def override_block_threads(block_threads: int) -> Iterator[None]:
    """Inside the block, every launch geometry planned from now on (``layout.plan``: new
    communicators, or sizes a communicator has not planned yet) uses ``block_threads`` threads
    per block while a message can still spread over more blocks (geometry sweeps). Plans made
    inside stay cached by their communicator; make a fresh one per setting."""
    default = layout.plan
    layout.plan = functools.partial(default, block_threads=block_threads)
    try:
        yield
    finally:
        layout.plan = default


def _dtype_of(t: Any) -> Any:
    return DTYPES[t.dtype]


def bare_launch(comm: Any, inputs: Sequence[Any], outputs: Sequence[Any], *, algo: str,
                op: str = "sum") -> Callable[[], None]:
    """A function of no argument that launches the kernel ``comm.all_reduce(inputs, algo=algo,
    out=outputs)`` of a VirtualCommunicator launches, with the same prepacked arguments, and does
    nothing else (no checks, no stream ordering): what the launch alone costs on the host."""
    plan = comm._call_plan(inputs[0].numel(), _dtype_of(inputs[0]), op, algo, False)
    pad = comm._ranks.pad
    ptrs = (*[t.data_ptr() for t in inputs], *pad, *[o.data_ptr() for o in outputs], *pad)
    dev_index = comm.device.index or 0
    bound = plan.bound
    return lambda: bound(launch.stream_handle(dev_index), ptrs)


def borrowed_communicator(vc: Any, launch_fn: Callable[[], None]) -> Any:
    """A ``Communicator`` (one rank per process) that borrows VirtualCommunicator ``vc``'s state
    and runs ``launch_fn()`` where it would launch its kernel: ``Communicator.all_reduce``'s host
    hot path, measured on one GPU without a process group. Every call runs ``launch_fn`` (a real
    kernel, e.g. from ``bare_launch``); everything else is Communicator's own code. For host
    overhead measurements only: its results are those of ``launch_fn``'s arguments."""
    from .collectives.handover import SymmetricTensors
    from .comm.ranks import RealRanks
    from .comm.real import Communicator

    comm = object.__new__(Communicator)
    comm.__dict__.update(vc.__dict__)
    comm._ranks = RealRanks(0, vc._ranks.scratch_views()[0])  # one tensor per argument: the hot path's convention
    comm._launch = lambda _plan, _ptrs: launch_fn()  # the checked path's launch
    comm._calls = _PlansLaunching(launch_fn)  # the hot path's: every plan it caches launches launch_fn
    comm._symm = SymmetricTensors("", vc.device)  # holds nothing: no call is zero-copy
    return comm


class _PlansLaunching(dict):  # type: ignore[type-arg]
    """A call cache whose plans launch ``launch_fn()`` instead of their kernel (borrowed_communicator)."""

    def __init__(self, launch_fn: Callable[[], None]) -> None:
        super().__init__()
        self._launch_fn = launch_fn

    def __setitem__(self, key: Any, plan: Any) -> None:
        from .comm.plan import _Plan

        if isinstance(plan, _Plan):
            fn = self._launch_fn
            plan = dataclasses.replace(plan, bound=lambda _stream, _ptrs: fn())
        super().__setitem__(key, plan)
