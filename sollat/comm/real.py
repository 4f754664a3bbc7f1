"""Host API: communicators that own sollat's memory and launch its kernels.

Python owns every byte the kernels touch: the symmetric scratch (one region per algorithm and
protocol, after the control block that holds the fault record), the epoch counters and the
communicator state block. Kernels own nothing. Two communicators share one implementation
(``comm/api.py`` over ``comm/base.py``), each with its launch ranks (``comm/ranks.py``):

* :class:`Communicator` (this module) - one process per GPU over a ``torch.distributed`` process
  group; peer scratch comes from ``torch.distributed._symmetric_memory``.
* :class:`VirtualCommunicator` (``virtual.py``) - R ranks in one process on one GPU: one launch
  serves every rank (rank = blockIdx.y), which is how everything is tested on a single GPU.

Both work eagerly and under CUDA-graph capture (epochs live in device memory, not in kernel
arguments), and both are reachable from ``torch.compile`` through the ``sollat::all_reduce``
custom ops (``sollat/collectives/ops.py``).
"""

from __future__ import annotations

import base64
import contextlib
import pickle
from collections.abc import Sequence
from typing import Any

import torch

from ..collectives import algorithms, handover, select
from ..collectives.custom import Collective, checked_collectives
from ..collectives.registry import lookup_comm
from ..collectives.validate import (
    BATCH_INVARIANT_ENV,
    algorithm_names,
    check_world_size,
    checked_algorithm_names,
    checked_batch_invariant,
    checked_byte_count,
    checked_flag,
    checked_group,
    checked_max_blocks,
    cuda_device,
    default_timeout_s,
    timeout,
)
from ..device import abi, faults, launch, layout, topology
from ..device.dtypes import DType, lookup
from ..errors import SollatError, UnsupportedError
from . import agree
from . import gather_scatter_calls as gs
from .api import _Communicator
from .checks import MAX_ELEMENTS
from .fitting import CLUSTER_MAX_BLOCKS
from .ranks import RealRanks
from .state import scratch_bytes_per_rank
from .virtual import VirtualCommunicator

__all__ = ["CLUSTER_MAX_BLOCKS", "MAX_ELEMENTS", "Communicator", "VirtualCommunicator", "_STATE_FMT",
           "default_timeout_s", "launch", "lookup_comm"]

_STATE_FMT = abi.STATE_FORMAT  # the state block's layout (abi.py, rendered into abi.h)


def _checked_rmsnorm_max_blocks(value: object) -> int | None:
    """``rmsnorm_max_blocks=``: None (the fused algorithms' own blocks) or 1..their blocks."""
    most = algorithms.RMSNORM_MAX_BLOCKS
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most):
        raise UnsupportedError(f"Communicator: rmsnorm_max_blocks must be None or an integer 1..{most}, got {value!r}")
    return value


def _encode(description: topology.GpuDescription | None) -> str:
    return base64.b64encode(pickle.dumps(description)).decode() if description is not None else ""


def _decode(text: str) -> topology.GpuDescription:
    # Posted by this job's own ranks through its process group's store (what all_gather_object
    # would have sent through the group).
    return pickle.loads(base64.b64decode(text))


