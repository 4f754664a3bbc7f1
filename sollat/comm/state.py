"""Device memory of a communicator: where each region lies in every rank's scratch, the epoch
counters, the state block the kernels read, the host-mapped fault flag, and the scratch's initial
contents. The memory layout is ``layout.py``'s, the fault semantics are ``faults.py``'s and
``csrc/include/sollat/fault.h``'s.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..collectives.algorithms import Algorithm, Region, regions
from ..device import abi, layout


class DeviceMemory:
    """The device memory one communicator's kernels use besides the caller's tensors.

    ``regions``: one per algorithm with scratch (``algorithms.regions``), laid out in that order
    after the control block (fault record) of every rank's scratch; ``scratch_ptrs``: each rank's
    scratch address (every rank's, also on a real rank); ``launch_ranks``: ranks one launch serves
    (each has its own epoch counters). The state block is written at construction with
    ``timeout_s`` and no test hook.
    """

    def __init__(self, world_size: int, device: torch.device, region_list: Sequence[Region],
                 scratch_ptrs: list[int], launch_ranks: int, timeout_s: float) -> None:
        self.world_size = world_size
        self.device = device
        self.regions = tuple(region_list)
        self.region_blocks = {reg.name: reg.blocks for reg in self.regions}  # what the plans' lines_per_src use
        self.region_off: dict[str, int] = {}  # region -> byte offset inside every rank's scratch
        off = layout.CONTROL_BYTES
        for reg in self.regions:
            self.region_off[reg.name] = off
            off += reg.alg.scratch_bytes(world_size, reg.blocks)
        self.bytes_per_rank = off
        self.scratch_ptrs = scratch_ptrs
        # Epoch counters, one set per region, per launch rank (device memory, starts at 0).
        self.epochs = {reg.name: torch.zeros(launch_ranks * reg.alg.epoch_words(reg.blocks), dtype=torch.int32,
                                             device=device) for reg in self.regions}
        # The host-mapped fault flag: set by any kernel thread of this process that meets a fault,
        # so the host can look without a sync (0 as its device address where it cannot be mapped:
        # then only check() reports).
        self.flag = torch.zeros(4, dtype=torch.int32).pin_memory()
        self.flag_dev = _host_device_pointer(self.flag)
        self.state = torch.zeros(abi.STATE_BYTES, dtype=torch.uint8, device=device)  # abi.STATE_FORMAT
        self._peek_stream: torch.cuda.Stream | None = None  # read_now: reads records without waiting for work
        self._peek_host: torch.Tensor | None = None
        self.write_state(timeout_s)

    def write_state(self, timeout_s: float, absent_rank: int = -1, mismatch_rank: int = -1) -> None:
        """The state block: every rank's scratch address, the fault flag's device address, the
        timeout, and the test hooks' ranks (-1: none)."""
        ptrs = list(self.scratch_ptrs) + [0] * (abi.MAX_RANKS - len(self.scratch_ptrs))
        raw = abi.pack_state({"scratch": ptrs, "err_host": self.flag_dev, "timeout_ns": int(timeout_s * 1e9),
                              "absent_rank": absent_rank, "mismatch_rank": mismatch_rank})
        self.state.copy_(torch.frombuffer(bytearray(raw), dtype=torch.uint8))

    def init_scratch(self, views: Sequence[torch.Tensor]) -> None:
        """Control block (fault record) at 0; each region at its protocol's rest byte (abi.REST_BYTE:
        LL 0, as flag 0 is never valid; sentinel all ones, empty in every dtype), except a sentinel
        region's signature words (the SIGNATURE_SLOT lines of every block of every (parity,
        source) part, layout.signature_word), which are 0: an empty signature word is 0, the value
        its reader stores back once it has read it (ll_buffer.h, "Signature words"). ``reset()``
        calls this again, so a word a faulted receive never read is empty afterwards."""
        for v in views:
            v[:layout.CONTROL_BYTES].zero_()
            for reg in self.regions:
                off = self.region_off[reg.name]
                region = v[off:off + reg.alg.scratch_bytes(self.world_size, reg.blocks)]
                region.fill_(abi.REST_BYTE[reg.alg.proto])
                if abi.REST_BYTE[reg.alg.proto] != 0:
                    # parts x blocks x slots x (threads' lines): the signature slot of every block
                    slots = region.view(-1, reg.blocks, layout.MAX_SLOTS, layout.MAX_THREADS * layout.LINE_BYTES)
                    slots[:, :, layout.SIGNATURE_SLOT].zero_()

    def reset(self, views: Sequence[torch.Tensor]) -> None:
        """Epochs to 0 and the scratch ``views`` to their initial contents, with this device idle
        before and after (the fault flag is the caller's)."""
        torch.cuda.synchronize(self.device)
        for e in self.epochs.values():
            e.zero_()
        self.init_scratch(views)
        torch.cuda.synchronize(self.device)

    def read_now(self, view: torch.Tensor) -> np.ndarray:
        """The words of ``view`` as they are now, without waiting for the work queued on any
        other stream (a relaxed snapshot: a record being written reads as claimed, and
        faults.read_record reads it again)."""
        if self._peek_stream is None or self._peek_host is None:
            self._peek_stream = torch.cuda.Stream(self.device)
            self._peek_host = torch.empty(view.numel(), dtype=view.dtype).pin_memory()
        with torch.cuda.stream(self._peek_stream):
            self._peek_host.copy_(view, non_blocking=True)
        self._peek_stream.synchronize()
        return self._peek_host.numpy().copy()


def scratch_bytes_per_rank(world_size: int, names: Sequence[str], max_blocks: int,
                           customs: Sequence[Algorithm] = (), gather_scatter: bool = False,
                           fused_blocks: int | None = None) -> int:
    """Control block plus one region per algorithm, the fused RMSNorm ones, the built-in
    AllGather/ReduceScatter ones and the user-written collectives included (DeviceMemory's offsets)."""
    return layout.CONTROL_BYTES + sum(r.alg.scratch_bytes(world_size, r.blocks)
                                      for r in regions(tuple(names), max_blocks, tuple(customs), gather_scatter,
                                                                fused_blocks))


def _host_device_pointer(t: torch.Tensor) -> int:
    """Device address of pinned host memory (0 when it cannot be mapped: then only check() reports)."""
    try:
        from cuda.bindings import runtime

        err, ptr = runtime.cudaHostGetDevicePointer(t.data_ptr(), 0)
        return int(ptr) if int(err) == 0 else 0
    except Exception:
        return 0
