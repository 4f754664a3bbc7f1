"""The public collectives, each written once for both communicators.

``all_reduce``, ``all_reduce_rmsnorm``, ``all_gather``, ``reduce_scatter`` and ``run`` work on
lists with one entry per launch rank (``ranks.py``): a ``Communicator`` (``real.py``) passes its
one rank's tensor and returns one tensor, a ``VirtualCommunicator`` (``virtual.py``) passes and
returns a list of R. Everything between is this file: the argument checks (each with a clear
error), the plan of the call (cached; a new call shape is compiled and agreed on by every rank
before its first launch), a library path where one serves the call (real ranks only), and the
launch with the kernel's rank table. Under ``torch.compile`` each op is one ``sollat::`` custom
op (``sollat/collectives/ops.py``) whose eager body comes back here.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar, overload

import torch

from ..collectives import gather_scatter, rmsnorm, rmsnorm_checks, select
from ..collectives import rmsnorm_epilogue as epilogue
from ..collectives.custom import Collective
from ..device import launch
from ..device.dtypes import DType
from ..errors import UnsupportedError
from . import custom_calls
from . import gather_scatter_calls as gs
from .base import _CommCore
from .checks import MAX_ELEMENTS
from .plan import _Plan
from .ranks import per_rank_opt, pointer_table, same_call

In = TypeVar("In")    # one tensor argument: a Tensor (Communicator) or a sequence of R (VirtualCommunicator)
Out = TypeVar("Out")  # one result: a Tensor or a list of R

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
    except AttributeError:  # not a tensor (a list: a VirtualCommunicator's call): the checked path
        pass
    return -1


def _call_text(name: str, dt: DType, op: str, n: int, symmetric: bool, call: str) -> str:
    """An AllReduce call as its ranks agree on it: algorithm or library path, dtype, op, elements,
    in place in symmetric memory, and ``call`` (the unfused RMSNorm's arguments) where given."""
    return f"{name}|{dt.short}|{op}|n={n}|symmetric={int(symmetric)}" + (f"|{call}" if call else "")


class _Communicator(_CommCore, Generic[In, Out]):
    """The public ops of both communicators. On a ``VirtualCommunicator`` every tensor argument is
    a list of one tensor per rank (rank r's at ``[r]``) and so is every result; a ``weight`` or
    ``fp8_scale`` may also be one tensor for every rank."""

    def all_reduce(self, tensor: In, op: str = "sum", algo: str = "auto", *, out: In | None = None,
                   deterministic: bool = False) -> Out:
        """``all_reduce(tensor, op="sum", algo="auto", *, out=None, deterministic=False)``

        Returns the reduction over every rank (a new tensor unless ``out`` is given; ``out=tensor``
        reduces in place). ``out`` is a contiguous tensor of the input's dtype and number of
        elements, in any shape (as a flat buffer, like NCCL's). Every rank must call it with the
        same shape, dtype, op and algo. ``op``: sum, max, min. ``algo``: ``auto`` (the tuning
        table's choice, ``selected_algorithm``), a sollat algorithm (``algorithms``) or, on a
        Communicator, a library path (``handovers``). ``deterministic``: only algorithms whose sum
        has a fixed order. On a ``batch_invariant`` communicator ``auto`` runs only sollat's
        rank-order algorithms (the same bits whichever it picks), and ``algo`` naming a library
        path or ``ll128`` raises ``UnsupportedError``.
        """
        if _is_compiling():
            from ..collectives import ops

            ranks = self._ranks
            ys = ops.all_reduce(ranks.per_rank(tensor, "tensor", "all_reduce"), self.comm_id, op, algo, deterministic)
            outs = per_rank_opt(ranks, out, "out", "all_reduce")
            return ranks.result(ys if outs is None else [o.copy_(y.view(o.shape)) for o, y in zip(outs, ys, strict=True)])
        # The hot path (one rank's tensor): an eager call's host time is on the decode critical
        # path. A call shape launched before, on tensors _hot_numel accepts, goes from one dict
        # lookup to one driver call. Anything else (a first call, a library path, a fault seen, any
        # argument to check) takes _all_reduce_ranks, which checks every argument with a clear error.
        n = -1 if self._ranks.launch_ranks != 1 or self._faulted or self._err_host[0] else \
            _hot_numel(tensor, out, self._dev_index)
        if n > 0:
            y: Any = torch.empty_like(tensor) if out is None else out  # type: ignore[call-overload]
            px, py = tensor.data_ptr(), y.data_ptr()  # type: ignore[attr-defined]
            plan = self._calls.get((n, tensor.dtype, op, algo, deterministic,  # type: ignore[attr-defined]
                                    px == py and self._zero_copy(tensor, y)))  # type: ignore[arg-type]
            if plan.__class__ is _Plan:
                stream = launch.stream_handle(self._dev_index)  # _launch, inlined
                if stream != self._last_stream:
                    self._order_streams(stream)
                plan.bound(stream, (px, py))  # type: ignore[union-attr]
                if self.debug:
                    self._after_call()
                return y  # type: ignore[no-any-return]
            out = y
        ranks = self._ranks
        return ranks.result(self._all_reduce_ranks(ranks.per_rank(tensor, "tensor", "all_reduce"), op, algo,
                                                   per_rank_opt(ranks, out, "out", "all_reduce"), deterministic))

    def _all_reduce_ranks(self, tensors: list[Any], op: str, algo: str, outs: list[Any] | None,
                          deterministic: bool, call: str = "") -> list[torch.Tensor]:
        self._before_call()
        suffix = self._ranks.suffix
        dt, xs = same_call(self._ranks, "all_reduce", tensors, "tensor", lambda t, what: self._check_common(t, op, what))
        if outs is None:
            ys = [torch.empty_like(x) for x in xs]
        else:
            ys = []
            x0 = xs[0]
            for r, o in enumerate(outs):
                # An output on the input's device needs only the comparison below (the virtual
                # ranks' eager path); anything else gets the input's checks and their messages.
                if not (isinstance(o, torch.Tensor) and o.device == x0.device):
                    self._check_common(o, op, "out" + suffix(r))
                if o.numel() != x0.numel() or o.dtype != x0.dtype or not o.is_contiguous():
                    what = "out" + suffix(r)
                    raise UnsupportedError(f"all_reduce: {what} must be a contiguous tensor with the input's dtype and "
                                           f"number of elements ({x0.numel()} {x0.dtype}), got {o.numel()} "
                                           f"{o.dtype}" + ("" if o.is_contiguous() else " (not contiguous)"))
                ys.append(o)
        n = xs[0].numel()
        if n == 0:
            return ys
        zero_copy = len(xs) == 1 and xs[0].data_ptr() == ys[0].data_ptr() and self._zero_copy(xs[0], ys[0])
        plan = self._call_plan(n, dt, op, algo, deterministic, zero_copy, call)
        if isinstance(plan, str):  # a library path, where it beats sollat's kernels (handover.py)
            self._agree_library_call(_call_text(plan, dt, op, n, zero_copy, call))  # it carries no signature
            self._library_all_reduce(plan, xs[0], ys[0], op)
            return ys
        self._launch(plan, pointer_table(self._ranks, xs, ys))
        self._after_call()
        return ys

    def _call_plan(self, n: int, dt: DType, op: str, algo: str, deterministic: bool,
                   symmetric: bool = False, call: str = "") -> _Plan | str:
        """Plan of one all_reduce call, or the name of a library path (select.HANDOVERS) (cached: the
        eager hot path is one dict lookup). A new call shape is compiled here and then agreed on by
        every rank (comm/agree.py) before its first launch: no peer's first-use compile can look like
        a hang, and a call that differs between ranks is an error on every rank before anything runs.
        ``symmetric``: the call is in place on a tensor in symmetric memory (``Communicator.empty``),
        which may change the library path; part of the agreement, since the paths differ.
        ``call``: the further arguments of the public call this AllReduce serves (the unfused
        RMSNorm's), part of its plan's signature and of the agreement."""
        key = (n, dt.torch_dtype, op, algo, deterministic, symmetric) + ((call,) if call else ())
        entry = self._calls.get(key)
        if entry is None:
            name = self._resolve(algo, n * dt.size, dt.torch_dtype, op, deterministic)
            if symmetric:
                name = self._symmetric_path(name, algo, n * dt.size, dt.torch_dtype, op)
            if name in select.LIBRARY_PATHS:
                self._check_handover(name, n * dt.size, dt, op)
                entry = name
            else:
                entry = self._kernels.plan(name, dt, op, n, call)
            self._agreement.agree(_call_text(name, dt, op, n, symmetric, call),
                                  "this call (algorithm|dtype|op|elements|in place in symmetric memory"
                                  + ("|the RMSNorm's arguments)" if call else ")"))
            self._calls[key] = entry
        return entry

    @overload
    def all_reduce_rmsnorm(self, x: In, residual: In, weight: torch.Tensor | In, eps: float = 1e-6,
                           algo: str = "auto", *, out: In | None = None, residual_out: In | None = None,
                           fp8_scale: None = None, fp8_out: None = None) -> tuple[Out, Out]: ...

    @overload
    def all_reduce_rmsnorm(self, x: In, residual: In, weight: torch.Tensor | In, eps: float = 1e-6,
                           algo: str = "auto", *, out: In | None = None, residual_out: In | None = None,
                           fp8_scale: torch.Tensor | In, fp8_out: In | None = None) -> tuple[Out, Out, Out]: ...

    def all_reduce_rmsnorm(self, x: In, residual: In, weight: torch.Tensor | In, eps: float = 1e-6,
                           algo: str = "auto", *, out: In | None = None, residual_out: In | None = None,
                           fp8_scale: torch.Tensor | In | None = None, fp8_out: In | None = None) -> tuple[Out, ...]:
        """``all_reduce_rmsnorm(x, residual, weight, eps=1e-6, algo="auto", *, out=None,
        residual_out=None, fp8_scale=None, fp8_out=None) -> (y, residual_out[, q])``

        Fused AllReduce + residual add + RMSNorm with vLLM's ``fused_add_rms_norm`` semantics
        (sollat/collectives/rmsnorm.py has the exact arithmetic): ``x`` is this rank's partial sums
        ``[..., hidden]``, ``residual`` the residual of the same shape and dtype, ``weight``
        ``[hidden]``. Returns ``y = rmsnorm(allreduce(x) + residual) * weight`` and the new
        residual ``allreduce(x) + residual`` (``residual_out=residual`` updates it in place;
        ``out=x`` writes ``y`` over ``x``). Bitwise identical on every rank. ``algo``: ``auto``
        (the tuning table's rule by rows and row bytes: ``rmsnorm.auto_choice``, ``rmsnorm_rules``),
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
        op, ranks = rmsnorm.OPNAME, self._ranks
        xs, residuals = ranks.per_rank(x, "x", op), ranks.per_rank(residual, "residual", op)
        weights = ranks.per_rank_or_shared(weight, "weight", op)
        scales = None if fp8_scale is None else ranks.per_rank_or_shared(fp8_scale, "fp8_scale", op)
        dsts = (per_rank_opt(ranks, out, "out", op), per_rank_opt(ranks, residual_out, "residual_out", op),
                per_rank_opt(ranks, fp8_out, "fp8_out", op))
        rmsnorm_checks.no_scale_no_copy(scales, fp8_out)
        if _is_compiling():
            from ..collectives import ops

            if scales is None:
                flat = ops.all_reduce_rmsnorm(xs, residuals, weights, self.comm_id, float(eps), algo)
            else:
                flat = ops.all_reduce_rmsnorm_fp8(xs, residuals, weights, scales, self.comm_id, float(eps), algo)
            k = len(xs)
            got = [flat[i * k:(i + 1) * k] for i in range(len(flat) // k)]
            return tuple(ranks.result(g if d is None else list(rmsnorm_checks.into_outputs(g, tuple(d))))
                         for g, d in zip(got, dsts, strict=False))  # dsts[2]: no copies without scales
        return tuple(ranks.result(r) for r in self._all_reduce_rmsnorm_ranks(xs, residuals, weights, eps, algo,
                                                                             *dsts, scales))

    def _all_reduce_rmsnorm_ranks(self, xs: list[Any], residuals: list[Any], weights: list[Any], eps: float,
                                  algo: str, outs: list[Any] | None, r_outs: list[Any] | None,
                                  fp8_outs: list[Any] | None = None, scales: list[Any] | None = None
                                  ) -> tuple[list[torch.Tensor], ...]:
        self._before_call()
        ranks, suffix = self._ranks, self._ranks.suffix
        bits = rmsnorm.eps_bits(eps)
        checked = [rmsnorm_checks.check_rank(xs[r], residuals[r], weights[r], None if outs is None else outs[r],
                                             None if r_outs is None else r_outs[r], self.device, suffix(r),
                                             MAX_ELEMENTS) for r in range(len(xs))]
        x0 = checked[0][0]
        for r, c in enumerate(checked):
            if c[0].shape != x0.shape or c[0].dtype != x0.dtype:
                raise UnsupportedError(f"{rmsnorm.OPNAME}: x{suffix(r)} is {tuple(c[0].shape)} {c[0].dtype} but "
                                       f"x{suffix(0)} is {tuple(x0.shape)} {x0.dtype}; every rank must pass the "
                                       "same shape and dtype")
        fp8 = rmsnorm_checks.check_fp8_ranks(checked, scales, fp8_outs, self.device, suffix)
        rmsnorm_checks.check_ranks_apart(checked, suffix)
        ys, rs = [c[3] for c in checked], [c[4] for c in checked]
        result = (ys, rs) if fp8 is None else (ys, rs, [q for _, q in fp8])
        dt, rows, hidden = checked[0][5], checked[0][6], checked[0][7]
        if rows == 0:
            return result
        plan = self._rmsnorm_call_plan(rows, hidden, dt, bits, algo, fp8 is not None)
        if plan.alg is None:  # unfused: the sums into ys (same bits on every rank), then the epilogue in place;
            # this call's arguments ride in the AllReduce's signature (a library path: agreed on the host)
            self._all_reduce_ranks([c[0] for c in checked], "sum", "auto", ys, True, plan.call)
            self._launch(plan, epilogue.pointer_table(ranks.table_ranks, ys, ys, [c[1] for c in checked], rs,
                                                      [c[2] for c in checked], fp8))
            return result
        lists = [[c[k] for c in checked] for k in (0, 3, 1, 4, 2)]  # x, out, residual, residual_out, weight
        if fp8 is not None:  # abi.POINTER_LISTS["rmsnorm_fp8"]: then the copies, then their scales
            lists += [[q for _, q in fp8], [s for s, _ in fp8]]
        self._launch(plan, pointer_table(ranks, *lists))
        self._after_call()
        return result

    def _rmsnorm_call_plan(self, rows: int, hidden: int, dt: DType, eps_bits: int, algo: str,
                           fp8: bool = False) -> _Plan:
        """As _call_plan: cached; a new call shape is compiled, then agreed on by every rank."""
        key = ("rmsnorm", rows, hidden, dt.torch_dtype, eps_bits, algo, fp8)
        entry = self._calls.get(key)
        if entry is None:
            name = self._rmsnorm_resolve(algo, rows * hidden * dt.size, dt.torch_dtype, rows)
            if name == rmsnorm.UNFUSED:
                entry = self._kernels.rmsnorm_epilogue_plan(dt, rows, hidden, eps_bits, fp8)
            else:
                entry = self._kernels.rmsnorm_plan(name, dt, rows, hidden, eps_bits, fp8)
            self._agreement.agree(rmsnorm.signature_text(name, dt, rows, hidden, eps_bits, fp8),
                                  "this call (algorithm|dtype|rows|hidden|eps[|fp8])")
            self._calls[key] = entry
        assert not isinstance(entry, str)
        return entry

    def run(self, collective: Collective | str, tensor: In, *, out: In | None = None) -> Out:
        """``run(collective, tensor, *, out=None)``

        Runs a user-written collective registered at construction (``sollat.custom``) on this
        rank's ``tensor``; returns this rank's output (the input's shape, or ``[world_size,
        *shape]`` for ``output="gather"``). Every rank must make the same call. Same checks, fault
        handling, stream ordering and CUDA-graph capture as ``all_reduce``; not traceable by
        ``torch.compile`` yet (wrap the call in ``torch.compiler.disable``).
        """
        alg = custom_calls.registered(self._collectives, collective, compiling=_is_compiling())
        self._before_call()
        ranks, dev, ws = self._ranks, self.device, self.world_size
        dt, xs = same_call(ranks, alg.opname, ranks.per_rank(tensor, "tensor", alg.opname), "tensor",
                           lambda t, what: custom_calls.check_tensor(alg, t, what, dev))
        outs = per_rank_opt(ranks, out, "out", alg.opname)
        ys = [custom_calls.out_tensor(alg, xs[r], None if outs is None else outs[r], "out" + ranks.suffix(r), ws, dev)
              for r in range(len(xs))]
        if xs[0].numel():
            self._launch(self._run_plan(alg.name, xs[0].numel(), dt), pointer_table(ranks, xs, ys))
            self._after_call()
        return ranks.result(ys)

    def _run_plan(self, name: str, n: int, dt: DType) -> _Plan:
        """As ``_call_plan``: cached; a new call shape is compiled (the user's source, this
        communicator's defines), then agreed on by every rank before its first launch."""
        key = ("custom", name, n, dt.torch_dtype)
        entry = self._calls.get(key)
        if entry is None:
            entry = self._kernels.plan(name, dt, "", n)
            self._agreement.agree(f"{name}|{dt.short}|n={n}", "this call (collective|dtype|elements)")
            self._calls[key] = entry
        assert not isinstance(entry, str)
        return entry

    def all_gather(self, tensor: In, *, out: In | None = None, algo: str = "auto") -> Out:
        """``all_gather(tensor, *, out=None, algo="auto")``, of shape ``[world_size, *tensor.shape]``

        Rank r's ``tensor`` at ``[r]`` on every rank (``out`` may also have the concatenated shape
        of ``torch.distributed.all_gather_into_tensor``). ``algo``: ``"auto"`` (``sollat.gather_scatter``'s
        size rule: LL, sentinel, or torch.distributed for large messages on a Communicator),
        ``"ll"``, ``"sentinel"`` or (Communicator) ``"nccl"``. Every rank must make the same call.
        Same checks, faults, stream ordering and CUDA-graph capture as ``all_reduce``;
        ``torch.compile`` keeps it in its graph (``sollat::gather_scatter``). It has no arithmetic,
        so it may be handed to torch.distributed in batch-invariant mode too (every path moves the
        same bits).
        """
        gs.check_args("all_gather", "", algo, real=self._ranks.real, batch_invariant=self._batch_invariant)
        return self._gs_call("all_gather", tensor, out, "", algo)

    def reduce_scatter(self, tensor: In, *, out: In | None = None, op: str = "sum", algo: str = "auto") -> Out:
        """``reduce_scatter(tensor, *, out=None, op="sum", algo="auto")``

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
        gs.check_args("reduce_scatter", op, algo, real=self._ranks.real, batch_invariant=self._batch_invariant)
        return self._gs_call("reduce_scatter", tensor, out, op, algo)

    def _gs_call(self, kind: str, tensor: Any, out: Any, op: str, algo: str) -> Any:
        ranks = self._ranks
        xs, outs = ranks.per_rank(tensor, "tensor", kind), per_rank_opt(ranks, out, "out", kind)
        if _is_compiling():  # the custom op (sollat/collectives/ops.py), whose eager body comes back to _gs_ranks
            from ..collectives import ops

            ys = ops.gather_scatter(xs, self.comm_id, kind, op, algo)
            if outs is None:
                return ranks.result(ys)
            return ranks.result([gs.into(kind, ys[r], outs[r], xs[r], "out" + ranks.suffix(r), self.world_size,
                                         self.device) for r in range(len(xs))])
        return ranks.result(self._gs_ranks(kind, xs, outs, op, algo))

    def _gs_ranks(self, kind: str, tensors: list[Any], outs: list[Any] | None, op: str,
                  algo: str) -> list[torch.Tensor]:
        self._before_call()
        ranks, dev, ws = self._ranks, self.device, self.world_size
        dt, xs = same_call(ranks, kind, tensors, "tensor", lambda t, what: gs.check_tensor(kind, t, what, dev))
        ys = [gs.out_tensor(kind, xs[r], None if outs is None else outs[r], "out" + ranks.suffix(r), ws, dev)
              for r in range(len(xs))]
        if outs is not None:  # other threads (and ranks) write an output while the inputs are read
            for r, y in enumerate(ys):
                gs.no_overlap(kind, xs + ys[:r] + ys[r + 1:], y, "out" + ranks.suffix(r))
        n = xs[0].numel()
        if n == 0:
            return ys
        plan = self._gs_plan(kind, n, dt, op, algo)
        if isinstance(plan, str):  # torch.distributed, where it beats sollat's kernels (handover.py)
            self._agree_library_call(f"{kind}:{plan}|{dt.short}|{op}|n={n}")  # it carries no signature
            self._library_gather_scatter(kind, xs[0], ys[0], op)
            return ys
        self._launch(plan, pointer_table(ranks, xs, ys))
        self._after_call()
        return ys

    def _gs_plan(self, kind: str, n: int, dt: DType, op: str, algo: str) -> _Plan | str:
        """Plan of one call or ``"nccl"`` (cached). A new call shape is compiled, then agreed on by
        every rank (comm/agree.py) before its first launch."""
        key = ("gather_scatter", kind, n, dt.torch_dtype, op, algo)
        entry = self._calls.get(key)
        if entry is None:
            nbytes = gather_scatter.bytes_per_peer(kind, n, dt.size, self.world_size)
            name = gs.resolve(kind, algo, nbytes, real=self._ranks.real, enabled=self._gather_scatter,
                              batch_invariant=self._batch_invariant)
            entry = select.NCCL if name == select.NCCL else self._kernels.plan(name, dt, op, n)
            self._agreement.agree(f"{kind}:{name}|{dt.short}|{op}|n={n}", "this call (algorithm|dtype|op|elements)")
            self._calls[key] = entry
        return entry

