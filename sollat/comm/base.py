"""What both communicators share: setup, planning (algorithm, geometry, compiled kernel, packed
launch), the launch itself with its stream ordering, and argument checks common to both.

Device memory and faults are the ``DeviceState`` mixin (``comm/state.py``); the two public
communicators are ``comm/real.py`` (one process per GPU) and ``virtual.py`` (R ranks on one GPU).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..collectives import algorithms, handover, registry, select
from ..collectives.algorithms import ALGORITHMS, Algorithm
from ..device import abi, build, driver_launch, launch, layout
from ..device.dtypes import OPS, DType, lookup
from ..errors import CommunicatorFaultedError, UnsupportedError
from . import agree
from .fitting import LaunchFitting
from .state import DeviceState, _host_device_pointer

MAX_ELEMENTS = 1 << 34


@dataclass
class _Plan:
    """Everything one call needs that depends only on (algorithm, dtype, op, n): cached."""

    alg: Algorithm | None  # None: the unfused RMSNorm's epilogue (rmsnorm_epilogue.py: no scratch, no peers)
    kernel: Any
    config: Any            # cuda.core LaunchConfig (grid, block, PDL, rank cluster)
    tail: tuple[Any, ...]  # arguments after the tensor pointers
    bound: driver_launch.BoundLaunch  # the launch prepacked for one driver call



class _CommBase(LaunchFitting, DeviceState):
    """State and launch logic shared by both communicators (not public)."""

    world_size: int
    device: torch.device
    _rmsnorm_twoshot: bool = False  # the experimental fused two-shot's regions exist (set by _setup)
    _batch_invariant: bool = False  # batch-invariant mode (set by _setup; docs/design.md "Arithmetic and batch invariance")
    _entry = "pg"

    def _setup(self, world_size: int, device: torch.device, scratch_ptrs: list[int], launch_ranks: int,
               timeout_s: float, debug: bool, algos: Sequence[str], max_blocks: int,
               customs: Sequence[Algorithm] = (), gather_scatter: bool = False,
               batch_invariant: bool = False, fused_blocks: int | None = None) -> None:
        self.world_size = world_size  # validated by the constructors (validate.check_world_size)
        self._batch_invariant = batch_invariant  # validated by the constructors (validate.batch_invariant)
        self.max_blocks = max_blocks  # blocks per rank the scratch is sized for (validate.max_blocks)
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
        self._kernel_files: dict[str, str] = {}  # algorithm -> diagnostic kernel file (sollat.testing)
        self._plans: dict[tuple[Any, ...], _Plan] = {}
        self._calls: dict[tuple[Any, ...], _Plan | str] = {}  # (n, dtype, op, algo, deterministic) -> plan | "nccl"
        self._choices: dict[tuple[Any, ...], str] = {}
        self._table: select.Table | None = None
        self._dev_index: int = device.index
        # The rank table's launch ranks (abi.py POINTER_LISTS): this rank alone, or every virtual
        # rank up to the kernels' rank cap; a virtual call pads each list with zeros to it.
        self._rank_cap = algorithms.max_ranks_template(world_size)
        self._table_ranks = 1 if self._entry == "pg" else self._rank_cap
        self._pad = (0,) * (self._table_ranks - launch_ranks)
        self._cluster_ranks = False  # set by VirtualCommunicator
        self._occupancy: dict[tuple[Any, ...], int] = {}
        launch.ensure_device(device.index)
        props = torch.cuda.get_device_properties(device)
        self.gpu_name: str = props.name
        self._num_sms: int = props.multi_processor_count

        # Region offsets inside every rank's scratch: the control block (fault record), then one
        # region per algorithm (algorithms.regions: AllReduce, fused RMSNorm, user collectives).
        self._customs = {a.name: a for a in customs}
        self._gather_scatter = gather_scatter  # built-in AllGather/ReduceScatter regions (gather_scatter.py)
        self._regions = algorithms.regions(self._algos, max_blocks, tuple(customs), gather_scatter, fused_blocks)
        self._region_blocks = {reg.name: reg.blocks for reg in self._regions}  # what the plans' lines_per_src use
        self._rmsnorm_twoshot = any(reg.name in algorithms.RMSNORM_EXPERIMENTAL for reg in self._regions)
        self._region_off: dict[str, int] = {}
        off = layout.CONTROL_BYTES
        for reg in self._regions:
            self._region_off[reg.name] = off
            off += reg.alg.scratch_bytes(world_size, reg.blocks)
        self.scratch_bytes_per_rank = off
        self._scratch_ptrs = scratch_ptrs
        # Epoch counters, one set per region, per launch-rank (device memory, starts at 0).
        self._epochs = {reg.name: torch.zeros(launch_ranks * reg.alg.epoch_words(reg.blocks), dtype=torch.int32,
                                              device=device) for reg in self._regions}
        # Fault records live in the scratch (faults.py); the host-mapped flag is set by any kernel
        # thread of this process that meets a fault, so the host can look without a sync.
        self._err_host_t = torch.zeros(4, dtype=torch.int32).pin_memory()
        self._err_host = self._err_host_t.numpy()
        self._err_host_dev = _host_device_pointer(self._err_host_t)
        self._state = torch.zeros(abi.STATE_BYTES, dtype=torch.uint8, device=device)
        self._write_state(absent_rank=-1)
        self.comm_id = registry.register(self)

    @property
    def _extra_defines(self) -> dict[str, str]:
        """Extra NVRTC defines for every kernel of this communicator (test and diagnostic builds)."""
        return self._defines

    @_extra_defines.setter
    def _extra_defines(self, value: dict[str, str]) -> None:
        self._defines = dict(value)
        self._calls.clear()

    def _set_kernel_files(self, files: dict[str, str]) -> None:
        """Build these algorithms from other files of csrc/kernels (sollat.testing.set_defines)."""
        self._kernel_files = dict(files)
        self._calls.clear()

    # ---- public helpers ----------------------------------------------------------------------
    @property
    def batch_invariant(self) -> bool:
        """Batch-invariant mode (``batch_invariant=True`` or ``SOLLAT_BATCH_INVARIANT=1`` at
        construction): every collective gives a row the same bits whatever batch it travels in and
        whichever algorithm ``auto`` picks for that batch, because every call runs one of sollat's
        rank-order algorithms: ``all_reduce`` never hands a call to a library (NCCL, torch's
        two-shot) nor runs a non-deterministic algorithm (``ll128``), ``reduce_scatter`` never hands
        over either, and a call no sollat algorithm serves raises (docs/design.md, "Arithmetic and
        batch invariance"). ``all_reduce_rmsnorm`` is batch-invariant in every mode on sollat's
        AllReduce; this mode also keeps its ``unfused`` AllReduce off the libraries."""
        return self._batch_invariant

    @property
    def algorithms(self) -> tuple[str, ...]:
        """Names of the sollat algorithms this communicator can run."""
        return self._algos

    def selected_algorithm(self, nbytes: int, dtype: torch.dtype, op: str = "sum", *,
                           deterministic: bool = False, symmetric: bool = False) -> str:
        """What ``algo="auto"`` picks for a message of ``nbytes`` (may be a library path:
        ``"nccl"``, ``"torch_twoshot"``, or with ``symmetric`` (a call in place on a tensor from
        ``Communicator.empty``) ``"torch_twoshot_zero_copy"``, see ``sollat.collectives.handover``); never a
        library path nor a non-deterministic algorithm on a ``batch_invariant`` communicator."""
        key = (nbytes, dtype, op, deterministic)
        choice = self._choices.get(key)
        if choice is None:
            bi = self._batch_invariant
            try:
                choice = select.choose(self._selection_table(), nbytes, dtype, op, deterministic=deterministic,
                                       handovers=self._handovers(), available=self._algos, batch_invariant=bi)
            except UnsupportedError as exc:
                if not bi:
                    raise
                raise UnsupportedError(f"all_reduce: batch-invariant mode: no sollat algorithm of this communicator "
                                       f"({', '.join(self._algos)}) serves dtype {dtype}, op {op!r} deterministically, "
                                       "and this mode never hands a call to a library") from exc
            self._choices[key] = choice
        return self._symmetric_path(choice, "auto", nbytes, dtype, op) if symmetric else choice

    def _selection_table(self) -> select.Table:
        if self._table is None:  # read once per communicator; a new `tune` table needs a new one
            real = self._entry == "pg"
            self._table = select.find_table(self.gpu_name, self.world_size, mode="real" if real else "virtual",
                                            interconnect=select.detect_interconnect(self._dev_index) if real
                                            else select.ANY)
        return self._table

    def _handovers(self) -> frozenset[str]:
        """Library paths this communicator can hand a call to (select.HANDOVERS)."""
        return frozenset()

    def _check_handover(self, name: str, nbytes: int, dt: DType, op: str) -> None:
        """Raise if library path ``name`` cannot serve this call (its first use)."""

    # ---- one call --------------------------------------------------------------------------
    def _resolve(self, algo: str, nbytes: int, dtype: torch.dtype, op: str, deterministic: bool) -> str:
        if algo == "auto":
            return self.selected_algorithm(nbytes, dtype, op, deterministic=deterministic)
        bi = self._batch_invariant
        if bi and algo in select.LIBRARY_PATHS:
            raise UnsupportedError(f"all_reduce: algo={algo!r} is a library path, whose reduction order is not fixed; "
                                   "this communicator is batch-invariant (batch_invariant=True or "
                                   "SOLLAT_BATCH_INVARIANT=1) and runs only sollat's rank-order algorithms: use "
                                   f"'auto' or one of {', '.join(self._deterministic_algos())}")
        if algo in select.HANDOVERS:
            if algo not in self._handovers():
                here = ", ".join(sorted(self._handovers()))
                why = (f"; torch's two-shot runs on {', '.join(map(str, handover.TORCH_SYMM_WORLD_SIZES))} ranks "
                       f"(this group has {self.world_size}) with a CUDA build of torch"
                       if algo == select.TORCH_TWOSHOT and here else "")
                raise UnsupportedError(f"all_reduce: algo={algo!r} is not available on this communicator: "
                                       + (f"its library paths are {here}{why}" if here else
                                          "a library path needs a process group (Communicator), not a VirtualCommunicator"))
            return algo
        alg = algorithms.get(algo)
        if algo not in self._algos:
            raise UnsupportedError(f"all_reduce: algorithm {algo!r} was not enabled for this communicator "
                                   f"(enabled: {', '.join(self._algos)})")
        if bi and not alg.deterministic:
            raise UnsupportedError(f"all_reduce: algorithm {algo!r} is not deterministic (its sum's order varies from "
                                   "call to call); this communicator is batch-invariant: use 'auto' or one of "
                                   f"{', '.join(self._deterministic_algos())}")
        if deterministic and not alg.deterministic:
            raise UnsupportedError(f"all_reduce: algorithm {algo!r} is not deterministic but deterministic=True")
        return algo

    def _deterministic_algos(self) -> tuple[str, ...]:
        return tuple(a for a in self._algos if algorithms.get(a).deterministic)

    def _plan(self, name: str, dt: DType, op: str, n: int) -> _Plan:
        key = (name, dt.short, op, n, self._test_hooks, tuple(sorted(self._defines.items())),
               self._kernel_files.get(name))
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        alg = ALGORITHMS.get(name) or algorithms.GATHER_SCATTER_ALGORITHMS.get(name) or self._customs[name]
        region = alg.region or name  # its scratch region and epochs (shared by some built-ins)
        what = getattr(alg, "opname", "all_reduce")
        alg.check(dt.torch_dtype, op)
        alg.check_world(self.world_size, what)
        rmax = self._rank_cap
        lines = alg.lines_per_rank(n, dt, self.world_size)
        kernel_file = self._kernel_files.get(name, alg.kernel_file)

        def build_for(max_blocks: int) -> tuple[layout.Geometry, Any]:
            if alg.peer_groups:
                geo = layout.plan_peer_groups(lines, self.world_size, max_blocks=max_blocks)
            else:
                geo = layout.plan(lines, max_blocks=max_blocks, max_slots=alg.max_slots(rmax))
            return geo, self._kernel(alg, kernel_file, dt, op, rmax, geo.slots)

        geo, kernel, config = self._fitting_launch(what, build_for, self._region_blocks[region])
        sig = algorithms.signature(alg, dt, op, n)
        rec0, rank_stride = self._record_args()
        tail = abi.kernel_tail({
            "n": n, "st": self._state.data_ptr(), "region_off": self._region_off[region],
            "lines_per_src": layout.lines_per_src(self._region_blocks[region]), "epochs": self._epochs[region].data_ptr(),
            "sig": sig, "rank_base": self._rank_arg(), "nranks": self.world_size, "rec0": rec0,
            "rank_stride": rank_stride})
        n_ptrs = abi.table_size("collective", self._table_ranks)
        bound = driver_launch.BoundLaunch(kernel, config, tail, n_ptrs)
        plan = _Plan(alg, kernel, config, tail, bound)
        self._plans[key] = plan
        return plan

    def _kernel(self, alg: Any, kernel_file: str, dt: DType, op: str, rmax: int, slots: int, fp8: bool = False) -> Any:
        """The compiled entry point of one instantiation (this communicator's extra defines included);
        a user-written collective (sollat.custom) is built from its own source. ``fp8``: the fused
        RMSNorm's FP8 variant."""
        defines = algorithms.kernel_defines(alg, dt, op, rmax, slots, self._test_hooks, real_ranks=self._entry == "pg",
                                            fp8=fp8)
        defines.update(self._defines)
        entry = abi.rmsnorm_entry(alg.kernel, fp8)  # rmsnorm_entry(k, False) is k
        source = getattr(alg, "source", "")
        if source:
            return build.get_source_kernel(source, alg.kernel, entry, defines=defines)
        return build.get_kernel(kernel_file, entry, defines=defines)

    def _launch(self, plan: _Plan, ptr_args: tuple[Any, ...]) -> None:
        stream = launch.stream_handle(self._dev_index)
        if stream != self._last_stream:
            self._order_streams(stream)
        plan.bound(stream, ptr_args)

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

    def _call_plan(self, n: int, dt: DType, op: str, algo: str, deterministic: bool,
                   symmetric: bool = False) -> _Plan | str:
        """Plan of one call, or the name of a library path (select.HANDOVERS) (cached: the eager hot path is one dict lookup). A new
        call shape is compiled here and then agreed on by every rank (comm/agree.py) before its first
        launch: no peer's first-use compile can look like a hang, and a call that differs between
        ranks is an error on every rank before anything runs. ``symmetric``: the call is in place on
        a tensor in symmetric memory (``Communicator.empty``), which may change the library path;
        part of the agreement, since the paths differ."""
        key = (n, dt.torch_dtype, op, algo, deterministic, symmetric)
        entry = self._calls.get(key)
        if entry is None:
            name = self._resolve(algo, n * dt.size, dt.torch_dtype, op, deterministic)
            if symmetric:
                name = self._symmetric_path(name, algo, n * dt.size, dt.torch_dtype, op)
            if name in select.LIBRARY_PATHS:
                self._check_handover(name, n * dt.size, dt, op)
                entry = name
            else:
                entry = self._plan(name, dt, op, n)
            self._agreement.agree(f"{name}|{dt.short}|{op}|n={n}|symmetric={int(symmetric)}",
                                  "this call (algorithm|dtype|op|elements|in place in symmetric memory)")
            self._calls[key] = entry
        return entry

    def _symmetric_path(self, name: str, algo: str, nbytes: int, dtype: torch.dtype, op: str) -> str:
        """The path for a call in place in symmetric memory where ``name`` was chosen (only a
        Communicator has such tensors)."""
        return name

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

    def _collective_tensor(self, opname: str, x: Any, what: str, dtype_of: Callable[[torch.dtype, str], DType]) -> DType:
        """A tensor argument of a collective other than all_reduce: a tensor on this device, of a dtype
        ``dtype_of(dtype, what)`` accepts (it raises a clear error otherwise), within MAX_ELEMENTS."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{opname}: {what} must be a torch.Tensor, got {type(x).__name__}")
        if x.device != self.device:
            raise UnsupportedError(f"{opname}: {what} is on {x.device}; this communicator is on {self.device}")
        dt = dtype_of(x.dtype, what)
        if x.numel() > MAX_ELEMENTS:
            raise UnsupportedError(f"{opname}: {what} has {x.numel()} elements; the limit is {MAX_ELEMENTS}")
        return dt

    def _collective_out(self, opname: str, x: torch.Tensor, out: Any, what: str, shape: tuple[int, ...],
                        dtype_of: Callable[[torch.dtype, str], DType],
                        fits: Callable[[tuple[int, ...]], bool] | None = None) -> torch.Tensor:
        """``out`` checked (or a new tensor of ``shape``): contiguous, on this device, the input's
        dtype, ``shape`` (or a shape ``fits`` accepts)."""
        if out is None:
            return torch.empty(shape, dtype=x.dtype, device=x.device)
        self._collective_tensor(opname, out, what, dtype_of)
        ok = fits(tuple(out.shape)) if fits is not None else tuple(out.shape) == shape
        if not ok or out.dtype != x.dtype or not out.is_contiguous():
            raise UnsupportedError(f"{opname}: {what} must be a contiguous {x.dtype} tensor of shape {shape}, got "
                                   f"{tuple(out.shape)} {out.dtype}{'' if out.is_contiguous() else ' (not contiguous)'}")
        return out

    def _guard(self) -> None:
        if self._faulted:
            raise CommunicatorFaultedError("all_reduce: this communicator saw a device error earlier; "
                                           "call reset() (on every rank) before using it again")

    def _rank_arg(self) -> int:
        raise NotImplementedError

