"""``VirtualCommunicator``: R ranks in one process on one GPU, one launch for every rank
(rank = blockIdx.y). The same kernels as real ranks; how everything is tested on one GPU."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import overload

import torch

from .. import layout, rmsnorm, rmsnorm_checks
from .. import rmsnorm_epilogue as epilogue
from ..custom import Collective, checked_collectives
from ..dtypes import DTYPES, OPS, DType
from ..errors import UnsupportedError
from ..validate import (
    algorithm_names,
    check_world_size,
    checked_batch_invariant,
    checked_flag,
    checked_max_blocks,
    cuda_device,
    timeout,
)
from .base import MAX_ELEMENTS
from .custom_calls import CustomCalls
from .gather_scatter_calls import GatherScatterCalls
from .rmsnorm_calls import RmsnormCalls
from .state import _record_view, scratch_bytes_per_rank


class VirtualCommunicator(GatherScatterCalls, CustomCalls, RmsnormCalls):
    """``world_size`` ranks in this process on one GPU; every call launches one kernel for all ranks.

    ``VirtualCommunicator(world_size, device=None, *, timeout_s=None, debug=False, algorithms=None,
    cluster_ranks=None, max_blocks=None, collectives=None, gather_scatter=True, batch_invariant=None)``

    Rank r's blocks are ``blockIdx.y == r``. The grid is sized so that every block is co-resident
    (checked with the occupancy API), since block b of each rank waits for block b of the others.
    With ``cluster_ranks`` (default on; ``SOLLAT_CLUSTER_RANKS=0`` turns it off) small grids launch
    block b of every rank as one thread-block cluster, which the hardware co-schedules on one GPC
    (see ``_clustered``). The kernels are the same either way. ``collectives`` registers
    user-written collectives (``sollat.custom``; run them with ``run``); ``gather_scatter`` gives
    ``all_gather`` / ``reduce_scatter`` their scratch (``sollat.gather_scatter``). ``batch_invariant``
    (None: ``SOLLAT_BATCH_INVARIANT``, ``"1"`` on) as Communicator's: ``auto`` never runs a
    non-deterministic algorithm (``ll128``) and ``algo="ll128"`` raises (virtual ranks have no
    library paths anyway).
    """

    _entry = "vr"

    def __init__(self, world_size: int, device: torch.device | str | int | None = None, *,
                 timeout_s: float | None = None, debug: bool = False,
                 algorithms: Sequence[str] | None = None, cluster_ranks: bool | None = None,
                 max_blocks: int | None = None, collectives: Sequence[Collective] | None = None,
                 gather_scatter: bool = True, batch_invariant: bool | None = None) -> None:
        check_world_size(world_size, "VirtualCommunicator")
        invariant = checked_batch_invariant(batch_invariant, "VirtualCommunicator")
        customs = self._register_collectives(checked_collectives(collectives, "VirtualCommunicator"))
        gs = checked_flag(gather_scatter, "gather_scatter", "VirtualCommunicator")
        timeout_value = timeout(timeout_s)
        names = algorithm_names(algorithms, world_size, "VirtualCommunicator")
        blocks = checked_max_blocks(max_blocks, "VirtualCommunicator", default=0)  # 0: the default, set below
        dev = cuda_device(device, "VirtualCommunicator")
        cap = layout.virtual_block_cap(world_size, torch.cuda.get_device_properties(dev).multi_processor_count)
        blocks = blocks or min(layout.MAX_BLOCKS_VIRTUAL, cap)
        per_rank = scratch_bytes_per_rank(world_size, names, blocks, customs, gs, cap)
        self._scratch = torch.empty(world_size * per_rank, dtype=torch.uint8, device=dev)
        base = self._scratch.data_ptr()
        ptrs = [base + r * per_rank for r in range(world_size)]
        self._setup(world_size, dev, ptrs, world_size, timeout_value, debug, names, blocks, customs, gs, invariant,
                    fused_blocks=cap)
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
            from .. import ops

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

    @overload
    def all_reduce_rmsnorm(self, xs: Sequence[torch.Tensor], residuals: Sequence[torch.Tensor],
                           weight: torch.Tensor | Sequence[torch.Tensor], eps: float = 1e-6, algo: str = "auto", *,
                           out: Sequence[torch.Tensor] | None = None,
                           residual_out: Sequence[torch.Tensor] | None = None, fp8_scale: None = None,
                           fp8_out: None = None) -> tuple[list[torch.Tensor], list[torch.Tensor]]: ...

    @overload
    def all_reduce_rmsnorm(self, xs: Sequence[torch.Tensor], residuals: Sequence[torch.Tensor],
                           weight: torch.Tensor | Sequence[torch.Tensor], eps: float = 1e-6, algo: str = "auto", *,
                           out: Sequence[torch.Tensor] | None = None,
                           residual_out: Sequence[torch.Tensor] | None = None,
                           fp8_scale: torch.Tensor | Sequence[torch.Tensor],
                           fp8_out: Sequence[torch.Tensor] | None = None
                           ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]: ...

    def all_reduce_rmsnorm(self, xs: Sequence[torch.Tensor], residuals: Sequence[torch.Tensor],
                           weight: torch.Tensor | Sequence[torch.Tensor], eps: float = 1e-6, algo: str = "auto", *,
                           out: Sequence[torch.Tensor] | None = None,
                           residual_out: Sequence[torch.Tensor] | None = None,
                           fp8_scale: torch.Tensor | Sequence[torch.Tensor] | None = None,
                           fp8_out: Sequence[torch.Tensor] | None = None) -> tuple[list[torch.Tensor], ...]:
        """``all_reduce_rmsnorm(xs, residuals, weight, eps=1e-6, algo="auto", *, out=None,
        residual_out=None, fp8_scale=None, fp8_out=None) -> (ys, residuals_out[, qs])``

        Fused AllReduce + residual add + RMSNorm (sollat/rmsnorm.py has the exact arithmetic):
        ``xs[r]`` is rank r's partial sums ``[..., hidden]``, ``residuals[r]`` its residual of the
        same shape, ``weight`` one ``[hidden]`` tensor for every rank or a list of R. Returns every
        rank's normalised output and updated residual (``residual_out=residuals`` updates them in
        place; ``out=xs`` writes the outputs over the inputs). Every rank's results are identical.
        ``algo`` as Communicator's (``unfused``: the AllReduce, then one epilogue launch per rank).
        ``fp8_scale`` (one float32 element on the device, or a list of R) also returns every rank's
        float8_e4m3fn copy of its output (into ``fp8_out`` when given), as Communicator's.
        """
        weights = [weight] * self.world_size if isinstance(weight, torch.Tensor) else list(weight)
        scales = None if fp8_scale is None else (
            [fp8_scale] * self.world_size if isinstance(fp8_scale, torch.Tensor) else list(fp8_scale))
        if torch.compiler.is_compiling():
            from .. import ops

            rmsnorm_checks.no_scale_no_copy(scales, fp8_out)
            ws = self.world_size
            if scales is None:
                flat = ops.all_reduce_rmsnorm_virtual(list(xs), list(residuals), weights, self.comm_id, float(eps),
                                                      algo)
            else:
                flat = ops.all_reduce_rmsnorm_fp8_virtual(list(xs), list(residuals), weights, scales, self.comm_id,
                                                          float(eps), algo)
            result = []
            for k, dst in enumerate((out, residual_out, fp8_out)[:len(flat) // ws]):
                got = flat[k * ws:(k + 1) * ws]
                result.append(got if dst is None else list(rmsnorm_checks.into_outputs(got, tuple(dst))))
            return tuple(result)
        if scales is None and fp8_out is None:  # the plain call, exactly as before the FP8 copy
            return self._all_reduce_rmsnorm_impl(xs, residuals, weights, eps, algo, out, residual_out)
        return self._all_reduce_rmsnorm_impl(xs, residuals, weights, eps, algo, out, residual_out, fp8_scale=scales,
                                             fp8_out=fp8_out)

    def _all_reduce_rmsnorm_impl(self, xs: Sequence[torch.Tensor], residuals: Sequence[torch.Tensor],
                                 weights: Sequence[torch.Tensor], eps: float, algo: str,
                                 out: Sequence[torch.Tensor] | None, residual_out: Sequence[torch.Tensor] | None,
                                 fp8_scale: Sequence[torch.Tensor] | None = None,
                                 fp8_out: Sequence[torch.Tensor] | None = None) -> tuple[list[torch.Tensor], ...]:
        self._before_call()
        ws = self.world_size
        for what, seq in (("xs", xs), ("residuals", residuals), ("weight", weights), ("out", out),
                          ("residual_out", residual_out), ("fp8_scale", fp8_scale), ("fp8_out", fp8_out)):
            if seq is None:
                continue
            if isinstance(seq, torch.Tensor) or len(seq) != ws:
                got = "a single tensor" if isinstance(seq, torch.Tensor) else f"{len(seq)} tensors"
                raise UnsupportedError(f"{rmsnorm.OPNAME}: a VirtualCommunicator of {ws} ranks needs {what} as a list "
                                       f"of {ws} tensors, got {got}")
        bits = rmsnorm.eps_bits(eps)
        checked = [rmsnorm_checks.check_rank(xs[r], residuals[r], weights[r], None if out is None else out[r],
                                      None if residual_out is None else residual_out[r], self.device, f"[{r}]",
                                      MAX_ELEMENTS) for r in range(ws)]
        x0 = checked[0][0]
        for r, c in enumerate(checked):
            if c[0].shape != x0.shape or c[0].dtype != x0.dtype:
                raise UnsupportedError(f"{rmsnorm.OPNAME}: xs[{r}] is {tuple(c[0].shape)} {c[0].dtype} but xs[0] is "
                                       f"{tuple(x0.shape)} {x0.dtype}; every rank must pass the same shape and dtype")
        fp8 = self._rmsnorm_fp8_args(checked, fp8_scale, fp8_out)
        ys = [c[3] for c in checked]
        rs = [c[4] for c in checked]
        result = (ys, rs) if fp8 is None else (ys, rs, [q for _, q in fp8])
        dt, rows, hidden = checked[0][5], checked[0][6], checked[0][7]
        if rows == 0:
            return result
        plan = self._rmsnorm_call_plan(rows, hidden, dt, bits, algo, fp8 is not None)
        if plan.alg is None:  # unfused: the sums into ys, then each rank's epilogue on its ys in place
            self._all_reduce_impl([c[0] for c in checked], "sum", "auto", ys, True)
            for r, c in enumerate(checked):
                self._launch(plan, epilogue.pointers(ys[r], ys[r], c[1], rs[r], c[2], None if fp8 is None else fp8[r]))
            return result
        pad = self._pad
        ptrs: list[int] = []
        for k in (0, 3, 1, 4, 2):  # x, out, residual, residual_out, weight (abi.POINTER_LISTS["rmsnorm"])
            ptrs.extend(c[k].data_ptr() for c in checked)
            ptrs.extend(pad)
        for k in (1, 0) if fp8 is not None else ():  # then the copies, then the scales (POINTER_LISTS["rmsnorm_fp8"])
            ptrs.extend(pair[k].data_ptr() for pair in fp8)
            ptrs.extend(pad)
        self._launch(plan, tuple(ptrs))
        self._after_call()
        return result

    def _rmsnorm_fp8_args(self, checked: list, fp8_scale: Sequence[torch.Tensor] | None,
                          fp8_out: Sequence[torch.Tensor] | None) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """Every rank's (scale, copy), checked against that rank's tensors, or None without scales.
        A copy may not share memory with any rank's tensors (one launch writes them all)."""
        rmsnorm_checks.no_scale_no_copy(fp8_scale, fp8_out)
        if fp8_scale is None:
            return None
        ins = tuple(t for c in checked for t in c[:3])
        outs = tuple(t for c in checked for t in c[3:5])
        pairs = []
        for r, c in enumerate(checked):
            got = rmsnorm_checks.check_fp8(fp8_scale[r], None if fp8_out is None else fp8_out[r], c[0], ins,
                                    outs + tuple(q for _, q in pairs), self.device, f"[{r}]")
            assert got is not None
            pairs.append(got)
        if any(rmsnorm_checks.overlaps(scale, q) for scale, _ in pairs for _, q in pairs):  # a later rank's copy
            raise UnsupportedError(f"{rmsnorm.OPNAME}: an fp8_scale lies inside another rank's fp8_out; it must not")
        return pairs

    def run(self, collective: Collective | str, tensors: Sequence[torch.Tensor], *,
            out: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]:
        """``run(collective, tensors, *, out=None) -> list[Tensor]``

        Runs a user-written collective registered at construction (``sollat.custom``): one launch
        for every rank, ``tensors[r]`` rank r's input (same shape and dtype on every rank), returns
        every rank's output (the input's shape, or ``[world_size, *shape]`` for ``output="gather"``).
        Same checks, fault handling, stream ordering and CUDA-graph capture as ``all_reduce``;
        not traceable by ``torch.compile`` yet (wrap the call in ``torch.compiler.disable``).
        """
        alg = self._collective(collective, compiling=torch.compiler.is_compiling())
        self._before_call()
        ws = self.world_size
        dt, ins = self._rank_inputs(alg.opname, tensors, out, lambda t, what: self._run_tensor(alg, t, what))
        outs = [self._run_out(alg, ins[r], None if out is None else out[r], f"out[{r}]") for r in range(ws)]
        n = ins[0].numel()
        if n == 0:
            return outs
        plan = self._run_plan(alg, n, dt)
        self._launch(plan, (*[t.data_ptr() for t in ins], *self._pad, *[o.data_ptr() for o in outs], *self._pad))
        self._after_call()
        return outs

    def all_gather(self, tensors: Sequence[torch.Tensor], *, out: Sequence[torch.Tensor] | None = None,
                   algo: str = "auto") -> list[torch.Tensor]:
        """``all_gather(tensors, *, out=None, algo="auto") -> list[Tensor]``

        ``tensors[r]`` is rank r's input (same shape and dtype on every rank); every returned
        tensor is ``[world_size, *shape]`` with ``tensors[r]`` at ``[r]``. ``algo``: ``"auto"``
        (``sollat.gather_scatter``'s size rule), ``"ll"`` or ``"sentinel"``.
        """
        self._gs_args("all_gather", "", algo)
        return self._gs_virtual("all_gather", tensors, out, "", algo)

    def reduce_scatter(self, tensors: Sequence[torch.Tensor], *, out: Sequence[torch.Tensor] | None = None,
                       op: str = "sum", algo: str = "auto") -> list[torch.Tensor]:
        """``reduce_scatter(tensors, *, out=None, op="sum", algo="auto") -> list[Tensor]``

        ``tensors[r]`` is rank r's input, dim 0 a multiple of world_size; returned tensor j is the
        rank-order reduction of chunk j of dim 0 (``gather_scatter.reduce_scatter_reference``
        bitwise), shape ``[shape[0] // world_size, *shape[1:]]``.
        """
        self._gs_args("reduce_scatter", op, algo)
        return self._gs_virtual("reduce_scatter", tensors, out, op, algo)

    def _gs_virtual(self, kind: str, tensors: Sequence[torch.Tensor], out: Sequence[torch.Tensor] | None, op: str,
                    algo: str) -> list[torch.Tensor]:
        compiling = torch.compiler.is_compiling()
        if not compiling:
            self._before_call()
        ws = self.world_size
        dt, ins = self._rank_inputs(kind, tensors, out, lambda t, what: self._gs_tensor(kind, t, what))
        if compiling:  # the custom op (sollat/ops.py), which comes back here eagerly
            from .. import ops

            ys = ops.gather_scatter_virtual(ins, self.comm_id, kind, op, algo)
            if out is None:
                return ys
            return [self._gs_into(kind, ys[r], out[r], ins[r], f"out[{r}]") for r in range(ws)]
        outs = [self._gs_out(kind, ins[r], None if out is None else out[r], f"out[{r}]") for r in range(ws)]
        if out is not None:
            for r, o in enumerate(outs):
                self._gs_no_overlap(kind, ins + outs[:r] + outs[r + 1:], o, f"out[{r}]")
        n = ins[0].numel()
        if n == 0:
            return outs
        plan = self._gs_plan(kind, n, dt, op, algo)
        assert not isinstance(plan, str)  # a VirtualCommunicator never hands over
        self._launch(plan, (*[t.data_ptr() for t in ins], *self._pad, *[o.data_ptr() for o in outs], *self._pad))
        self._after_call()
        return outs

    def _rank_inputs(self, opname: str, tensors: Sequence[torch.Tensor], out: Sequence[torch.Tensor] | None,
                     check: Callable[[torch.Tensor, str], DType]) -> tuple[DType, list[torch.Tensor]]:
        """One tensor per rank (and, if given, one output per rank), each passing ``check``, all of
        one shape and dtype; returns the dtype and the inputs made contiguous."""
        ws = self.world_size
        for what, seq in (("tensors", tensors), ("out", out)):
            if seq is not None and (isinstance(seq, torch.Tensor) or len(seq) != ws):
                got = "a single tensor" if isinstance(seq, torch.Tensor) else f"{len(seq)} tensors"
                raise UnsupportedError(f"{opname}: a VirtualCommunicator of {ws} ranks needs {what} as a list of "
                                       f"{ws} tensors, got {got}")
        dt = check(tensors[0], "tensors[0]")
        ins = []
        for r, t in enumerate(tensors):
            check(t, f"tensors[{r}]")
            if t.shape != tensors[0].shape or t.dtype != tensors[0].dtype:
                raise UnsupportedError(f"{opname}: tensors[{r}] is {tuple(t.shape)} {t.dtype} but tensors[0] is "
                                       f"{tuple(tensors[0].shape)} {tensors[0].dtype}; every rank must pass the same")
            ins.append(t if t.is_contiguous() else t.contiguous())
        return dt, ins

    def reset(self) -> None:
        """Clear a recorded fault and return every buffer and epoch to its initial state."""
        self._reset_local(self._rank_views())

