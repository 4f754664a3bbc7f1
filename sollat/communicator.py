"""Host API: communicators that own sollat's memory and launch its kernels.

Python owns every byte the kernels touch: the symmetric scratch (one region per algorithm and
protocol), the epoch counters, the communicator state block and the error record. Kernels own
nothing. Two communicators share one implementation:

* :class:`Communicator` - one process per GPU over a ``torch.distributed`` process group; peer
  scratch comes from ``torch.distributed._symmetric_memory``.
* :class:`VirtualCommunicator` - R ranks in one process on one GPU: one launch serves every rank
  (rank = blockIdx.y), which is how everything is tested on a single GPU.

Both work eagerly and under CUDA-graph capture (epochs live in device memory, not in kernel
arguments), and both are reachable from ``torch.compile`` through the ``sollat::all_reduce``
custom ops (``sollat/ops.py``).
"""

from __future__ import annotations

import itertools
import os
import struct
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from . import agree, algorithms, build, driver_launch, faults, launch, layout, select
from .algorithms import ALGORITHMS, Algorithm
from .dtypes import DTYPES, OPS, DType, lookup
from .errors import CommunicatorFaultedError, SollatError, UnsupportedError

MAX_ELEMENTS = 1 << 34
_STATE_FMT = "<8QQQii"  # csrc/include/sollat/collective.h: CommState
CLUSTER_MAX_BLOCKS = 4  # virtual ranks: rank clusters up to this many blocks per rank (_clustered)
_registry: dict[int, weakref.ReferenceType[_CommBase]] = {}
_ids = itertools.count(1)


def default_timeout_s() -> float:
    """``$SOLLAT_TIMEOUT_S`` or 30 s (see faults.DEFAULT_TIMEOUT_S for why)."""
    return faults.validated_timeout(None, what="timeout_s", env="SOLLAT_TIMEOUT_S", default=faults.DEFAULT_TIMEOUT_S)


def _timeout(value: object) -> float:
    return faults.validated_timeout(value, what="timeout_s", env="SOLLAT_TIMEOUT_S", default=faults.DEFAULT_TIMEOUT_S)


@dataclass
class _Plan:
    """Everything one call needs that depends only on (algorithm, dtype, op, n): cached."""

    alg: Algorithm
    kernel: Any
    config: Any            # cuda.core LaunchConfig (grid, block, PDL, rank cluster)
    tail: tuple[Any, ...]  # arguments after the tensor pointers
    bound: driver_launch.BoundLaunch | None  # the same launch prepacked for one driver call (None: through cuda.core)


