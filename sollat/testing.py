"""Fault injection for tests and drills (public: the real-rank suite and users' own tests use it).

Kernels are then built with ``SOLLAT_TEST_HOOKS`` (production builds never read the hooks), and
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

from collections.abc import Mapping
from typing import Any


def inject(comm: Any, *, absent: int | None = None, mismatch: int | None = None, armed: bool = True) -> None:
    """Turn the hooks on for ``comm`` (call it on every rank; it synchronises this device).
    ``armed=True`` with no fault builds the hook-reading kernels without a fault, for capture."""
    comm._set_test_hooks(absent=absent, mismatch=mismatch, armed=armed)


def clear(comm: Any) -> None:
    """Back to production kernels, no fault injected."""
    comm._set_test_hooks(absent=None, mismatch=None, armed=False)


# Diagnostic kernel (not a production instantiation): the one-shot cut into pieces, selected by
# SOLLAT_BREAKDOWN 0..4; SOLLAT_PROTO=ProtoLLReset makes LL clear its lines like the sentinel.
DIAG_ONESHOT_BREAKDOWN = "diag_oneshot_breakdown.cu"


def set_defines(comm: Any, defines: dict[str, str], *, kernel_files: Mapping[str, str] | None = None) -> None:
    """Extra NVRTC defines for every kernel ``comm`` builds from now on (diagnostic builds, such
    as ``SOLLAT_FENCE_SYS=0`` to measure what the system-scope fences cost). ``kernel_files``
    (algorithm -> file of csrc/kernels, e.g. ``{"oneshot_ll": DIAG_ONESHOT_BREAKDOWN}``) builds
    those algorithms from a diagnostic kernel with the same entry points instead. Results of such
    builds may be wrong on purpose; call it on every rank. ``set_defines(comm, {})`` undoes it."""
    comm._extra_defines = defines
    comm._set_kernel_files(dict(kernel_files or {}))
