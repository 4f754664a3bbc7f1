"""The ``sollat_fused`` backend: AllReduce + residual add + RMSNorm in one sollat kernel.

``backend.all_reduce_rmsnorm(partials, residuals, weight, eps) -> (normed, new_residuals)``

Decode is pre-norm: every row-parallel layer (attention's output projection, the MLP's down
projection) ends with a partial hidden state on each rank, and the next thing the model does is
``residual = residual + allreduce(partial)`` followed by the next RMSNorm (the following layer's, or
the final norm after the last layer). That is vLLM's ``fused_add_rms_norm`` after the AllReduce, and
``sollat.Communicator.all_reduce_rmsnorm`` / ``VirtualCommunicator.all_reduce_rmsnorm`` do all of it
in one kernel. ``TPDecoder`` calls ``all_reduce_rmsnorm`` at every such point when its backend is a
``FusedRMSNormBackend`` and the AllReduce, the add and ``rms_norm`` otherwise; the two small
AllReduces of greedy sampling stay plain ``all_reduce`` calls (sollat ``auto``).

The arithmetic is sollat's one RMSNorm arithmetic (``sollat.rmsnorm.reference``: the AllReduce's
rounded sum, then the residual, then a pairwise-tree sum of squares), which torch's ``rms_norm``
after an add does not reproduce bit for bit (another order of the sum of squares). Logits therefore
agree with the other backends within the tolerance, never bitwise, so ``rank_order_for`` is False.

========================  ===========================================================================
spec                      what runs at each fusion point
========================  ===========================================================================
``sollat_fused``          ``all_reduce_rmsnorm(..., algo="auto")`` (a one-shot kernel, LL or sentinel,
                          or ``unfused``, by the tuning table's rule: rmsnorm.auto_choice)
``sollat_fused:<algo>``   that algorithm forced: ``oneshot_ll``, ``oneshot_sentinel``, ``unfused``,
                          ``twoshot_sentinel`` (experimental)
========================  ===========================================================================
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .backend_base import AllReduceBackend, CallRecord, _SollatMixin

KIND = "sollat_fused"
FUSED_OP = "sum+rmsnorm"  # CallRecord.op of a fused call (all_reduce's ops are OPS)


def fused_algorithms() -> tuple[str, ...]:
    """The algorithms ``sollat_fused:<algo>`` accepts (sollat.rmsnorm's public names)."""
    from sollat.collectives import rmsnorm

    return rmsnorm.PUBLIC_ALGOS


def check_fused_algo(algo: str) -> None:
    """ValueError unless ``algo`` is ``auto`` or a fused algorithm."""
    known = fused_algorithms()
    if algo != "auto" and algo not in known:
        raise ValueError(f"{KIND}:{algo}: unknown fused algorithm; expected one of {', '.join(known)} "
                         f"(the AllReduce algorithms are for sollat:<algorithm>)")


class FusedRMSNormBackend(AllReduceBackend):
    """A backend that also does AllReduce + residual add + RMSNorm as one call (``all_reduce_rmsnorm``)."""

    def all_reduce_rmsnorm(self, partials: Sequence[torch.Tensor], residuals: Sequence[torch.Tensor],
                           weight: torch.Tensor, eps: float) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """``(normed, new_residuals)``: per local rank i, ``r_i = residuals[i] + allreduce(partials)``
        and ``normed[i] = rms_norm(r_i) * weight``. New tensors; the inputs are not changed."""
        name = f"{self.name}.all_reduce_rmsnorm"
        for what, seq in (("partial", partials), ("residual", residuals)):
            if len(seq) != self.n_local:
                raise ValueError(f"{name}: expected {self.n_local} {what}(s), got {len(seq)}")
        first = partials[0]
        for t in [*partials, *residuals]:
            if t.shape != first.shape or t.dtype != first.dtype or t.device != first.device:
                raise ValueError(f"{name}: partials and residuals differ in shape, dtype or device "
                                 f"({tuple(first.shape)} {first.dtype} {first.device} vs "
                                 f"{tuple(t.shape)} {t.dtype} {t.device})")
        hidden = int(first.shape[-1])
        if weight.shape != (hidden,) or weight.dtype != first.dtype:
            raise ValueError(f"{name}: weight is {tuple(weight.shape)} {weight.dtype}; expected ({hidden},) "
                             f"{first.dtype} (the fused kernel takes x, residual and weight in one dtype)")
        if self._trace is not None:
            self._trace.append(CallRecord(FUSED_OP, first.dtype, first.numel() * first.element_size(),
                                          hidden=hidden, eps=float(eps)))
        return self._all_reduce_rmsnorm(list(partials), list(residuals), weight, float(eps))

    def _all_reduce_rmsnorm(self, partials: list[torch.Tensor], residuals: list[torch.Tensor],
                            weight: torch.Tensor, eps: float) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        raise NotImplementedError

    def replay_call(self, call: CallRecord, device: torch.device) -> Callable[[], None]:
        if call.op != FUSED_OP:
            return super().replay_call(call, device)
        rows = call.nbytes // torch.empty((), dtype=call.dtype).element_size() // call.hidden
        xs = [torch.zeros(rows, call.hidden, dtype=call.dtype, device=device) for _ in range(self.n_local)]
        res = [torch.zeros_like(x) for x in xs]
        weight = torch.ones(call.hidden, dtype=call.dtype, device=device)

        def run() -> None:
            self._all_reduce_rmsnorm(xs, res, weight, call.eps)

        return run


class _SollatFused(_SollatMixin, FusedRMSNormBackend):
    """Fused calls through the communicator's ``all_reduce_rmsnorm``; the other calls (the sampler's
    max and min) through ``all_reduce`` with ``auto``: a forced algorithm names a fused kernel."""

    def _check_algo(self) -> None:
        check_fused_algo(self.algo)

    def algorithm_for(self, call: CallRecord) -> str:
        if call.op != FUSED_OP:
            select = getattr(self.comm, "selected_algorithm", None)
            return "auto" if select is None else str(select(call.nbytes, call.dtype, call.op))
        if self.algo != "auto":
            return self.algo
        rows = call.nbytes // max(1, call.hidden * call.dtype.itemsize)
        return str(self.comm.selected_rmsnorm_algorithm(call.nbytes, call.dtype, rows))

    def rank_order_for(self, calls: Sequence[CallRecord]) -> bool:
        return False  # see the module docstring: never bitwise equal to an unfused backend


class SollatFusedVirtualBackend(_SollatFused):
    """All R ranks in this process on one GPU: ``VirtualCommunicator.all_reduce_rmsnorm`` (one launch)."""

    def __init__(self, world_size: int, device: torch.device, algo: str = "auto", comm: Any | None = None) -> None:
        self.algo = algo
        self._check_algo()
        if comm is None:
            import sollat

            comm = sollat.VirtualCommunicator(world_size, device=device)
        super().__init__(label(algo), world_size, world_size, rank_order=False)
        self.comm = comm

    def _all_reduce(self, shards: list[torch.Tensor], op: str) -> list[torch.Tensor]:
        return list(self.comm.all_reduce(shards, op=op, algo="auto"))

    def _all_reduce_rmsnorm(self, partials: list[torch.Tensor], residuals: list[torch.Tensor],
                            weight: torch.Tensor, eps: float) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        ys, rs = self.comm.all_reduce_rmsnorm(partials, residuals, weight, eps, self.algo)
        return list(ys), list(rs)


class SollatFusedDistBackend(_SollatFused):
    """One process per GPU: ``sollat.Communicator.all_reduce_rmsnorm`` over the process group."""

    def __init__(self, group: Any | None = None, algo: str = "auto", comm: Any | None = None) -> None:
        import torch.distributed as dist

        self.algo = algo
        self._check_algo()
        if comm is None:
            import sollat

            comm = sollat.Communicator(group=group)
        super().__init__(label(algo), dist.get_world_size(group), 1, rank_order=False)
        self.comm = comm

    def _all_reduce(self, shards: list[torch.Tensor], op: str) -> list[torch.Tensor]:
        return [self.comm.all_reduce(shards[0], op=op, algo="auto")]

    def _all_reduce_rmsnorm(self, partials: list[torch.Tensor], residuals: list[torch.Tensor],
                            weight: torch.Tensor, eps: float) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        y, r = self.comm.all_reduce_rmsnorm(partials[0], residuals[0], weight, eps, self.algo)
        return [y], [r]


def label(algo: str) -> str:
    return KIND if algo == "auto" else f"{KIND}:{algo}"