class _CommBase:
    """State and launch logic shared by both communicators (not public)."""

    world_size: int
    device: torch.device

    def _setup(self, world_size: int, device: torch.device, scratch_ptrs: list[int], launch_ranks: int,
               timeout_s: float, debug: bool, algos: Sequence[str]) -> None:
        self.world_size = world_size  # validated by the constructors (_check_world_size)
        self.device = device
        self.debug = debug
        self.timeout_s = timeout_s
        self._algos = tuple(algos)
        self._launch_ranks = launch_ranks
        self._faulted = False
        self._agreement: agree.Agreement | agree.NoAgreement = agree.NoAgreement()
        self._last_stream = 0  # handle of the stream of the last launch (0: none yet)
        self._last_stream_obj: Any = None
        self._order_event: Any = None
        self._peek_stream: Any = None  # check(sync=False): reads records without waiting for work
        self._peek_host: torch.Tensor | None = None
        self._test_hooks = False
        self._defines: dict[str, str] = {}
        self._plans: dict[tuple[Any, ...], _Plan] = {}
        self._calls: dict[tuple[Any, ...], _Plan | str] = {}  # (n, dtype, op, algo, deterministic) -> plan | "nccl"
        self._choices: dict[tuple[Any, ...], str] = {}
        self._table: select.Table | None = None
        self._dev_index: int = device.index
        self._pad = (0,) * (8 - world_size)
        self._cluster_ranks = False  # set by VirtualCommunicator
        self._occupancy: dict[tuple[Any, ...], int] = {}
        launch.ensure_device(device.index)
        props = torch.cuda.get_device_properties(device)
        self.gpu_name: str = props.name
        self._num_sms: int = props.multi_processor_count

        # Region offsets inside every rank's scratch: the control block (fault record), then one
        # region per algorithm.
        self._region_off: dict[str, int] = {}
        off = layout.CONTROL_BYTES
        for name in self._algos:
            self._region_off[name] = off
            off += ALGORITHMS[name].scratch_bytes(world_size)
        self.scratch_bytes_per_rank = off
        self._scratch_ptrs = scratch_ptrs
        # Epoch counters, one set per algorithm, per launch-rank (device memory, starts at 0).
        self._epochs = {
            name: torch.zeros(launch_ranks * ALGORITHMS[name].epoch_words(), dtype=torch.int32, device=device)
            for name in self._algos
        }
        # Fault records live in the scratch (faults.py); the host-mapped flag is set by any kernel
        # thread of this process that meets a fault, so the host can look without a sync.
        self._err_host_t = torch.zeros(4, dtype=torch.int32).pin_memory()
        self._err_host = self._err_host_t.numpy()
        self._err_host_dev = _host_device_pointer(self._err_host_t)
        self._state = torch.zeros(struct.calcsize(_STATE_FMT), dtype=torch.uint8, device=device)
        self._write_state(absent_rank=-1)
        self.comm_id = next(_ids)
        _registry[self.comm_id] = weakref.ref(self)

    @property
    def _extra_defines(self) -> dict[str, str]:
        """Extra NVRTC defines for every kernel of this communicator (test and diagnostic builds)."""
        return self._defines

    @_extra_defines.setter
    def _extra_defines(self, value: dict[str, str]) -> None:
        self._defines = dict(value)
        self._calls.clear()

    # ---- memory ------------------------------------------------------------------------------
    def _write_state(self, absent_rank: int = -1, mismatch_rank: int = -1) -> None:
        ptrs = list(self._scratch_ptrs) + [0] * (8 - len(self._scratch_ptrs))
        raw = struct.pack(_STATE_FMT, *ptrs, self._err_host_dev, int(self.timeout_s * 1e9), absent_rank, mismatch_rank)
        self._state.copy_(torch.frombuffer(bytearray(raw), dtype=torch.uint8))

    def _init_scratch(self, views: Sequence[torch.Tensor]) -> None:
        """Control block (fault record) and LL regions start at 0 (flag 0 is never valid),
        sentinel regions at all ones."""
        for v in views:
            v[:layout.CONTROL_BYTES].zero_()
            for name in self._algos:
                alg = ALGORITHMS[name]
                off = self._region_off[name]
                v[off:off + alg.scratch_bytes(self.world_size)].fill_(255 if alg.proto == "sentinel" else 0)

    # ---- public helpers ----------------------------------------------------------------------
    @property
    def algorithms(self) -> tuple[str, ...]:
        """Names of the sollat algorithms this communicator can run."""
        return self._algos

    def selected_algorithm(self, nbytes: int, dtype: torch.dtype, op: str = "sum", *,
                           deterministic: bool = False) -> str:
        """What ``algo="auto"`` picks for a message of ``nbytes`` (may be ``"nccl"``)."""
        key = (nbytes, dtype, op, deterministic)
        choice = self._choices.get(key)
        if choice is None:
            choice = select.choose(self._selection_table(), nbytes, dtype, op, deterministic=deterministic,
                                   nccl_available=self._nccl_available(), available=self._algos)
            self._choices[key] = choice
        return choice

    def _selection_table(self) -> select.Table:
        if self._table is None:  # read once per communicator; a new `tune` table needs a new one
            real = self._entry == "pg"
            self._table = select.find_table(self.gpu_name, self.world_size, mode="real" if real else "virtual",
                                            interconnect=select.detect_interconnect(self._dev_index) if real
                                            else select.ANY)
        return self._table

    def _nccl_available(self) -> bool:
        return False

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

    # ---- one call --------------------------------------------------------------------------
    def _resolve(self, algo: str, nbytes: int, dtype: torch.dtype, op: str, deterministic: bool) -> str:
        if algo == "auto":
            return self.selected_algorithm(nbytes, dtype, op, deterministic=deterministic)
        if algo == select.NCCL:
            if not self._nccl_available():
                raise UnsupportedError("all_reduce: algo='nccl' needs a process group (Communicator), "
                                       "not a VirtualCommunicator")
            return algo
        alg = algorithms.get(algo)
        if algo not in self._algos:
            raise UnsupportedError(f"all_reduce: algorithm {algo!r} was not enabled for this communicator "
                                   f"(enabled: {', '.join(self._algos)})")
        if deterministic and not alg.deterministic:
            raise UnsupportedError(f"all_reduce: algorithm {algo!r} is not deterministic but deterministic=True")
        return algo

    def _plan(self, name: str, dt: DType, op: str, n: int) -> _Plan:
        key = (name, dt.short, op, n, self._test_hooks, tuple(sorted(self._defines.items())))
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        alg = ALGORITHMS[name]
        alg.check(dt.torch_dtype, op)
        rmax = algorithms.max_ranks_template(self.world_size)
        lines = alg.lines_per_rank(n, dt, self.world_size)
        max_blocks = alg.max_blocks
        while True:
            geo = layout.plan(lines, max_blocks=max_blocks, max_slots=alg.max_slots(rmax))
            defines = algorithms.kernel_defines(alg, dt, op, rmax, geo.slots, self._test_hooks,
                                                real_ranks=self._entry == "pg")
            defines.update(self._defines)
            kernel = build.get_kernel(alg.kernel_file, f"{alg.kernel}_{self._entry}", defines=defines)
            config = self._launch_config(geo.blocks, geo.threads)
            if self._co_resident(kernel, config, geo.blocks, geo.threads):
                break
            if self._entry == "pg":
                # Real ranks must cut every call identically (epochs agree only then), so the
                # grid may not depend on this GPU's occupancy: refuse instead of re-planning.
                raise UnsupportedError(f"all_reduce: {geo.blocks} blocks of {geo.threads} threads do not fit at once "
                                       f"on {self.gpu_name}; sollat needs a GPU with at least {geo.blocks} SMs")
            if max_blocks == 1:
                raise UnsupportedError(f"all_reduce: {self._launch_ranks} ranks x 1 block of {geo.threads} threads "
                                       f"cannot be co-resident on {self.gpu_name}")
            per_sm = self._blocks_per_sm(kernel, geo.threads)
            max_blocks = max(1, (per_sm * self._num_sms) // self._launch_ranks)
            max_blocks = min(max_blocks, geo.blocks - 1)
        sig = algorithms.signature(alg, dt, op, n)
        rec0, rank_stride = self._record_args()
        tail = (np.uint64(n), self._state.data_ptr(), np.uint64(self._region_off[name]),
                np.int32(layout.lines_per_src(alg.max_blocks)), self._epochs[name].data_ptr(),
                np.uint32(sig), np.int32(self._rank_arg()), np.int32(self.world_size),
                np.uint64(rec0), np.uint64(rank_stride))
        n_ptrs = 2 * (layout.MAX_RANKS if self._entry == "vr" else 1)  # inputs, outputs
        bound = driver_launch.BoundLaunch(kernel, config, tail, n_ptrs) if driver_launch.enabled() else None
        plan = _Plan(alg, kernel, config, tail, bound)
        self._plans[key] = plan
        return plan

    def _blocks_per_sm(self, kernel: Any, threads: int) -> int:
        key = (id(kernel), threads)
        v = self._occupancy.get(key)
        if v is None:
            v = kernel.occupancy.max_active_blocks_per_multiprocessor(threads, 0)
            self._occupancy[key] = v
        return v

    def _clustered(self, blocks: int) -> bool:
        """Virtual ranks with at most CLUSTER_MAX_BLOCKS blocks per rank launch as rank clusters:
        block b of every rank forms one thread-block cluster, which the hardware starts together
        on one GPC. Measured faster at small sizes; at 16 blocks per rank (1 MiB) it was slower
        for R >= 4, probably because whole clusters then pack onto fewer SMs (docs/benchmarks.md, run 12)."""
        return self._cluster_ranks and blocks <= CLUSTER_MAX_BLOCKS

    def _launch_config(self, blocks: int, threads: int) -> Any:
        """Grid (blocks, launch ranks) with PDL on; a rank cluster where ``_clustered``."""
        if self._clustered(blocks):
            return launch.launch_config((blocks, 1), threads, pdl=True, cluster=(1, self._launch_ranks))
        return launch.launch_config((blocks, self._launch_ranks), threads, pdl=True)

    def _co_resident(self, kernel: Any, config: Any, blocks: int, threads: int) -> bool:
        """Whether every block of the launch can run at once (each waits for its peers' blocks)."""
        if self._clustered(blocks):
            key = (id(kernel), threads, blocks, "clusters")
            v = self._occupancy.get(key)
            if v is None:
                v = kernel.occupancy.max_active_clusters(config, stream=launch.current_stream(self.device))
                self._occupancy[key] = v
            return blocks <= v
        return blocks * self._launch_ranks <= self._blocks_per_sm(kernel, threads) * self._num_sms

    def _launch(self, plan: _Plan, ptr_args: tuple[Any, ...]) -> None:
        stream = launch.stream_handle(self._dev_index)
        if stream != self._last_stream:
            self._order_streams(stream)
        if plan.bound is not None:
            plan.bound(stream, ptr_args)
        else:
            launch.launch(plan.kernel, plan.config, ptr_args + plan.tail, device=self.device)

    def _order_streams(self, stream: int) -> None:
        """Calls of one communicator share its epochs and scratch, so they must run in the order
        they were issued, whatever the stream (as NCCL orders a communicator's calls). When the
        stream changes, the new stream waits for everything issued so far on the previous one.
        Inside a CUDA-graph capture no outside event can be waited for: there, every call must
        stay on the capture stream (a second stream is refused)."""
        new = torch.cuda.current_stream(self.device)
        if launch.is_capturing():
            if self._last_stream and launch.stream_is_capturing(self._last_stream):
                raise UnsupportedError("sollat: inside one CUDA graph capture every call of a communicator must be "
                                       "issued on the same stream (its calls share buffers and must run in order)")
        elif self._last_stream_obj is not None:
            if self._order_event is None:
                self._order_event = torch.cuda.Event()
            self._order_event.record(self._last_stream_obj)
            new.wait_event(self._order_event)
        self._last_stream = stream
        self._last_stream_obj = new

    def _call_plan(self, n: int, dt: DType, op: str, algo: str, deterministic: bool) -> _Plan | str:
        """Plan of one call, or "nccl" (cached: the eager hot path is one dict lookup). A new
        call shape is compiled here and then agreed on by every rank (agree.py) before its first
        launch: no peer's first-use compile can look like a hang, and a call that differs between
        ranks is an error on every rank before anything runs."""
        key = (n, dt.torch_dtype, op, algo, deterministic)
        entry = self._calls.get(key)
        if entry is None:
            name = self._resolve(algo, n * dt.size, dt.torch_dtype, op, deterministic)
            entry = name if name == select.NCCL else self._plan(name, dt, op, n)
            self._agreement.agree(f"{name}|{dt.short}|{op}|n={n}", "this call (algorithm|dtype|op|elements)")
            self._calls[key] = entry
        return entry

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

    def _check_common(self, x: torch.Tensor, op: str, what: str) -> DType:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"all_reduce: {what} must be a torch.Tensor, got {type(x).__name__}")
        if x.device.type != "cuda":
            raise UnsupportedError(f"all_reduce: {what} is on {x.device}; sollat needs CUDA tensors on {self.device}")
        if x.device != self.device:
            raise UnsupportedError(f"all_reduce: {what} is on {x.device} but the communicator is on {self.device}")
        if op not in OPS:
            raise UnsupportedError(f"all_reduce: op {op!r} is not supported; supported ops: {', '.join(OPS)}")
        dt = lookup(x.dtype)
        if x.numel() > MAX_ELEMENTS:
            raise UnsupportedError(f"all_reduce: {what} has {x.numel()} elements; the limit is {MAX_ELEMENTS}")
        return dt

    def _guard(self) -> None:
        if self._faulted:
            raise CommunicatorFaultedError("all_reduce: this communicator saw a device error earlier; "
                                           "call reset() (on every rank) before using it again")

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

    _entry = "pg"

    def _rank_arg(self) -> int:
        raise NotImplementedError


