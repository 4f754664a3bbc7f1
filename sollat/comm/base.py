"""What both communicators share: their state (all of it set in ``_CommCore.__init__``), the
choice of algorithm, the call cache with its first-use agreement, the launch with its stream
ordering, the fault flow, and the argument checks of ``all_reduce``.

The parts it is built from: the launch ranks (``ranks.py``: one real rank or R virtual ones), the
device memory (``state.py``), the launch plans (``plan.py``, fitted by ``fitting.py``). The public
ops are ``api.py``'s; the two communicators are ``real.py`` (one process per GPU) and
``virtual.py`` (R ranks on one GPU).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..collectives import algorithms, handover, registry, rmsnorm, rmsnorm_rules, select
from ..collectives.custom import Collective
from ..device import faults, launch, layout
from ..device.dtypes import OPS, DType, lookup
from ..errors import CommunicatorFaultedError, PeerTimeoutError, UnsupportedError
from . import agree
from .checks import MAX_ELEMENTS
from .each_call import EachCall
from .fitting import Fitting
from .plan import Kernels, _Plan
from .ranks import Ranks
from .state import DeviceMemory


class _CommCore:
    """The state of a communicator and the steps every call shares (not public)."""

    def __init__(self, ranks: Ranks, *, world_size: int, device: torch.device, scratch_ptrs: list[int],
                 timeout_s: float, debug: bool, algos: Sequence[str], max_blocks: int,
                 collectives: Sequence[Collective] = (), gather_scatter: bool = False,
                 batch_invariant: bool = False, fused_blocks: int | None = None, cluster_ranks: bool = False,
                 agreement: agree.Agreement | agree.NoAgreement | None = None) -> None:
        """Every argument is validated by the constructors (``collectives.validate``). ``ranks``:
        the launch ranks, with their scratch (``scratch_ptrs``: every rank's address);
        ``max_blocks``: blocks per rank the scratch is sized for; ``fused_blocks``: the fused
        RMSNorm regions' (None: the algorithms' own); ``agreement``: the ranks' agreement on every
        new call shape (None: none, a single process)."""
        # What the caller asked for.
        self.world_size = world_size
        self.device = device
        self.timeout_s = timeout_s
        self.debug = debug
        self.max_blocks = max_blocks
        self._algos = tuple(algos)
        self._batch_invariant = batch_invariant  # docs/design.md "Arithmetic and batch invariance"
        self._collectives = {c.name: c for c in collectives}  # user-written collectives (sollat.custom)
        self._gather_scatter = gather_scatter  # built-in AllGather/ReduceScatter regions (gather_scatter.py)
        self._fused_blocks = fused_blocks
        # The GPU, the launch ranks and their memory, and the plans of their kernels.
        self._ranks = ranks
        self._dev_index: int = device.index
        launch.ensure_device(device.index)
        props = torch.cuda.get_device_properties(device)
        self.gpu_name: str = props.name
        customs = tuple(c.algorithm for c in collectives)
        regions = algorithms.regions(self._algos, max_blocks, customs, gather_scatter, fused_blocks)
        self._rmsnorm_twoshot = any(reg.name in algorithms.RMSNORM_EXPERIMENTAL for reg in regions)
        self._memory = DeviceMemory(world_size, device, regions, scratch_ptrs, ranks.launch_ranks, timeout_s)
        self.scratch_bytes_per_rank = self._memory.bytes_per_rank
        self._fitting = Fitting(real=ranks.real, launch_ranks=ranks.launch_ranks, device=device,
                                gpu_name=props.name, num_sms=props.multi_processor_count, cluster_ranks=cluster_ranks)
        self._kernels = Kernels(world_size, ranks, self._memory, self._fitting, {a.name: a for a in customs})
        # Calls: faults seen, the call cache and what fills it, stream ordering.
        self._faulted = False  # a fault was raised here: every call raises until reset()
        self._err_host: np.ndarray = self._memory.flag.numpy()  # the host-mapped fault flag (read without a sync)
        self._agreement = agreement or agree.NoAgreement()
        # Every call a library path serves is agreed on first (each_call.py; None: no store).
        self._each_call = (EachCall(self._agreement.store, self._agreement.prefix, self._agreement.rank,
                                    self._agreement.world_size, timeout_s)
                           if isinstance(self._agreement, agree.Agreement) else None)
        self._calls: dict[tuple[Any, ...], _Plan | str] = {}  # call shape -> plan | library path
        self._choices: dict[tuple[Any, ...], str] = {}  # what `auto` picked, by message
        self._table: select.Table | None = None  # the tuning table (read on first use)
        self._last_stream = 0  # handle of the stream of the last launch (0: none yet)
        self._last_stream_obj: Any = None
        self._order_event: Any = None
        self.comm_id = registry.register(self)

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

    @property
    def gather_scatter(self) -> bool:
        """Whether this communicator has the built-in AllGather/ReduceScatter scratch regions."""
        return self._gather_scatter

    @property
    def collectives(self) -> tuple[str, ...]:
        """Names of the user-written collectives registered at construction."""
        return tuple(self._collectives)

    # ---- diagnostic builds and test hooks (sollat/testing.py) -----------------------------------
    @property
    def _extra_defines(self) -> dict[str, str]:
        """Extra NVRTC defines for every kernel of this communicator (test and diagnostic builds)."""
        return self._kernels.defines

    @_extra_defines.setter
    def _extra_defines(self, value: dict[str, str]) -> None:
        self._kernels.defines = dict(value)
        self._calls.clear()

    def _set_kernel_files(self, files: dict[str, str]) -> None:
        """Build these algorithms from other files of csrc/kernels (sollat.testing.set_defines)."""
        self._kernels.kernel_files = dict(files)
        self._calls.clear()

    # Kernels built with SOLLAT_TEST_HOOKS read `absent` (that rank's blocks return at once) and
    # `mismatch` (that rank flips a bit of its call signature) from the state block.
    def _set_test_hooks(self, *, absent: int | None = None, mismatch: int | None = None,
                        armed: bool | None = None) -> None:
        hooks = bool(armed) or absent is not None or mismatch is not None
        if hooks != self._kernels.test_hooks:
            self._kernels.test_hooks = hooks
            self._calls.clear()
        torch.cuda.synchronize(self.device)
        self._memory.write_state(self.timeout_s, absent_rank=-1 if absent is None else absent,
                                 mismatch_rank=-1 if mismatch is None else mismatch)
        torch.cuda.synchronize(self.device)

    # ---- which algorithm -----------------------------------------------------------------------
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

    def own_pick_limit(self) -> int | None:
        """The largest message for which ``auto`` on this communicator picks what it would pick with
        every sollat algorithm enabled (``None``: every size); above it this communicator's
        ``algorithms`` leave out the table's choice (``select.own_pick_limit``)."""
        return select.own_pick_limit(self._selection_table(), self._algos, self.world_size)

    def _selection_table(self) -> select.Table:
        if self._table is None:  # read once per communicator; a new `tune` table needs a new one
            real = self._ranks.real
            self._table = select.find_table(self.gpu_name, self.world_size, mode="real" if real else "virtual",
                                            interconnect=select.detect_interconnect(self._dev_index) if real
                                            else select.ANY)
            select.log_if_untuned(self._table, self.gpu_name, self.world_size, "real" if real else "virtual")
        return self._table

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

    def selected_rmsnorm_algorithm(self, nbytes: int, dtype: torch.dtype, rows: int = 1) -> str:
        """What ``all_reduce_rmsnorm(algo="auto")`` picks for ``nbytes`` of ``x`` in ``rows`` rows
        (a public name: ``oneshot_ll``, ``oneshot_sentinel`` or ``unfused``)."""
        return rmsnorm.public_name(self._rmsnorm_resolve("auto", nbytes, dtype, rows))

    def _rmsnorm_resolve(self, algo: str, nbytes: int, dtype: torch.dtype, rows: int = 1) -> str:
        """Internal algorithm name. ``auto``: rmsnorm.auto_choice under the tuning table's rule
        (rmsnorm_rules: a fused one-shot, by name or as the AllReduce table's choice among
        rmsnorm.AUTO_ALGOS for the call's bytes, or the unfused hand-over; the fused two-shot only
        by name)."""
        if algo == "auto":
            key = ("rmsnorm", nbytes, dtype)
            choice = self._choices.get(key)
            if choice is None:
                choice = select.choose(self._selection_table(), nbytes, dtype, "sum", deterministic=True,
                                       handovers=frozenset(), available=rmsnorm.AUTO_ALGOS)
                self._choices[key] = choice
            rules = rmsnorm_rules.rules_for(self._selection_table().rmsnorm, self.world_size, self._ranks.real)
            return rmsnorm.internal_name(rmsnorm.auto_choice(rows, nbytes, choice, rules))
        name = rmsnorm.internal_name(algo)
        if name in algorithms.RMSNORM_EXPERIMENTAL and not self._rmsnorm_twoshot:  # not enabled at construction
            raise UnsupportedError(f"{rmsnorm.OPNAME}: algo={algo!r} is experimental (slower than the one-shot on "
                                   "2 GPUs; a fault may name the wrong peer): construct the communicator with "
                                   f"{algorithms.RMSNORM_TWOSHOT_ENV}=1 in the environment of every rank to enable it")
        return name

    # ---- library paths (a Communicator's; a VirtualCommunicator has none) -------------------------
    def _handovers(self) -> frozenset[str]:
        """Library paths this communicator can hand a call to (select.HANDOVERS)."""
        return frozenset()

    def _check_handover(self, name: str, nbytes: int, dt: DType, op: str) -> None:
        """Raise if library path ``name`` cannot serve this call (its first use)."""

    def _symmetric_path(self, name: str, algo: str, nbytes: int, dtype: torch.dtype, op: str) -> str:
        """The path for a call in place in symmetric memory where ``name`` was chosen (only a
        Communicator has such tensors)."""
        return name

    def _zero_copy(self, x: torch.Tensor, y: torch.Tensor) -> bool:
        """Whether an in-place call on ``x`` may use a library's zero-copy path (symmetric memory)."""
        return False

    def _agree_library_call(self, text: str) -> None:
        """Before a call a library path serves: every rank made this call (``each_call.py``), or
        every rank raises; a rank that did not come in time faults the communicator (reset())."""
        if self._each_call is None:
            return
        try:
            self._each_call.agree(text)
        except PeerTimeoutError:
            self._faulted = True
            raise

    def _library_all_reduce(self, path: str, x: torch.Tensor, y: torch.Tensor, op: str) -> None:
        raise AssertionError(f"a {type(self).__name__} never hands a call over (got {path!r})")

    def _library_gather_scatter(self, kind: str, x: torch.Tensor, y: torch.Tensor, op: str) -> None:
        raise AssertionError(f"a {type(self).__name__} never hands a call over ({kind})")

    # ---- one launch ----------------------------------------------------------------------------
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

    def _check_common(self, x: torch.Tensor, op: str, what: str) -> DType:
        """An all_reduce tensor: a CUDA tensor on this device, of a dtype and op sollat reduces."""
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

    # ---- faults --------------------------------------------------------------------------------
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
            rec = faults.read_record(lambda v=view: self._memory.read_now(v) if peek else v.cpu().numpy())
            if rec[0] != layout.FAULT_OK:
                self._faulted = True
                raise faults.to_exception(rec, timeout_s=self.timeout_s, where_seen=rank)

    def _record_views(self) -> list[tuple[int, torch.Tensor]]:
        """(rank, its fault record as int32 words) for every rank this process runs."""
        return self._ranks.record_views()

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

    def _guard(self) -> None:
        if self._faulted:
            raise CommunicatorFaultedError("all_reduce: this communicator saw a device error earlier; "
                                           "call reset() (on every rank) before using it again")

    def _reset_local(self) -> None:
        """This process's part of reset(): epochs, scratch and fault flag as at construction."""
        self._memory.reset(self._ranks.scratch_views())
        self._err_host[:] = 0
        self._faulted = False
        if self._each_call is not None:
            self._each_call.realign()
