"""Device state of a communicator: the state block the kernels read, the scratch's initial
contents, the fault records and the host-mapped fault flag, check() and reset(), the test hooks.

A mixin of ``comm_base._CommBase`` (same object, same attributes); the memory layout it fills is
``layout.py``'s, the fault semantics are ``faults.py``'s and ``csrc/include/sollat/fault.h``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..collectives.algorithms import Algorithm, Region, regions
from ..device import abi, faults, launch, layout

_STATE_FMT = abi.STATE_FORMAT  # CommState (abi.py, rendered into abi.h)


class DeviceState:
    """Memory and fault handling of ``_CommBase`` (see there for the attributes it sets up)."""

    world_size: int
    device: torch.device
    timeout_s: float
    debug: bool
    _algos: tuple[str, ...]
    _regions: tuple[Region, ...]
    _region_off: dict[str, int]
    _scratch_ptrs: list[int]
    _epochs: dict[str, torch.Tensor]
    _state: torch.Tensor
    _err_host: np.ndarray
    _err_host_dev: int
    _faulted: bool
    max_blocks: int
    _test_hooks: bool
    _calls: dict[Any, Any]
    _peek_stream: Any
    _peek_host: Any

    def _guard(self) -> None:
        raise NotImplementedError

    # ---- memory ------------------------------------------------------------------------------
    def _write_state(self, absent_rank: int = -1, mismatch_rank: int = -1) -> None:
        ptrs = list(self._scratch_ptrs) + [0] * (abi.MAX_RANKS - len(self._scratch_ptrs))
        raw = abi.pack_state({"scratch": ptrs, "err_host": self._err_host_dev, "timeout_ns": int(self.timeout_s * 1e9),
                              "absent_rank": absent_rank, "mismatch_rank": mismatch_rank})
        self._state.copy_(torch.frombuffer(bytearray(raw), dtype=torch.uint8))

    def _init_scratch(self, views: Sequence[torch.Tensor]) -> None:
        """Control block (fault record) at 0; each region at its protocol's rest byte (abi.REST_BYTE:
        LL 0, as flag 0 is never valid; sentinel all ones, empty in every dtype), except a sentinel
        region's signature words (the SIGNATURE_SLOT lines of every block of every (parity,
        source) part, layout.signature_word), which are 0: an empty signature word is 0
        (ll_buffer.h)."""
        for v in views:
            v[:layout.CONTROL_BYTES].zero_()
            for reg in self._regions:
                off = self._region_off[reg.name]
                region = v[off:off + reg.alg.scratch_bytes(self.world_size, reg.blocks)]
                region.fill_(abi.REST_BYTE[reg.alg.proto])
                if abi.REST_BYTE[reg.alg.proto] != 0:
                    # parts x blocks x slots x (threads' lines): the signature slot of every block
                    slots = region.view(-1, reg.blocks, layout.MAX_SLOTS, layout.MAX_THREADS * layout.LINE_BYTES)
                    slots[:, :, layout.SIGNATURE_SLOT].zero_()

    def check(self, sync: bool = True) -> None:
        """Raise the fault recorded by an earlier call of any rank, if any.

        ``sync=True`` waits for this device's work first (every stream), so every fault of a
        call issued so far that reached this rank is seen. ``sync=False`` is the cheap check for
        after a CUDA-graph replay: it waits for nothing; it reads the host-mapped flag that this
        rank's kernels set when they meet a fault, and this rank's fault records as they are now
        (a 32-byte copy on a private stream, about as long as a small kernel launch), so a fault
        that a peer wrote into this rank's record is seen even when no kernel of this rank has
        run since.
        """
        if sync:
            torch.cuda.synchronize(self.device)
        self._raise_recorded(peek=not sync)

    def _raise_recorded(self, peek: bool = False) -> None:
        for rank, view in self._record_views():
            rec = faults.read_record(lambda v=view: self._read_now(v) if peek else v.cpu().numpy())
            if rec[0] != layout.FAULT_OK:
                self._faulted = True
                raise faults.to_exception(rec, timeout_s=self.timeout_s, where_seen=rank)

    def _read_now(self, view: torch.Tensor) -> np.ndarray:
        """The words of ``view`` as they are now, without waiting for the work queued on any
        other stream (a relaxed snapshot: a record being written reads as claimed, and
        faults.read_record reads it again)."""
        if self._peek_stream is None:
            self._peek_stream = torch.cuda.Stream(self.device)
            self._peek_host = torch.empty(view.numel(), dtype=view.dtype).pin_memory()
        with torch.cuda.stream(self._peek_stream):
            self._peek_host.copy_(view, non_blocking=True)
        self._peek_stream.synchronize()
        return self._peek_host.numpy().copy()

    def _record_views(self) -> list[tuple[int, torch.Tensor]]:
        """(rank, its fault record as int32 words) for every rank this process runs."""
        raise NotImplementedError

    def _record_args(self) -> tuple[int, int]:
        """Kernel arguments: address of launch rank 0's fault record, bytes to the next one."""
        raise NotImplementedError

    def _reset_local(self, views: Sequence[torch.Tensor]) -> None:
        torch.cuda.synchronize(self.device)
        for e in self._epochs.values():
            e.zero_()
        self._init_scratch(views)
        self._err_host[:] = 0
        self._faulted = False
        torch.cuda.synchronize(self.device)

    def _before_call(self) -> None:
        """A fault already seen here, or flagged by a kernel of this process, is raised before
        anything new is launched (the flag read costs no synchronisation)."""
        if self._faulted:
            self._guard()
        if self._err_host[0] != 0 and not launch.is_capturing():
            self.check()

    def _after_call(self) -> None:
        if self.debug and not launch.is_capturing():
            self.check()

    # Test hooks (sollat/testing.py): kernels built with SOLLAT_TEST_HOOKS read `absent` (that
    # rank's blocks return at once) and `mismatch` (that rank flips a bit of its call signature).
    def _set_test_hooks(self, *, absent: int | None = None, mismatch: int | None = None,
                        armed: bool | None = None) -> None:
        hooks = bool(armed) or absent is not None or mismatch is not None
        if hooks != self._test_hooks:
            self._test_hooks = hooks
            self._calls.clear()
        torch.cuda.synchronize(self.device)
        self._write_state(absent_rank=-1 if absent is None else absent,
                          mismatch_rank=-1 if mismatch is None else mismatch)
        torch.cuda.synchronize(self.device)


def scratch_bytes_per_rank(world_size: int, names: Sequence[str], max_blocks: int,
                           customs: Sequence[Algorithm] = (), gather_scatter: bool = False,
                           fused_blocks: int | None = None) -> int:
    """Control block plus one region per algorithm, the fused RMSNorm ones, the built-in
    AllGather/ReduceScatter ones and the user-written collectives included (the offsets _setup assigns)."""
    return layout.CONTROL_BYTES + sum(r.alg.scratch_bytes(world_size, r.blocks)
                                      for r in regions(tuple(names), max_blocks, tuple(customs), gather_scatter,
                                                                fused_blocks))


def _record_view(scratch: torch.Tensor) -> torch.Tensor:
    off = layout.FAULT_RECORD_OFFSET
    return scratch[off:off + 4 * layout.FAULT_WORDS].view(torch.int32)


def _host_device_pointer(t: torch.Tensor) -> int:
    """Device address of pinned host memory (0 when it cannot be mapped: then only check() reports)."""
    try:
        from cuda.bindings import runtime

        err, ptr = runtime.cudaHostGetDevicePointer(t.data_ptr(), 0)
        return int(ptr) if int(err) == 0 else 0
    except Exception:
        return 0