def scratch_bytes_per_rank(world_size: int, names: Sequence[str]) -> int:
    """Control block plus one region per algorithm (the offsets _setup assigns)."""
    return layout.CONTROL_BYTES + sum(ALGORITHMS[a].scratch_bytes(world_size) for a in names)


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


class VirtualCommunicator(_CommBase):
    """``world_size`` ranks in this process on one GPU; every call launches one kernel for all ranks.

    ``VirtualCommunicator(world_size, device=None, *, timeout_s=None, debug=False, algorithms=None,
    cluster_ranks=None)``

    Rank r's blocks are ``blockIdx.y == r``. The grid is sized so that every block is co-resident
    (checked with the occupancy API), since block b of each rank waits for block b of the others.
    With ``cluster_ranks`` (default on; ``SOLLAT_CLUSTER_RANKS=0`` turns it off) small grids launch
    block b of every rank as one thread-block cluster, which the hardware co-schedules on one GPC
    (see ``_clustered``). The kernels are the same either way.
    """

    _entry = "vr"

    def __init__(self, world_size: int, device: torch.device | str | int | None = None, *,
                 timeout_s: float | None = None, debug: bool = False,
                 algorithms: Sequence[str] | None = None, cluster_ranks: bool | None = None) -> None:
        _check_world_size(world_size, "VirtualCommunicator")
        timeout = _timeout(timeout_s)
        names = _algorithm_names(algorithms)
        dev = _cuda_device(device, "VirtualCommunicator")
        per_rank = scratch_bytes_per_rank(world_size, names)
        self._scratch = torch.empty(world_size * per_rank, dtype=torch.uint8, device=dev)
        base = self._scratch.data_ptr()
        ptrs = [base + r * per_rank for r in range(world_size)]
        self._setup(world_size, dev, ptrs, world_size, timeout, debug, names)
        if cluster_ranks is None:
            cluster_ranks = os.environ.get("SOLLAT_CLUSTER_RANKS", "1") != "0"
        self._cluster_ranks = bool(cluster_ranks)
        self._init_scratch(self._rank_views())
        torch.cuda.synchronize(dev)

    def _rank_views(self) -> list[torch.Tensor]:
        per = self.scratch_bytes_per_rank
        return [self._scratch[r * per:(r + 1) * per] for r in range(self.world_size)]

    def _rank_arg(self) -> int:
        return 0  # rank_base; rank = blockIdx.y

    def _record_views(self) -> list[tuple[int, torch.Tensor]]:
        return [(r, _record_view(v)) for r, v in enumerate(self._rank_views())]

    def _record_args(self) -> tuple[int, int]:
        return self._scratch.data_ptr() + layout.FAULT_RECORD_OFFSET, self.scratch_bytes_per_rank

    def all_reduce(self, tensors: Sequence[torch.Tensor], op: str = "sum", algo: str = "auto", *,
                   out: Sequence[torch.Tensor] | None = None, deterministic: bool = False) -> list[torch.Tensor]:
        """``all_reduce(tensors, op="sum", algo="auto", *, out=None, deterministic=False) -> list[Tensor]``

        ``tensors[r]`` is rank r's input; every returned tensor holds the reduction (rank order
        0..R-1). ``out`` may name the outputs (an input may be its own output).
        """
        if torch.compiler.is_compiling():
            from . import ops

            return ops.all_reduce_virtual(list(tensors), self.comm_id, op, algo, deterministic)
        return self._all_reduce_impl(tensors, op, algo, out, deterministic)

    def _all_reduce_impl(self, tensors: Sequence[torch.Tensor], op: str, algo: str,
                         out: Sequence[torch.Tensor] | None, deterministic: bool) -> list[torch.Tensor]:
        self._before_call()
        fast = self._fast_check(tensors, op, out)
        if fast is not None:
            n, dt, outs, ptrs = fast
        else:
            ins, outs, dt = self._checked(tensors, op, out)
            n = ins[0].numel()
            ptrs = (*[t.data_ptr() for t in ins], *self._pad, *[o.data_ptr() for o in outs], *self._pad)
        if n == 0:
            return outs
        plan = self._call_plan(n, dt, op, algo, deterministic)
        assert not isinstance(plan, str)  # a VirtualCommunicator never resolves to NCCL
        self._launch(plan, ptrs)
        self._after_call()
        return outs

    def _fast_check(self, tensors: Sequence[torch.Tensor], op: str, out: Sequence[torch.Tensor] | None
                    ) -> tuple[int, DType, list[torch.Tensor], tuple[int, ...]] | None:
        """The common, valid call in one pass over the tensors: (n, dtype, outputs, the kernel's
        pointer arguments), or None, which sends the call to the detailed checks."""
        try:
            if op not in OPS or isinstance(tensors, torch.Tensor) or len(tensors) != self.world_size:
                return None
            t0 = tensors[0]
            dtype = t0.dtype
            dt = DTYPES.get(dtype)
            n = t0.numel()
            if dt is None or n > MAX_ELEMENTS:
                return None
            idx, shape = self._dev_index, t0.shape
            ptrs = []
            for t in tensors:
                if t.get_device() != idx or t.dtype is not dtype or t.shape != shape or not t.is_contiguous():
                    return None
                ptrs.append(t.data_ptr())
            ptrs.extend(self._pad)
            if out is None:
                outs = [torch.empty_like(t) for t in tensors]
                ptrs.extend(o.data_ptr() for o in outs)
            else:
                if isinstance(out, torch.Tensor) or len(out) != self.world_size:
                    return None
                for o in out:
                    if o.get_device() != idx or o.dtype is not dtype or o.shape != shape or not o.is_contiguous():
                        return None
                    ptrs.append(o.data_ptr())
                outs = list(out)
            ptrs.extend(self._pad)
            return n, dt, outs, tuple(ptrs)
        except (AttributeError, TypeError):
            return None

    def _checked(self, tensors: Sequence[torch.Tensor], op: str, out: Sequence[torch.Tensor] | None
                 ) -> tuple[list[torch.Tensor], list[torch.Tensor], DType]:
        """Every check with a clear error; non-contiguous inputs are copied."""
        if isinstance(tensors, torch.Tensor) or len(tensors) != self.world_size:
            got = "a single tensor" if isinstance(tensors, torch.Tensor) else f"{len(tensors)} tensors"
            raise UnsupportedError(f"all_reduce: a VirtualCommunicator of {self.world_size} ranks needs a list of "
                                   f"{self.world_size} tensors, got {got}")
        dt = self._check_common(tensors[0], op, "tensors[0]")
        shape, dtype = tensors[0].shape, tensors[0].dtype
        ins = []
        for r, t in enumerate(tensors):
            self._check_common(t, op, f"tensors[{r}]")
            if t.shape != shape or t.dtype != dtype:
                raise UnsupportedError(f"all_reduce: tensors[{r}] is {tuple(t.shape)} {t.dtype} but tensors[0] is "
                                       f"{tuple(shape)} {dtype}; every rank must pass the same shape and dtype")
            ins.append(t if t.is_contiguous() else t.contiguous())
        if out is None:
            return ins, [torch.empty_like(t, memory_format=torch.contiguous_format) for t in ins], dt
        if len(out) != self.world_size:
            raise UnsupportedError(f"all_reduce: out must hold {self.world_size} tensors, got {len(out)}")
        for r, o in enumerate(out):
            self._check_common(o, op, f"out[{r}]")
            if o.shape != shape or o.dtype != dtype:
                raise UnsupportedError(f"all_reduce: out[{r}] is {tuple(o.shape)} {o.dtype}, expected "
                                       f"{tuple(shape)} {dtype}")
            if not o.is_contiguous():
                raise UnsupportedError(f"all_reduce: out[{r}] must be contiguous")
        return ins, list(out), dt

    def reset(self) -> None:
        """Clear a recorded fault and return every buffer and epoch to its initial state."""
        self._reset_local(self._rank_views())


