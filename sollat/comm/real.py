"""Host API: communicators that own sollat's memory and launch its kernels.

Python owns every byte the kernels touch: the symmetric scratch (one region per algorithm and
protocol, after the control block that holds the fault record), the epoch counters and the
communicator state block. Kernels own nothing. Two communicators share one implementation
(``comm/base.py``, with the device state and faults in ``comm/state.py``):

* :class:`Communicator` (this module) - one process per GPU over a ``torch.distributed`` process
  group; peer scratch comes from ``torch.distributed._symmetric_memory``.
* :class:`VirtualCommunicator` (``virtual.py``) - R ranks in one process on one GPU: one launch
  serves every rank (rank = blockIdx.y), which is how everything is tested on a single GPU.

Both work eagerly and under CUDA-graph capture (epochs live in device memory, not in kernel
arguments), and both are reachable from ``torch.compile`` through the ``sollat::all_reduce``
custom ops (``sollat/ops.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, overload

import torch

from .. import algorithms, faults, handover, launch, layout, rmsnorm, rmsnorm_checks, select, topology
from .. import rmsnorm_epilogue as epilogue
from ..custom import Collective, checked_collectives
from ..dtypes import DTYPES, OPS, DType, lookup
from ..errors import SollatError, UnsupportedError
from ..registry import lookup_comm
from ..validate import (
    BATCH_INVARIANT_ENV,
    algorithm_names,
    check_world_size,
    checked_batch_invariant,
    checked_byte_count,
    checked_flag,
    checked_max_blocks,
    cuda_device,
    default_timeout_s,
    timeout,
)
from . import agree
from .base import MAX_ELEMENTS, _Plan
from .custom_calls import CustomCalls
from .fitting import CLUSTER_MAX_BLOCKS
from .gather_scatter_calls import GatherScatterCalls
from .rmsnorm_calls import RmsnormCalls
from .state import _STATE_FMT, _record_view, scratch_bytes_per_rank
from .virtual import VirtualCommunicator

__all__ = ["CLUSTER_MAX_BLOCKS", "MAX_ELEMENTS", "Communicator", "VirtualCommunicator", "_STATE_FMT",
           "default_timeout_s", "launch", "lookup_comm"]


_is_compiling = torch.compiler.is_compiling


def _hot_numel(x: Any, out: Any, dev: int) -> int:
    """``x.numel()`` if the hot path of ``all_reduce`` may take ``x`` and ``out``, else -1: ``x``
    a contiguous tensor on device ``dev``; ``out`` None, ``x`` itself, or a contiguous tensor on
    ``dev`` of ``x``'s dtype and element count. (Whether the dtype, op and algorithm are valid is
    known from the call cache: only a checked call shape is in it.)"""
    try:
        if x.get_device() != dev or not x.is_contiguous():
            return -1
        n: int = x.numel()
        if out is None or out is x or (out.get_device() == dev and out.dtype is x.dtype and out.numel() == n
                                       and out.is_contiguous()):
            return n
    except AttributeError:  # not a tensor: _all_reduce_impl says so
        pass
    return -1


class Communicator(GatherScatterCalls, CustomCalls, RmsnormCalls):
    """One process per GPU over a ``torch.distributed`` process group.

    ``Communicator(group=None, *, timeout_s=None, debug=False, algorithms=None, max_blocks=None,
    torch_twoshot_bytes=None, collectives=None, gather_scatter=True, batch_invariant=None)``

    Scratch is symmetric memory from ``torch.distributed._symmetric_memory`` (no hand-written
    IPC); every rank of ``group`` must construct it collectively. Where the tuning table says a
    library is faster, ``algo="auto"`` hands the call over (``sollat.handover``): to torch
    symmetric memory's two-shot (its buffer is sized for the table's largest such message, or
    ``torch_twoshot_bytes`` when larger) or to ``torch.distributed.all_reduce`` on ``group``,
    which also serves everything above the table. ``collectives`` registers user-written
    collectives (``sollat.custom``; the same list on every rank, agreed on; run them with ``run``).
    ``gather_scatter`` gives ``all_gather`` / ``reduce_scatter`` their scratch (``sollat.gather_scatter``;
    ``False``: none, and both calls go to torch.distributed). ``batch_invariant`` (None:
    ``SOLLAT_BATCH_INVARIANT``, ``"1"`` on; the same on every rank, agreed on): every call runs
    sollat's rank-order algorithms only, so a row's bits do not depend on its batch
    (``batch_invariant`` attribute; nothing is handed to a library but ``all_gather``, which has no
    arithmetic; no torch two-shot buffer is allocated).
    """

    _entry = "pg"

    def __init__(self, group: Any = None, *, timeout_s: float | None = None, debug: bool = False,
                 algorithms: Sequence[str] | None = None, max_blocks: int | None = None,
                 torch_twoshot_bytes: int | None = None, collectives: Sequence[Collective] | None = None,
                 gather_scatter: bool = True, batch_invariant: bool | None = None) -> None:
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        invariant = checked_batch_invariant(batch_invariant, "Communicator")
        if not dist.is_initialized():
            raise UnsupportedError("Communicator: torch.distributed is not initialised (call init_process_group)")
        timeout_value = timeout(timeout_s)
        setup_timeout = faults.validated_timeout(None, what="setup timeout", env="SOLLAT_SETUP_TIMEOUT_S",
                                                 default=faults.DEFAULT_SETUP_TIMEOUT_S)
        customs = self._register_collectives(checked_collectives(collectives, "Communicator"))
        gs = checked_flag(gather_scatter, "gather_scatter", "Communicator")
        blocks = checked_max_blocks(max_blocks, "Communicator", default=0)  # 0: the default, set below
        twoshot_asked = checked_byte_count(torch_twoshot_bytes, "torch_twoshot_bytes", "Communicator")
        dev = cuda_device(None, "Communicator")
        if not blocks:  # every block of a rank must be resident at once: no more blocks than SMs
            sms = torch.cuda.get_device_properties(dev).multi_processor_count
            blocks = min(sms, layout.default_max_blocks_real(dist.get_world_size(group)))
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        ws = dist.get_world_size(self.group)
        check_world_size(ws, "Communicator")
        # Collective, before any symmetric memory: every rank gets the same NotOneNVLinkDomainError
        # naming the pairs that cannot load/store each other's memory (docs/design.md).
        topology.check_group(self.group, dev.index, "error")
        names = algorithm_names(algorithms, ws, "Communicator")
        self._buf = symm_mem.empty(scratch_bytes_per_rank(ws, names, blocks, customs, gs), dtype=torch.uint8,
                                   device=dev)
        self._hdl = symm_mem.rendezvous(self._buf, self.group.group_name)
        ptrs = [int(p) for p in self._hdl.buffer_ptrs]
        self._setup(ws, dev, ptrs, 1, timeout_value, debug, names, blocks, customs, gs, invariant)
        store = agree.default_store(self.group)
        if store is not None:
            self._agreement = agree.Agreement(store, self.group.group_name, self.rank, ws, setup_timeout)
        self._init_scratch([self._buf])
        torch.cuda.synchronize(dev)
        dist.barrier(group=self.group)  # every rank's scratch is initialised before anyone sends
        self._torch_twoshot: handover.TorchTwoShot | None = None
        self._torch_twoshot_bytes = self._torch_twoshot_capacity(twoshot_asked)
        self._agree_on_setup()
        if self._torch_twoshot_bytes:  # collective, and the same size on every rank (agreed above)
            self._torch_twoshot = handover.TorchTwoShot(self.group, dev, self._torch_twoshot_bytes)
        self._symm = handover.SymmetricTensors(self.group.group_name, dev)

    def _rank_arg(self) -> int:
        return self.rank

    def _record_views(self) -> list[tuple[int, torch.Tensor]]:
        return [(self.rank, _record_view(self._buf))]

    def _record_args(self) -> tuple[int, int]:
        return self._scratch_ptrs[self.rank] + layout.FAULT_RECORD_OFFSET, 0

    def _torch_twoshot_capacity(self, asked: int) -> int:
        """Bytes of the torch two-shot buffer: the table's largest torch_twoshot message or
        ``asked``, whichever is larger (0 when this torch has no two-shot op, or in batch-invariant
        mode, which never uses it)."""
        if self._batch_invariant or not handover.torch_twoshot_available():
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
                              f"max_blocks {self.max_blocks}; torch_twoshot_bytes {self._torch_twoshot_bytes}; "
                              f"collectives {';'.join(c.describe() for c in self._collectives.values())}; "
                              f"gather_scatter {self._gather_scatter}; "
                              f"rmsnorm two-shot {int(self._rmsnorm_twoshot)}; "
                              f"batch_invariant {int(self._batch_invariant)}",
                              "the communicator's timeout, algorithms, max_blocks, torch_twoshot_bytes, "
                              "collectives (name:protocol:options:source hash), gather_scatter, "
                              f"{algorithms.RMSNORM_TWOSHOT_ENV} and batch_invariant (${BATCH_INVARIANT_ENV})")

    @property
    def handovers(self) -> tuple[str, ...]:
        """Library paths this communicator can hand a call to (``sollat.handover``)."""
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
                and handover.torch_twoshot_available()
                and select.handover_serves(select.TORCH_TWOSHOT_ZERO_COPY, dtype, op, nbytes)):
            return select.TORCH_TWOSHOT_ZERO_COPY
        return name

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

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", algo: str = "auto", *,
                   out: torch.Tensor | None = None, deterministic: bool = False) -> torch.Tensor:
        """``all_reduce(tensor, op="sum", algo="auto", *, out=None, deterministic=False) -> Tensor``

        Returns the reduction over every rank of ``group`` (a new tensor unless ``out`` is given;
        ``out=tensor`` reduces in place). ``out`` is a contiguous tensor of the input's dtype and
        number of elements, in any shape (as a flat buffer, like NCCL's). Every rank must call it
        with the same shape, dtype, op and algo. On a ``batch_invariant`` communicator ``auto`` runs
        only sollat's rank-order algorithms (the same bits whichever it picks) and ``algo`` naming a
        library path or ``ll128`` raises ``UnsupportedError``.
        """
        if _is_compiling():
            from .. import ops

            return ops.all_reduce(tensor, self.comm_id, op, algo, deterministic)
        # The hot path: an eager call's host time is on the decode critical path (issue 13). A
        # call shape launched before, on tensors _hot_numel accepts, goes from one dict lookup to
        # one driver call. Anything else (a first call, a library path, a fault seen, any argument
        # to check) takes _all_reduce_impl, which checks every argument with a clear error.
        n = -1 if self._faulted or self._err_host[0] else _hot_numel(tensor, out, self._dev_index)
        if n <= 0:
            return self._all_reduce_impl(tensor, op, algo, out, deterministic)
        y = torch.empty_like(tensor) if out is None else out
        px, py = tensor.data_ptr(), y.data_ptr()
        plan = self._calls.get((n, tensor.dtype, op, algo, deterministic, px == py and self._symm.zero_copy(tensor, y)))
        if plan.__class__ is not _Plan:
            return self._all_reduce_impl(tensor, op, algo, y, deterministic)
        stream = launch.stream_handle(self._dev_index)
        if stream != self._last_stream:
            self._order_streams(stream)
        plan.bound(stream, (px, py))  # type: ignore[union-attr]
        if self.debug:
            self._after_call()
        return y

    def _all_reduce_impl(self, tensor: torch.Tensor, op: str, algo: str, out: torch.Tensor | None,
                         deterministic: bool) -> torch.Tensor:
        self._before_call()
        dt = DTYPES.get(tensor.dtype) if isinstance(tensor, torch.Tensor) else None
        fast = (dt is not None and op in OPS and tensor.get_device() == self._dev_index and tensor.is_contiguous()
                and tensor.numel() <= MAX_ELEMENTS
                and (out is None or (isinstance(out, torch.Tensor) and out.get_device() == self._dev_index
                                     and out.dtype is tensor.dtype and out.numel() == tensor.numel()
                                     and out.is_contiguous())))
        if fast:
            x = tensor
        else:  # every check with a clear error; a non-contiguous input is copied
            dt = self._check_common(tensor, op, "tensor")
            x = tensor if tensor.is_contiguous() else tensor.contiguous()
            if out is not None:
                self._check_common(out, op, "out")
                if out.numel() != tensor.numel() or out.dtype != tensor.dtype or not out.is_contiguous():
                    raise UnsupportedError("all_reduce: out must be a contiguous tensor with the input's dtype and number of "
                                           f"elements ({tensor.numel()} {tensor.dtype}), got {out.numel()} {out.dtype}"
                                           + ("" if out.is_contiguous() else " (not contiguous)"))
        assert dt is not None
        y = torch.empty_like(x) if out is None else out
        n = x.numel()
        if n == 0:
            return y
        plan = self._call_plan(n, dt, op, algo, deterministic, bool(self._symm) and self._symm.zero_copy(x, y))
        if isinstance(plan, str):  # a library path, where it beats sollat's kernels (handover.py)
            if plan == select.TORCH_TWOSHOT_ZERO_COPY:
                self._symm.two_shot(x)
            elif plan == select.TORCH_TWOSHOT and self._torch_twoshot is not None:
                self._torch_twoshot(x, y)
            else:
                handover.nccl_all_reduce(x, y, op, self.group)
            return y
        self._launch(plan, (x.data_ptr(), y.data_ptr()))
        self._after_call()
        return y

    @overload
    def all_reduce_rmsnorm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                           algo: str = "auto", *, out: torch.Tensor | None = None,
                           residual_out: torch.Tensor | None = None, fp8_scale: None = None,
                           fp8_out: None = None) -> tuple[torch.Tensor, torch.Tensor]: ...

    @overload
    def all_reduce_rmsnorm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                           algo: str = "auto", *, out: torch.Tensor | None = None,
                           residual_out: torch.Tensor | None = None, fp8_scale: torch.Tensor,
                           fp8_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...

    def all_reduce_rmsnorm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                           algo: str = "auto", *, out: torch.Tensor | None = None,
                           residual_out: torch.Tensor | None = None, fp8_scale: torch.Tensor | None = None,
                           fp8_out: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """``all_reduce_rmsnorm(x, residual, weight, eps=1e-6, algo="auto", *, out=None,
        residual_out=None, fp8_scale=None, fp8_out=None) -> (y, residual_out[, q])``

        Fused AllReduce + residual add + RMSNorm with vLLM's ``fused_add_rms_norm`` semantics
        (sollat/rmsnorm.py has the exact arithmetic): ``x`` is this rank's partial sums
        ``[..., hidden]``, ``residual`` the residual of the same shape and dtype, ``weight``
        ``[hidden]``. Returns ``y = rmsnorm(allreduce(x) + residual) * weight`` and the new
        residual ``allreduce(x) + residual`` (``residual_out=residual`` updates it in place;
        ``out=x`` writes ``y`` over ``x``). Bitwise identical on every rank. ``algo``: ``auto``
        (a fused one-shot for one or two rows of 16 KiB or more, else ``unfused``: ``rmsnorm.auto_choice``),
        ``oneshot_ll``, ``oneshot_sentinel``, ``unfused`` (sollat's deterministic AllReduce,
        library paths included unless the communicator is ``batch_invariant``, into ``out``, then
        one kernel for the add and the norm), or the experimental two-shot ``twoshot_sentinel``
        (``algorithms.RMSNORM_TWOSHOT_ENV``). Every algorithm computes the same bits
        (``rmsnorm.reference``, on sollat's AllReduce), so a row's result does not depend on its
        batch nor on which algorithm ``auto`` picks.

        ``fp8_scale`` (a float32 tensor of one element on the device, vLLM's static per-tensor
        scale, read by the kernel at every launch) also writes and returns, third, the
        float8_e4m3fn copy ``q = e4m3(clamp(float(y) / scale, -448, 448))`` of the rounded ``y``
        (vLLM's ``fused_add_rms_norm_static_fp8_quant``; every NaN as 0x7F; ``rmsnorm.fp8_reference``),
        into ``fp8_out`` when given (float8_e4m3fn, x's shape, contiguous).
        """
        if torch.compiler.is_compiling():
            from .. import ops

            rmsnorm_checks.no_scale_no_copy(fp8_scale, fp8_out)
            if fp8_scale is None:
                got = ops.all_reduce_rmsnorm(x, residual, weight, self.comm_id, float(eps), algo)
            else:
                got = ops.all_reduce_rmsnorm_fp8(x, residual, weight, fp8_scale, self.comm_id, float(eps), algo)
            return rmsnorm_checks.into_outputs(got, (out, residual_out, fp8_out))
        if fp8_scale is None and fp8_out is None:  # the plain call, exactly as before the FP8 copy
            return self._all_reduce_rmsnorm_impl(x, residual, weight, eps, algo, out, residual_out)
        return self._all_reduce_rmsnorm_impl(x, residual, weight, eps, algo, out, residual_out, fp8_scale=fp8_scale,
                                             fp8_out=fp8_out)

    def _all_reduce_rmsnorm_impl(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                                 algo: str, out: torch.Tensor | None, residual_out: torch.Tensor | None,
                                 fp8_scale: torch.Tensor | None = None, fp8_out: torch.Tensor | None = None
                                 ) -> tuple[torch.Tensor, ...]:
        self._before_call()
        bits = rmsnorm.eps_bits(eps)
        x, residual, weight, y, r_out, dt, rows, hidden = rmsnorm_checks.check_rank(
            x, residual, weight, out, residual_out, self.device, max_elements=MAX_ELEMENTS)
        fp8 = rmsnorm_checks.check_fp8(fp8_scale, fp8_out, x, (x, residual, weight), (y, r_out), self.device)
        result = (y, r_out) if fp8 is None else (y, r_out, fp8[1])
        if rows == 0:
            return result
        plan = self._rmsnorm_call_plan(rows, hidden, dt, bits, algo, fp8 is not None)
        if plan.alg is None:  # unfused: the sum into y (same bits on every rank), then the epilogue on y in place
            self._all_reduce_impl(x, "sum", "auto", y, True)
            self._launch(plan, epilogue.pointers(y, y, residual, r_out, weight, fp8))
            return result
        ptrs = (x.data_ptr(), y.data_ptr(), residual.data_ptr(), r_out.data_ptr(), weight.data_ptr())
        if fp8 is not None:  # abi.POINTER_LISTS["rmsnorm_fp8"]: then the copy, then its scale
            ptrs += (fp8[1].data_ptr(), fp8[0].data_ptr())
        self._launch(plan, ptrs)
        self._after_call()
        return result

    def run(self, collective: Collective | str, tensor: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
        """``run(collective, tensor, *, out=None) -> Tensor``

        Runs a user-written collective registered at construction (``sollat.custom``) on this
        rank's ``tensor``; returns this rank's output (the input's shape, or ``[world_size,
        *shape]`` for ``output="gather"``). Every rank must make the same call. Same checks, fault
        handling, stream ordering and CUDA-graph capture as ``all_reduce``; not traceable by
        ``torch.compile`` yet (wrap the call in ``torch.compiler.disable``).
        """
        alg = self._collective(collective, compiling=torch.compiler.is_compiling())
        self._before_call()
        dt = self._run_tensor(alg, tensor, "tensor")
        x = tensor if tensor.is_contiguous() else tensor.contiguous()
        y = self._run_out(alg, x, out, "out")
        n = x.numel()
        if n == 0:
            return y
        plan = self._run_plan(alg, n, dt)
        self._launch(plan, (x.data_ptr(), y.data_ptr()))
        self._after_call()
        return y

    def all_gather(self, tensor: torch.Tensor, *, out: torch.Tensor | None = None, algo: str = "auto") -> torch.Tensor:
        """``all_gather(tensor, *, out=None, algo="auto") -> Tensor`` of shape ``[world_size, *tensor.shape]``

        Rank r's ``tensor`` at ``[r]`` on every rank (``out`` may also have the concatenated shape
        of ``torch.distributed.all_gather_into_tensor``). ``algo``: ``"auto"`` (``sollat.gather_scatter``'s
        size rule: LL, sentinel, or torch.distributed for large messages), ``"ll"``, ``"sentinel"`` or
        ``"nccl"``. Every rank must make the same call. Same checks, faults, stream ordering and
        CUDA-graph capture as ``all_reduce``; ``torch.compile`` keeps it in its graph (``sollat::gather_scatter``).
        It has no arithmetic, so it may be handed to torch.distributed in batch-invariant mode too
        (every path moves the same bits).
        """
        self._gs_args("all_gather", "", algo)
        return self._gs_call("all_gather", tensor, out, "", algo)

    def reduce_scatter(self, tensor: torch.Tensor, *, out: torch.Tensor | None = None, op: str = "sum",
                       algo: str = "auto") -> torch.Tensor:
        """``reduce_scatter(tensor, *, out=None, op="sum", algo="auto") -> Tensor``

        Splits ``tensor`` along dim 0 into ``world_size`` chunks (dim 0 must be a multiple of
        ``world_size``) and returns the reduction over ranks of chunk ``rank``, of shape
        ``[tensor.shape[0] // world_size, *tensor.shape[1:]]``: rank order 0..R-1, fp32 accumulation
        for 16-bit types (``gather_scatter.reduce_scatter_reference`` bitwise) on sollat's kernels;
        a call handed to torch.distributed (``algo="nccl"``, or ``"auto"`` above the size rule) has
        NCCL's arithmetic. On a ``batch_invariant`` communicator it is never handed over: ``auto``
        takes sollat's kernels at every size (the sentinel above the size rule), and ``algo="nccl"``
        or a communicator without the built-in scratch (``gather_scatter=False``) raises.
        ``op``: sum, max, min. Otherwise as ``all_gather``.
        """
        self._gs_args("reduce_scatter", op, algo)
        return self._gs_call("reduce_scatter", tensor, out, op, algo)

    def _gs_call(self, kind: str, tensor: torch.Tensor, out: torch.Tensor | None, op: str, algo: str) -> torch.Tensor:
        if torch.compiler.is_compiling():  # the custom op (sollat/ops.py), which comes back here eagerly
            from .. import ops

            return self._gs_into(kind, ops.gather_scatter(tensor, self.comm_id, kind, op, algo), out, tensor, "out")
        self._before_call()
        dt = self._gs_tensor(kind, tensor, "tensor")
        x = tensor if tensor.is_contiguous() else tensor.contiguous()
        y = self._gs_out(kind, x, out, "out")
        self._gs_no_overlap(kind, [x], y, "out")
        n = x.numel()
        if n == 0:
            return y
        plan = self._gs_plan(kind, n, dt, op, algo)
        if isinstance(plan, str):  # torch.distributed, where it beats sollat's kernels (handover.py)
            if kind == "all_gather":
                handover.nccl_all_gather(x, y, self.group)
            else:
                handover.nccl_reduce_scatter(x, y, op, self.group)
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

