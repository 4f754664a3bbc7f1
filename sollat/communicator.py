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

from . import algorithms, build, driver_launch, launch, layout, select
from .algorithms import ALGORITHMS, Algorithm
from .dtypes import DTYPES, OPS, DType, lookup
from .errors import (
    CallMismatchError,
    CommunicatorFaultedError,
    PeerTimeoutError,
    SollatError,
    UnsupportedError,
)

MAX_ELEMENTS = 1 << 34
_STATE_FMT = "<8QQQQii"  # csrc/include/sollat/collective.h: CommState
_FAULT_WORDS = 8
CLUSTER_MAX_BLOCKS = 4  # virtual ranks: rank clusters up to this many blocks per rank (_clustered)
_registry: dict[int, weakref.ReferenceType[_CommBase]] = {}
_ids = itertools.count(1)


def default_timeout_s() -> float:
    return float(os.environ.get("SOLLAT_TIMEOUT_S", "5.0"))


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
        if not 2 <= world_size <= layout.MAX_RANKS:
            raise UnsupportedError(f"sollat: world size must be 2..{layout.MAX_RANKS}, got {world_size}")
        self.world_size = world_size
        self.device = device
        self.debug = debug
        self.timeout_s = timeout_s
        self._algos = tuple(algos)
        self._launch_ranks = launch_ranks
        self._faulted = False
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

        # Region offsets inside every rank's scratch: one region per algorithm.
        self._region_off: dict[str, int] = {}
        off = 0
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
        # Error record: device words + a host-mapped copy the kernel writes on failure.
        self._err = torch.zeros(_FAULT_WORDS, dtype=torch.int32, device=device)
        self._err_host_t = torch.zeros(_FAULT_WORDS, dtype=torch.int32).pin_memory()
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
        raw = struct.pack(_STATE_FMT, *ptrs, self._err.data_ptr(), self._err_host_dev,
                          int(self.timeout_s * 1e9), absent_rank, mismatch_rank)
        self._state.copy_(torch.frombuffer(bytearray(raw), dtype=torch.uint8))

    def _init_scratch(self, views: Sequence[torch.Tensor]) -> None:
        """LL regions start at 0 (flag 0 is never valid), sentinel regions at all ones."""
        for v in views:
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
            if self._table is None:  # read once per communicator; a new `tune` table needs a new one
                self._table = select.find_table(self.gpu_name, self.world_size)
            choice = select.choose(self._table, nbytes, dtype, op, deterministic=deterministic,
                                   nccl_available=self._nccl_available(), available=self._algos)
            self._choices[key] = choice
        return choice

    def _nccl_available(self) -> bool:
        return False

    def check(self) -> None:
        """Raise the device-side error recorded by an earlier call, if any (synchronises)."""
        torch.cuda.current_stream(self.device).synchronize()
        self._raise_if_faulted(self._err.cpu().numpy())

    def _peek_error(self) -> None:
        # Host-mapped copy: written by the failing kernel itself, read here without a sync.
        if self._err_host[0] != 0:
            torch.cuda.current_stream(self.device).synchronize()
            self._raise_if_faulted(self._err.cpu().numpy())

    def _raise_if_faulted(self, rec: np.ndarray) -> None:
        code = int(rec[0])
        if code == 0:
            return
        self._faulted = True
        rank, peer, block, thread, slot, epoch, seen = (int(x) for x in rec[1:8])
        where = f"(rank {rank} waited for peer {peer}; block {block}, thread {thread}, slot {slot}, epoch {epoch})"
        who = f"peer {peer}" if peer >= 0 else "some peer (an LL128 line counter did not reach the world size)"
        if code == 2 and peer < 0:
            raise SollatError(f"sollat all_reduce: an LL128 line counter overshot the world size (0x{seen & 0xFFFFFFFF:08x}) "
                              f"{where}; a peer called with different arguments. Call reset() on every rank.")
        if code == 1:
            raise PeerTimeoutError(
                f"sollat all_reduce: {who} did not deliver its data within {self.timeout_s:g} s {where}. "
                "Did every rank call all_reduce with the same arguments? Call reset() on every rank before reuse.",
                rank=rank, peer=peer, slot=slot, epoch=epoch)
        if code == 2:
            raise CallMismatchError(
                f"sollat all_reduce: peer {peer} called all_reduce with different arguments (size, dtype, op or "
                f"algorithm; its signature 0x{seen & 0xFFFFFFFF:08x}) {where}. Call reset() on every rank before reuse.",
                rank=rank, peer=peer)
        raise SollatError(f"sollat: unknown device error code {code} {where}")

    def _reset_local(self, views: Sequence[torch.Tensor]) -> None:
        torch.cuda.synchronize(self.device)
        for e in self._epochs.values():
            e.zero_()
        self._init_scratch(views)
        self._err.zero_()
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
                                                split_counter=self._entry == "vr")
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
        tail = (np.uint64(n), self._state.data_ptr(), np.uint64(self._region_off[name]),
                np.int32(layout.lines_per_src(alg.max_blocks)), self._epochs[name].data_ptr(),
                np.uint32(sig), np.int32(self._rank_arg()), np.int32(self.world_size))
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
        if plan.bound is not None:
            plan.bound(launch.stream_handle(self._dev_index), ptr_args)
        else:
            launch.launch(plan.kernel, plan.config, ptr_args + plan.tail, device=self.device)

    def _call_plan(self, n: int, dt: DType, op: str, algo: str, deterministic: bool) -> _Plan | str:
        """Plan of one call, or "nccl" (cached: the eager hot path is one dict lookup)."""
        key = (n, dt.torch_dtype, op, algo, deterministic)
        entry = self._calls.get(key)
        if entry is None:
            name = self._resolve(algo, n * dt.size, dt.torch_dtype, op, deterministic)
            entry = name if name == select.NCCL else self._plan(name, dt, op, n)
            self._calls[key] = entry
        return entry

    def _after_call(self) -> None:
        if launch.is_capturing():
            return
        if self.debug:
            self.check()
        else:
            self._peek_error()

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

    # Test hooks (kernels built with SOLLAT_TEST_HOOKS): `absent` rank's blocks return at once (a
    # peer that never arrives); `mismatch` rank flips a bit of its call signature (a peer that
    # called with other arguments).
    def _set_test_hooks(self, *, absent: int | None = None, mismatch: int | None = None) -> None:
        self._test_hooks = absent is not None or mismatch is not None
        self._calls.clear()
        torch.cuda.synchronize(self.device)
        self._write_state(absent_rank=-1 if absent is None else absent,
                          mismatch_rank=-1 if mismatch is None else mismatch)
        torch.cuda.synchronize(self.device)

    _entry = "pg"

    def _rank_arg(self) -> int:
        raise NotImplementedError


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
        if not torch.cuda.is_available():
            raise UnsupportedError("VirtualCommunicator: no CUDA device is available")
        dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        if dev.type != "cuda":
            raise UnsupportedError(f"VirtualCommunicator: device must be a CUDA device, got {dev}")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        names = tuple(algorithms) if algorithms is not None else tuple(ALGORITHMS)
        for a in names:
            _get_alg(a)
        per_rank = sum(ALGORITHMS[a].scratch_bytes(world_size) for a in names)
        self._scratch = torch.empty(world_size * per_rank, dtype=torch.uint8, device=dev)
        base = self._scratch.data_ptr()
        ptrs = [base + r * per_rank for r in range(world_size)]
        self._setup(world_size, dev, ptrs, world_size, timeout_s or default_timeout_s(), debug, names)
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
        if self._faulted:
            self._guard()
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
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        ws = dist.get_world_size(self.group)
        dev = torch.device("cuda", torch.cuda.current_device())
        names = tuple(algorithms) if algorithms is not None else tuple(ALGORITHMS)
        for a in names:
            _get_alg(a)
        per_rank = sum(ALGORITHMS[a].scratch_bytes(ws) for a in names)
        self._buf = symm_mem.empty(per_rank, dtype=torch.uint8, device=dev)
        self._hdl = symm_mem.rendezvous(self._buf, self.group.group_name)
        ptrs = [int(p) for p in self._hdl.buffer_ptrs]
        self._setup(ws, dev, ptrs, 1, timeout_s or default_timeout_s(), debug, names)
        self._init_scratch([self._buf])
        torch.cuda.synchronize(dev)
        dist.barrier(group=self.group)  # every rank's scratch is initialised before anyone sends

    def _rank_arg(self) -> int:
        return self.rank

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
        if self._faulted:
            self._guard()
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

        dist.barrier(group=self.group)
        self._reset_local([self._buf])
        dist.barrier(group=self.group)


def lookup_comm(comm_id: int) -> _CommBase:
    ref = _registry.get(comm_id)
    comm = ref() if ref is not None else None
    if comm is None:
        raise SollatError(f"sollat: communicator {comm_id} no longer exists")
    return comm