def _get_alg(name: str) -> Algorithm:
    return algorithms.get(name)


def _check_world_size(world_size: object, who: str) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise UnsupportedError(f"{who}: world_size must be an int, got {world_size!r}")
    if not 2 <= world_size <= layout.MAX_RANKS:
        raise UnsupportedError(f"{who}: world_size must be 2..{layout.MAX_RANKS}, got {world_size}")


def _algorithm_names(names: Sequence[str] | None) -> tuple[str, ...]:
    if isinstance(names, str):
        raise UnsupportedError(f"algorithms must be a list of names, got the string {names!r}")
    out = tuple(names) if names is not None else tuple(ALGORITHMS)
    if not out:
        raise UnsupportedError(f"algorithms must name at least one of {', '.join(ALGORITHMS)}")
    for a in out:
        _get_alg(a)
    return out


def _cuda_device(device: object, who: str) -> torch.device:
    """The CUDA device to use; argument errors are reported before a missing GPU is."""
    if device is not None and not isinstance(device, (torch.device, str, int)) or isinstance(device, bool):
        raise UnsupportedError(f"{who}: device must be a torch.device, 'cuda[:N]' or an index, got {device!r}")
    try:
        dev = None if device is None else torch.device(device)  # type: ignore[arg-type]
    except (RuntimeError, TypeError) as exc:
        raise UnsupportedError(f"{who}: device {device!r} is not a device ({exc})") from None
    if dev is not None and dev.type != "cuda":
        raise UnsupportedError(f"{who}: device must be a CUDA device, got {dev}")
    if not torch.cuda.is_available():
        raise UnsupportedError(f"{who}: no CUDA device is available (torch {torch.__version__}, "
                               f"CUDA {'built in' if torch.backends.cuda.is_built() else 'not built in'})")
    if dev is None or dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if dev.index >= torch.cuda.device_count():
        raise UnsupportedError(f"{who}: {dev} does not exist; {torch.cuda.device_count()} CUDA device(s) visible")
    return dev