class Communicator(_Communicator[torch.Tensor, torch.Tensor]):
    """One process per GPU over a ``torch.distributed`` process group.

    ``Communicator(group=None, *, timeout_s=None, debug=False, algorithms=None, max_blocks=None,
    torch_twoshot_bytes=None, collectives=None, gather_scatter=True, batch_invariant=None,
    rmsnorm_max_blocks=None)``

    Scratch is symmetric memory from ``torch.distributed._symmetric_memory`` (no hand-written
    IPC); every rank of ``group`` must construct it collectively. Where the tuning table says a
    library is faster, ``algo="auto"`` hands the call over (``sollat.collectives.handover``): to torch
    symmetric memory's two-shot (its buffer is sized for the table's largest such message, or
    ``torch_twoshot_bytes`` when larger) or to ``torch.distributed.all_reduce`` on ``group``,
    which also serves everything above the table. ``collectives`` registers user-written
    collectives (``sollat.custom``; the same list on every rank, agreed on; run them with ``run``).
    ``gather_scatter`` gives ``all_gather`` / ``reduce_scatter`` their scratch (``sollat.gather_scatter``;
    ``False``: none, and both calls go to torch.distributed). ``batch_invariant`` (None:
    ``SOLLAT_BATCH_INVARIANT``, ``"1"`` on; the same on every rank, agreed on): every call runs
    sollat's rank-order algorithms only, so a row's bits do not depend on its batch
    (``batch_invariant`` attribute; nothing is handed to a library but ``all_gather``, which has no
    arithmetic; no torch two-shot buffer is allocated). ``rmsnorm_max_blocks`` caps the blocks per
    rank the fused RMSNorm regions are sized for (None: the algorithms' own; fewer make a call of
    more rows wait for a free row cluster, never change a bit).

    Construction never leaves a rank waiting on a peer that failed: every step that can fail on
    one rank (arguments and environment, the scratch allocation, the symmetric-memory
    rendezvous, the scratch initialisation, the tuning table) ends in a gate through the store
    (``comm/agree.py``), and a failure on any rank makes every rank raise, within the setup
    timeout (``$SOLLAT_SETUP_TIMEOUT_S``): ``SetupFailedError`` naming the ranks and causes (or
    each rank's own error where every rank failed alike).
    """

    def __init__(self, group: Any = None, *, timeout_s: float | None = None, debug: bool = False,
                 algorithms: Sequence[str] | None = None, max_blocks: int | None = None,
                 torch_twoshot_bytes: int | None = None, collectives: Sequence[Collective] | None = None,
                 gather_scatter: bool = True, batch_invariant: bool | None = None,
                 rmsnorm_max_blocks: int | None = None) -> None:
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        # Arguments and environment first, on every rank, before torch.distributed or the GPU is
        # looked at; a failure is reported through the first gate below, so that no rank waits
        # for a peer that has already given up.
        # A group that is not one cannot carry the gates: that error is raised at once.
        checked_group(group, "Communicator")
        failed: BaseException | None = None
        try:
            invariant = checked_batch_invariant(batch_invariant, "Communicator")
            timeout_value = timeout(timeout_s)
            checked_flag(debug, "debug", "Communicator")
            checked_algorithm_names(algorithms, "Communicator")  # against the world size below
            colls = checked_collectives(collectives, "Communicator")
            customs = tuple(c.algorithm for c in colls)
            gs = checked_flag(gather_scatter, "gather_scatter", "Communicator")
            blocks = checked_max_blocks(max_blocks, "Communicator", default=0)  # 0: the default, set below
            fused_blocks = _checked_rmsnorm_max_blocks(rmsnorm_max_blocks)
            twoshot_asked = checked_byte_count(torch_twoshot_bytes, "torch_twoshot_bytes", "Communicator")
        except SollatError as exc:
            failed = exc
        if not dist.is_initialized():
            raise failed or UnsupportedError("Communicator: torch.distributed is not initialised "
                                             "(call init_process_group)")
        try:
            setup_timeout = faults.validated_timeout(None, what="setup timeout", env="SOLLAT_SETUP_TIMEOUT_S",
                                                     default=faults.DEFAULT_SETUP_TIMEOUT_S)
        except SollatError as exc:  # this rank's gates still need a bound: the default
            setup_timeout, failed = faults.DEFAULT_SETUP_TIMEOUT_S, failed or exc
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        ws = dist.get_world_size(self.group)
        store = agree.default_store(self.group)
        gates: agree.Agreement | agree.NoAgreement = (
            agree.Agreement(store, self.group.group_name, self.rank, ws, setup_timeout) if store is not None
            else agree.NoAgreement())
        mine = None
        if failed is None:
            try:
                dev = cuda_device(None, "Communicator")
                check_world_size(ws, "Communicator")
                names = algorithm_names(algorithms, ws, "Communicator")
                if not blocks:  # every block of a rank must be resident at once: no more blocks than SMs
                    sms = torch.cuda.get_device_properties(dev).multi_processor_count
                    blocks = min(sms, layout.default_max_blocks_real(ws))
                mine = topology.describe_local(dev.index, self.rank)
            except Exception as exc:
                failed = exc
        # Every rank's GPU, through the store (bounded): every rank sees the same list, so the
        # checks below raise on every rank alike (NotOneNVLinkDomainError names the pairs that
        # cannot load/store each other's memory, docs/design.md), before any symmetric memory.
        posted = gates.gate("the argument and environment checks", failed, _encode(mine))
        descriptions = ([_decode(p) for p in posted] if store is not None
                        else topology.gather_descriptions(self.group, dev.index))
        topology.check_shared_gpus(descriptions, self.rank)
        topology.outside_domain_path(descriptions, self.rank, "error")
        size = scratch_bytes_per_rank(ws, names, blocks, customs, gs, fused_blocks)
        # Collective steps run only once a gate has seen every rank ready for them; the store waits
        # inside them (torch's rendezvous) give up after half the setup timeout, so the gate after
        # them, which waits the whole setup timeout, hears from every rank.
        def bounded() -> contextlib.AbstractContextManager[None]:
            return agree.store_timeout(store, setup_timeout / 2) if store is not None else contextlib.nullcontext()

        failed = None
        try:
            buf = symm_mem.empty(size, dtype=torch.uint8, device=dev)
        except Exception as exc:
            failed = exc
        sizes = gates.gate("the scratch allocation", failed, str(size))
        if len(set(sizes)) > 1:  # the same decision on every rank: the same list
            raise UnsupportedError("Communicator: the ranks size their scratch differently (" +
                                   "; ".join(f"rank {r}: {b} bytes" for r, b in enumerate(sizes)) +
                                   "): their algorithms, max_blocks ($SOLLAT_MAX_BLOCKS), rmsnorm_max_blocks, "
                                   "collectives or gather_scatter differ; nothing was mapped")
        failed = None
        try:
            with bounded():
                self._hdl = symm_mem.rendezvous(buf, self.group.group_name)
            ptrs = [int(p) for p in self._hdl.buffer_ptrs]
        except Exception as exc:
            failed = exc
        gates.gate("the symmetric-memory rendezvous", failed)
        failed = None
        try:
            super().__init__(RealRanks(self.rank, buf), world_size=ws, device=dev, scratch_ptrs=ptrs,
                             timeout_s=timeout_value, debug=debug, algos=names, max_blocks=blocks, collectives=colls,
                             gather_scatter=gs, batch_invariant=invariant, fused_blocks=fused_blocks, agreement=gates)
            self._memory.init_scratch([buf])
            torch.cuda.synchronize(dev)
        except Exception as exc:
            failed = exc
        # Every rank's scratch is initialised (and synchronised) before any rank sends: this gate
        # is the barrier, on the host, through the store.
        gates.gate("the scratch initialisation", failed)
        self._torch_twoshot: handover.TorchTwoShot | None = None
        self._torch_twoshot_bytes = self._torch_twoshot_capacity(twoshot_asked)
        self._agree_on_setup()
        if self._torch_twoshot_bytes:  # collective, and the same size on every rank (agreed above)
            failed = None
            try:
                with bounded():
                    self._torch_twoshot = handover.TorchTwoShot(self.group, dev, self._torch_twoshot_bytes)
            except Exception as exc:
                failed = exc
            gates.gate("the torch two-shot buffer", failed)
        self._symm = handover.SymmetricTensors(self.group.group_name, dev)

    def _torch_twoshot_capacity(self, asked: int) -> int:
        """Bytes of the torch two-shot buffer: the table's largest torch_twoshot message or
        ``asked``, whichever is larger (0 when this torch has no two-shot op or runs none on this
        world size, or in batch-invariant mode, which never uses it)."""
        if self._batch_invariant or not handover.torch_twoshot_available(self.world_size):
            return 0
        try:
            need = self._selection_table().handover_bytes(select.TORCH_TWOSHOT)
        except SollatError:
            need = 0  # a table that cannot be read is reported by _agree_on_setup, on every rank
        return max(need, asked)

    def _agree_on_setup(self) -> None:
        """Every rank must select from the same table, time out alike and size its buffers alike,
        or `auto` could send one rank to NCCL and another to a sollat kernel (both would hang)."""
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
        self._agreement.agree(f"timeout {self.timeout_s:g} s; algorithms {','.join(self._algos)}; "
                              f"max_blocks {self.max_blocks}; rmsnorm_max_blocks {self._fused_blocks}; "
                              f"torch_twoshot_bytes {self._torch_twoshot_bytes}; "
                              f"collectives {';'.join(c.describe() for c in self._collectives.values())}; "
                              f"gather_scatter {self._gather_scatter}; "
                              f"rmsnorm two-shot {int(self._rmsnorm_twoshot)}; "
                              f"batch_invariant {int(self._batch_invariant)}",
                              "the communicator's timeout, algorithms, max_blocks, rmsnorm_max_blocks, torch_twoshot_bytes, "
                              "collectives (name:protocol:options:source hash), gather_scatter, "
                              f"{algorithms.RMSNORM_TWOSHOT_ENV} and batch_invariant (${BATCH_INVARIANT_ENV})")

    @property
    def handovers(self) -> tuple[str, ...]:
        """Library paths this communicator can hand a call to (``sollat.collectives.handover``)."""
        return tuple(sorted(self._handovers()))

    def _handovers(self) -> frozenset[str]:
        if self._batch_invariant:  # all_reduce never hands over in this mode
            return frozenset()
        return frozenset({select.NCCL, select.TORCH_TWOSHOT} if self._torch_twoshot else {select.NCCL})

    def _check_handover(self, name: str, nbytes: int, dt: DType, op: str) -> None:
        if name == select.TORCH_TWOSHOT and self._torch_twoshot is not None:
            self._torch_twoshot.check(nbytes, dt, op)

    def _symmetric_path(self, name: str, algo: str, nbytes: int, dtype: torch.dtype, op: str) -> str:
        # In place on a tensor in symmetric memory, torch's two-shot needs no copy and beat NCCL
        # in place and the bulk two-shot (select.LARGE_MESSAGE_PATHS): it takes every size ``auto``
        # would give to one of those. Never in batch-invariant mode (a library path).
        if self._batch_invariant:
            return name
        if ((algo == "auto" and name in select.LARGE_MESSAGE_PATHS
             or algo == select.TORCH_TWOSHOT and name in select.HANDOVERS)
                and handover.torch_twoshot_available(self.world_size)
                and select.handover_serves(select.TORCH_TWOSHOT_ZERO_COPY, dtype, op, nbytes)):
            return select.TORCH_TWOSHOT_ZERO_COPY
        return name

    def library_path(self, kind: str, numel: int, dtype: torch.dtype, op: str = "sum") -> str | None:
        """The library path ``algo="auto"`` gives a call of ``kind`` (``all_reduce``, ``all_gather``,
        ``reduce_scatter``) on ``numel`` input elements of ``dtype`` with ``op`` (``select.LIBRARY_PATHS``),
        or None where sollat's kernels run it. The decision the call itself makes (its cached plan):
        a new call shape is compiled and agreed on by every rank here, as on its first call, so every
        rank must ask alike. Raises UnsupportedError for a dtype or op sollat does not take."""
        if kind == "all_reduce":
            if op not in ("sum", "max", "min"):
                raise UnsupportedError(f"library_path: op {op!r} is not supported; supported ops: sum, max, min")
            plan = self._call_plan(numel, lookup(dtype, "library_path"), op, "auto", False, False)
        elif kind in ("all_gather", "reduce_scatter"):
            gs.check_args(kind, op if kind == "reduce_scatter" else "", "auto", real=True,
                          batch_invariant=self._batch_invariant)
            plan = self._gs_plan(kind, numel, gs.dtype_of(kind)(dtype, "tensor"), op if kind == "reduce_scatter" else "",
                                 "auto")
        else:
            raise UnsupportedError(f"library_path: kind must be all_reduce, all_gather or reduce_scatter, got {kind!r}")
        return plan if isinstance(plan, str) else None

    def empty(self, *size: Any, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``empty(*size, dtype=torch.float32) -> Tensor``

        A tensor in symmetric memory on this communicator's group (collective: every rank calls it
        with the same size and dtype). ``all_reduce(t, out=t)`` in place on it (or on a view into
        it that starts 16-byte aligned) needs no copy into library buffers: where ``auto`` hands a
        message to a library, torch's two-shot reads every rank's tensor where it is. Kept alive
        as long as the communicator (its address must never be mistaken for a later
        allocation's). Every rank must call alike: a call in place on such a tensor on some ranks
        and on an ordinary tensor (or out of place) on others is refused on every rank before it
        runs."""
        if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
            size = tuple(size[0])
        if not all(isinstance(d, int) and d >= 0 for d in size):
            raise UnsupportedError(f"Communicator.empty: size must be non-negative ints, got {size!r}")
        lookup(dtype, "Communicator.empty")  # a dtype sollat reduces, or a clear error
        return self._symm.empty(tuple(size), dtype)

    # ---- library paths ---------------------------------------------------------------------------
    def _zero_copy(self, x: torch.Tensor, y: torch.Tensor) -> bool:
        return bool(self._symm) and self._symm.zero_copy(x, y)

    def _library_all_reduce(self, path: str, x: torch.Tensor, y: torch.Tensor, op: str) -> None:
        if path == select.TORCH_TWOSHOT_ZERO_COPY:
            self._symm.two_shot(x)
        elif path == select.TORCH_TWOSHOT and self._torch_twoshot is not None:
            self._torch_twoshot(x, y)
        else:
            handover.nccl_all_reduce(x, y, op, self.group)

    def _library_gather_scatter(self, kind: str, x: torch.Tensor, y: torch.Tensor, op: str) -> None:
        if kind == "all_gather":
            handover.nccl_all_gather(x, y, self.group)
        else:
            handover.nccl_reduce_scatter(x, y, op, self.group)

    def reset(self) -> None:
        """Collective: clear a recorded fault and re-initialise buffers and epochs on every rank.

        Every wait is on the host, through the process group's store (``agree.Agreement.recovery``;
        never a device-group barrier, which waits on NCCL's watchdog when a peer died), bounded by
        ``agree.reset_wait_s(timeout_s)``: 2 x the communicator's ``timeout_s`` + RESET_SLACK_S
        (a rank whose kernels returned at once reaches reset() up to one ``timeout_s`` before a
        peer whose kernel spun until it timed out). Where a rank does not arrive, every rank that
        did raises ``PeerTimeoutError`` naming it within that time, and stays faulted. A
        successful reset also moves every rank's host agreement to a new epoch, so that its rounds
        line up again whatever rank gave up on which round before."""
        # This rank's streams are idle first (its kernels end within timeout_s: every spin is
        # bounded); every rank is idle before any rank re-fills its scratch (a peer's kernel could
        # otherwise still write into it), and every rank has re-filled before any rank sends again.
        torch.cuda.synchronize(self.device)
        if isinstance(self._agreement, agree.NoAgreement):  # no store to wait through: torch's barrier
            import torch.distributed as dist

            dist.barrier(group=self.group)
            self._reset_local()
            dist.barrier(group=self.group)
            return
        with self._agreement.recovery(agree.reset_wait_s(self.timeout_s)) as barrier:
            barrier("reset() with every stream idle")
            self._reset_local()
            try:
                barrier("reset() with its scratch re-initialised")
            except Exception:
                self._faulted = True  # its peers did not re-initialise: no call may run until a reset passes
                raise
