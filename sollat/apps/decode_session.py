"""Decode steps as they run in ``python -m sollat.apps.decode``: :class:`DecodeSession` (eager or one
CUDA graph), their timing (:func:`time_steps`, :func:`time_allreduces`) and the comparison of two
backends' logits (:func:`compare_logits`)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .backend_base import AllReduceBackend, CallRecord
from .llama import TPDecoder

# --------------------------------------------------------------------------------------------------
# Running steps


class DecodeSession:
    """Decode steps of ``model`` through ``backend``, eagerly or as replays of one CUDA graph.

    The step reads ``tokens`` and ``pos``, and writes the greedy tokens back into ``tokens``, the
    next position into ``pos`` and the tokens into ``history``, so replays decode on their own with
    no host work. ``calls`` lists the AllReduces one step makes.
    """

    def __init__(self, model: TPDecoder, backend: AllReduceBackend, *, start_tokens: torch.Tensor,
                 use_graph: bool, warmup: int = 2) -> None:
        dev = model.device
        self.model = model
        self.backend = backend
        self.capacity = model.max_len - model.context
        self.start_tokens = start_tokens.to(dev)
        self.tokens = self.start_tokens.clone()
        self.pos = torch.tensor([model.context], dtype=torch.long, device=dev)
        self.count = torch.zeros(1, dtype=torch.long, device=dev)
        self.history = torch.zeros(self.capacity, model.batch, dtype=torch.long, device=dev)
        self.steps = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        if use_graph:
            # Warm up off the default stream (cuBLAS handles, NCCL communicators, sollat kernels), then capture.
            side = torch.cuda.Stream(dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                for _ in range(max(1, min(warmup, self.capacity))):
                    self._body()
            torch.cuda.current_stream(dev).wait_stream(side)
            self.reset()
            self.graph = torch.cuda.CUDAGraph()
            with backend.tracing() as calls, torch.cuda.graph(self.graph):
                self._logits = self._body()
        else:
            with backend.tracing() as calls:
                self._logits = self._body()
        self.calls: list[CallRecord] = calls
        self.reset()

    def _body(self) -> list[torch.Tensor]:
        out = self.model.step(self.tokens, self.pos, self.backend)
        self.tokens.copy_(out.next_tokens)
        self.history.index_copy_(0, self.count, out.next_tokens.unsqueeze(0))
        self.pos.add_(1)
        self.count.add_(1)
        return out.logits

    def reset(self) -> None:
        """Back to the first decode position with the start tokens (the prefilled cache is kept)."""
        self.tokens.copy_(self.start_tokens)
        self.pos.fill_(self.model.context)
        self.count.zero_()
        self.steps = 0

    def step(self, force_tokens: torch.Tensor | None = None) -> list[torch.Tensor]:
        """One decode step (from ``force_tokens`` if given); returns the logit shards, valid until the next step."""
        if self.steps >= self.capacity:
            raise RuntimeError(f"decode: the KV cache holds {self.capacity} decode steps; call reset()")
        if force_tokens is not None:
            self.tokens.copy_(force_tokens)
        if self.graph is not None:
            self.graph.replay()
            logits = self._logits
        else:
            logits = self._body()
        self.steps += 1
        return logits

    def generated(self) -> torch.Tensor:
        """``[steps, batch]`` greedy tokens since the last reset."""
        return self.history[:self.steps]


def time_steps(session: DecodeSession, n: int) -> list[float]:
    """Milliseconds of each of ``n`` back-to-back steps (CUDA events on GPU, wall clock on CPU)."""
    from sollat.bench.timing import event_times_ms

    return event_times_ms(session.step, n, session.model.device)


def time_allreduces(backend: AllReduceBackend, calls: Sequence[CallRecord], *, device: torch.device,
                    use_graph: bool, repeats: int = 20) -> float:
    """Median milliseconds of one step's AllReduces alone, back to back (``calls`` from a traced step)."""
    replays = [backend.replay_call(c, device) for c in calls]  # fused calls with their add + RMSNorm

    def run() -> None:
        for replay_one in replays:
            replay_one()

    from sollat.bench.timing import event_times_ms, time_calls

    if device.type != "cuda":
        return statistics.median(event_times_ms(run, repeats, device))

    # one eager run, the step's AllReduces as one graph (or eagerly), one warm run, then `repeats`
    # timed back to back: microseconds per run, the median in milliseconds
    timing = time_calls(lambda _i: run(), calls=1, replays=repeats, warmup=1, eager=1, device=device,
                        graph=use_graph)
    return timing.stats.median / 1e3


# --------------------------------------------------------------------------------------------------
# Comparing logits


@dataclass
class LogitComparison:
    max_abs_diff: float
    bitwise: bool
    tokens_compared: int  # (step, sequence) pairs whose baseline top-two margin exceeds 2 * tol
    tokens_equal: int
    sampler_exact: bool  # the in-graph greedy sampler picked argmax(logits) at every step

    @property
    def ok(self) -> bool:
        return self.tokens_equal == self.tokens_compared


def compare_logits(base: Sequence[torch.Tensor], other: Sequence[torch.Tensor], tol: float,
                   other_tokens: Sequence[torch.Tensor] | None = None) -> LogitComparison:
    """Compare per-step ``[batch, vocab]`` logits against a baseline.

    Greedy tokens are compared where the baseline's top-two margin exceeds ``2 * tol``: two logits
    each off by at most ``tol`` cannot swap order there.
    """
    max_diff, bitwise, compared, equal, sampler = 0.0, True, 0, 0, True
    for i, (a, b) in enumerate(zip(base, other, strict=True)):
        max_diff = max(max_diff, (a - b).abs().max().item())
        bitwise = bitwise and torch.equal(a, b)
        top2 = a.topk(2, dim=-1).values
        decided = (top2[:, 0] - top2[:, 1]) > 2 * tol
        compared += int(decided.sum())
        equal += int((decided & (a.argmax(-1) == b.argmax(-1))).sum())
        if other_tokens is not None:
            sampler = sampler and torch.equal(other_tokens[i].cpu(), b.argmax(-1))
    return LogitComparison(max_diff, bitwise, compared, equal, sampler)