class Communicator(_CommBase):
    """One process per GPU over a ``torch.distributed`` process group.

    ``Communicator(group=None, *, timeout_s=None, debug=False, algorithms=None)``

    Scratch is symmetric memory from ``torch.distributed._symmetric_memory`` (no hand-written
    IPC); every rank of ``group`` must construct it collectively. Above the sizes where sollat
    wins (the tuning table) ``algo="auto"`` falls back to ``torch.distributed.all_reduce`` on
    ``group``.
    """

    _entry = "pg"

    def __init__(self, group: Any = None, *, timeout_s: float | None = None, debug: bool = False,
                 algorithms: Sequence[str] | None = None) -> None:
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        if not dist.is_initialized():
            raise UnsupportedError("Communicator: torch.distributed is not initialised (call init_process_group)")
        timeout = _timeout(timeout_s)
        setup_timeout = faults.validated_timeout(None, what="setup timeout", env="SOLLAT_SETUP_TIMEOUT_S",
                                                 default=faults.DEFAULT_SETUP_TIMEOUT_S)
        names = _algorithm_names(algorithms)
        dev = _cuda_device(None, "Communicator")
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        ws = dist.get_world_size(self.group)
        _check_world_size(ws, "Communicator")
        self._buf = symm_mem.empty(scratch_bytes_per_rank(ws, names), dtype=torch.uint8, device=dev)
        self._hdl = symm_mem.rendezvous(self._buf, self.group.group_name)
        ptrs = [int(p) for p in self._hdl.buffer_ptrs]
        self._setup(ws, dev, ptrs, 1, timeout, debug, names)
        store = agree.default_store(self.group)
        if store is not None:
            self._agreement = agree.Agreement(store, self.group.group_name, self.rank, ws, setup_timeout)
        self._init_scratch([self._buf])
        torch.cuda.synchronize(dev)
        dist.barrier(group=self.group)  # every rank's scratch is initialised before anyone sends
        self._agree_on_setup()

    def _rank_arg(self) -> int:
        return self.rank

    def _record_views(self) -> list[tuple[int, torch.Tensor]]:
        return [(self.rank, _record_view(self._buf))]

    def _record_args(self) -> tuple[int, int]:
        return self._scratch_ptrs[self.rank] + layout.FAULT_RECORD_OFFSET, 0

    def _agree_on_setup(self) -> None:
        """Every rank must select from the same table and time out alike, or `auto` could send one
        rank to NCCL and another to a sollat kernel (both would hang)."""
        if isinstance(self._agreement, agree.NoAgreement):
            return
        try:
            table = self._selection_table()
            mine = f"{select.table_digest(table)}\t{table.source}"
        except SollatError as exc:  # posted, so that every rank raises instead of waiting
            mine = f"error\t{exc}"
        posted = self._agreement.exchange(mine)
        broken = [(r, p.split("\t", 1)[1]) for r, p in enumerate(posted) if p.startswith("error\t")]
        if broken:
            raise UnsupportedError("sollat: rank(s) could not read their tuning table: " +
                                   "; ".join(f"rank {r}: {why}" for r, why in broken))
        select.agree([p.split("\t")[0] for p in posted], [p.split("\t", 1)[1] for p in posted])
        self._agreement.agree(f"timeout {self.timeout_s:g} s; algorithms {','.join(self._algos)}",
                              "the communicator's timeout and algorithms")

    def _nccl_available(self) -> bool:
        return True

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", algo: str = "auto", *,
                   out: torch.Tensor | None = None, deterministic: bool = False) -> torch.Tensor:
        """``all_reduce(tensor, op="sum", algo="auto", *, out=None, deterministic=False) -> Tensor``

        Returns the reduction over every rank of ``group`` (a new tensor unless ``out`` is given;
        ``out=tensor`` reduces in place). Every rank must call it with the same shape, dtype, op
        and algo.
        """
        if torch.compiler.is_compiling():
            from . import ops

            return ops.all_reduce(tensor, self.comm_id, op, algo, deterministic)
        return self._all_reduce_impl(tensor, op, algo, out, deterministic)

    def _all_reduce_impl(self, tensor: torch.Tensor, op: str, algo: str, out: torch.Tensor | None,
                         deterministic: bool) -> torch.Tensor:
        self._before_call()
        dt = DTYPES.get(tensor.dtype) if isinstance(tensor, torch.Tensor) else None
        fast = (dt is not None and op in OPS and tensor.get_device() == self._dev_index and tensor.is_contiguous()
                and tensor.numel() <= MAX_ELEMENTS
                and (out is None or (isinstance(out, torch.Tensor) and out.get_device() == self._dev_index
                                     and out.dtype is tensor.dtype and out.shape == tensor.shape
                                     and out.is_contiguous())))
        if fast:
            x = tensor
        else:  # every check with a clear error; a non-contiguous input is copied
            dt = self._check_common(tensor, op, "tensor")
            x = tensor if tensor.is_contiguous() else tensor.contiguous()
            if out is not None:
                self._check_common(out, op, "out")
                if out.shape != tensor.shape or out.dtype != tensor.dtype or not out.is_contiguous():
                    raise UnsupportedError("all_reduce: out must be a contiguous tensor of the input's shape and dtype")
        assert dt is not None
        y = torch.empty_like(x) if out is None else out
        n = x.numel()
        if n == 0:
            return y
        plan = self._call_plan(n, dt, op, algo, deterministic)
        if isinstance(plan, str):  # NCCL, above the sizes where sollat wins
            import torch.distributed as dist

            if y.data_ptr() != x.data_ptr():
                y.copy_(x)
            dist.all_reduce(y, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
                                   "min": dist.ReduceOp.MIN}[op], group=self.group)
            return y
        self._launch(plan, (x.data_ptr(), y.data_ptr()))
        self._after_call()
        return y

    def reset(self) -> None:
        """Collective: clear a recorded fault and re-initialise buffers and epochs on every rank."""
        import torch.distributed as dist

        # Every stream of every rank is idle before any rank re-fills its scratch (a peer's
        # kernel on a side stream could otherwise still write into it), and every rank has
        # re-filled before any rank sends again.
        torch.cuda.synchronize(self.device)
        dist.barrier(group=self.group)
        self._reset_local([self._buf])
        dist.barrier(group=self.group)


def lookup_comm(comm_id: int) -> _CommBase:
    ref = _registry.get(comm_id)
    comm = ref() if ref is not None else None
    if comm is None:
        raise SollatError(f"sollat: communicator {comm_id} no longer exists")
    return comm
