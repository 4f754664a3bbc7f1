"""Tensor-parallel decode of a Llama-3.1-70B-shaped model with a switchable AllReduce.

    torchrun --nproc-per-node 4 -m sollat.apps.decode --backends nccl,sollat,sollat_fused --context 65536 --price 10
    python -m sollat.apps.decode --virtual-tp 4 --layers 2 --context 512 --check-unsharded

Under torchrun every process is one TP rank on its own GPU. With ``--virtual-tp R`` all R ranks run in
this process on one device (correctness, not speed: R ranks share one GPU's SMs and memory
bandwidth). Each backend in ``--backends`` decodes from the same state, so their logits and greedy
tokens are compared; see docs/apps.md for the method and what each number means.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from .backends import (
    SOLLAT_KINDS,
    AllReduceBackend,
    BackendSpec,
    CallRecord,
    make_backend,
    parse_backend_list,
    resolve_placement,
    setup_device,
    teardown,
)
from .llama import (
    GIB,
    PRESETS,
    LlamaConfig,
    MemoryEstimate,
    TPDecoder,
    available_memory,
    estimate_memory,
    full_logits,
    largest_fitting,
    max_context,
    preset,
)

DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# Largest |logit difference| accepted between two backends, or between sharded and unsharded runs.
# Logits have a standard deviation of about 1 and the top ones lie in [4, 8), where a bf16 ulp is
# 2**-5: measured sharded-vs-unsharded differences at 1-4 layers were one ulp (0.031), and the
# tolerance allows four. Deeper models drift further; pass --logit-tol for them.
LOGIT_TOL: dict[torch.dtype, float] = {torch.bfloat16: 0.125, torch.float16: 0.02, torch.float32: 1e-3}


def cost_per_million_tokens(price_per_gpu_hour: float, n_gpus: int, tokens_per_s: float) -> float:
    """Dollars per million output tokens: ``price * n_gpus / (tokens_per_s * 3600) * 1e6``."""
    if price_per_gpu_hour < 0 or n_gpus < 1 or tokens_per_s <= 0:
        raise ValueError(f"cost: need price >= 0, n_gpus >= 1, tokens/s > 0 "
                         f"(got {price_per_gpu_hour}, {n_gpus}, {tokens_per_s})")
    return price_per_gpu_hour * n_gpus / (tokens_per_s * 3600.0) * 1e6


# --------------------------------------------------------------------------------------------------
# Arguments


@dataclass
class DecodeArgs:
    model: str
    layers: int
    batch: int
    context: int
    steps: int
    warmup: int
    check_steps: int
    backends: list[BackendSpec]
    distributed: bool  # under torchrun: one TP rank per process
    tp: int
    device: str
    dtype: torch.dtype
    price: float | None
    logit_tol: float
    check_unsharded: bool
    graph: bool
    seed: int
    json_path: str | None

    @property
    def max_len(self) -> int:
        """KV-cache positions: the prefilled context plus every step any phase decodes."""
        return self.context + max(self.check_steps, self.warmup + self.steps, 2)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sollat.apps.decode",
        description="Tensor-parallel Llama decode (random weights) with NCCL or sollat AllReduce.")
    p.add_argument("--model", default="llama3.1-70b", choices=sorted(PRESETS), help="model shape preset")
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default: the preset's, 80)")
    p.add_argument("--batch", type=int, default=8, help="sequences decoded together")
    p.add_argument("--context", type=int, default=32768, help="prefilled KV-cache tokens per sequence")
    p.add_argument("--steps", type=int, default=128, help="timed decode steps")
    p.add_argument("--warmup", type=int, default=8, help="untimed steps before timing")
    p.add_argument("--check-steps", type=int, default=4,
                   help="teacher-forced steps whose logits are compared between backends")
    p.add_argument("--backends", default=None,
                   help="comma-separated: nccl, sollat, sollat:<algorithm>, sollat_fused (AllReduce + "
                        "residual add + RMSNorm fused), sollat_fused:<algorithm>, reference (virtual "
                        "ranks); the first is the baseline (default: nccl,sollat,sollat_fused; cpu on a CPU device)")
    p.add_argument("--virtual-tp", type=int, default=None, metavar="R",
                   help="run all R tensor-parallel ranks in this process on one device")
    p.add_argument("--device", default=None, help="device for virtual ranks (default: cuda if present)")
    p.add_argument("--dtype", default=None, choices=sorted(DTYPES),
                   help="model dtype (default: bf16 on GPU, fp32 on CPU)")
    p.add_argument("--price", type=float, default=None, metavar="USD",
                   help="$ per GPU-hour, for the cost per million output tokens")
    p.add_argument("--logit-tol", type=float, default=None,
                   help="largest accepted |logit difference| (default by dtype, see docs/apps.md)")
    p.add_argument("--check-unsharded", action="store_true",
                   help="also build the unsharded (TP 1) model on this device and compare against it")
    p.add_argument("--no-graph", action="store_true", help="run steps eagerly instead of as a CUDA graph")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights, cache and prompts")
    p.add_argument("--json", dest="json_path", default=None, help="also write the results here (rank 0)")
    return p


def parse_args(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> DecodeArgs:
    """Parse and check the command line; errors exit with status 2 and a message, as argparse does."""
    parser = build_parser()
    a = parser.parse_args(argv)
    env = os.environ if env is None else env
    for name in ("batch", "context", "steps"):
        if getattr(a, name) < 1:
            parser.error(f"--{name} must be >= 1")
    for name in ("warmup", "check_steps"):
        if getattr(a, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0")
    if a.layers is not None and a.layers < 1:
        parser.error("--layers must be >= 1")
    if a.price is not None and a.price < 0:
        parser.error("--price must be >= 0")
    if a.logit_tol is not None and a.logit_tol < 0:
        parser.error("--logit-tol must be >= 0")
    distributed, tp, device = resolve_placement(
        parser, env, virtual=a.virtual_tp, virtual_flag="--virtual-tp", device=a.device,
        check_whole=a.check_unsharded, check_flag="--check-unsharded")
    try:
        cfg = preset(a.model, a.layers)
        cfg.check(tp)
    except ValueError as e:
        parser.error(str(e))
    on_gpu = torch.device(device).type == "cuda"
    default_backends = "nccl,sollat,sollat_fused" if on_gpu else "cpu"
    try:
        backends = parse_backend_list(a.backends or default_backends)
    except ValueError as e:
        parser.error(str(e))
    for spec in backends:
        if spec.kind == "noop":
            parser.error("backend noop is only used internally, to time a step without AllReduce")
        if spec.kind in SOLLAT_KINDS and not on_gpu:
            parser.error(f"backend {spec.label} needs a CUDA device (device is {device})")
        if distributed and spec.kind in ("reference", "cpu"):
            parser.error(f"backend {spec.label} runs only with --virtual-tp "
                         "(under torchrun use nccl, sollat or sollat_fused)")
    dtype = DTYPES[a.dtype] if a.dtype else (torch.bfloat16 if on_gpu else torch.float32)
    return DecodeArgs(model=a.model, layers=cfg.n_layers, batch=a.batch, context=a.context, steps=a.steps,
                      warmup=a.warmup, check_steps=a.check_steps, backends=backends, distributed=distributed,
                      tp=tp, device=device, dtype=dtype, price=a.price,
                      logit_tol=LOGIT_TOL[dtype] if a.logit_tol is None else a.logit_tol,
                      check_unsharded=a.check_unsharded, graph=on_gpu and not a.no_graph, seed=a.seed,
                      json_path=a.json_path)


# --------------------------------------------------------------------------------------------------
# Memory


def peak_memory(cfg: LlamaConfig, args: DecodeArgs, n_local: int) -> tuple[MemoryEstimate, int]:
    """The sharded model's estimate, and the peak bytes of the run (the unsharded reference, built
    and freed first with ``--check-unsharded``, may need more)."""
    est = estimate_memory(cfg, tp=args.tp, n_local=n_local, batch=args.batch, max_len=args.max_len,
                          dtype=args.dtype)
    if not args.check_unsharded:
        return est, est.total
    whole = estimate_memory(cfg, tp=1, n_local=1, batch=args.batch, max_len=args.max_len, dtype=args.dtype)
    return est, max(est.total, whole.total)


def too_big_message(cfg: LlamaConfig, args: DecodeArgs, n_local: int, *, device: torch.device, need: int,
                    free: int) -> str:
    """One line saying what does not fit and which options to pass so that it does."""
    def fits(cfg_: LlamaConfig, args_: DecodeArgs) -> bool:
        return peak_memory(cfg_, args_, n_local)[1] <= free

    layers = largest_fitting(lambda n: fits(replace(cfg, n_layers=n), replace(args, layers=n)), cfg.n_layers)
    context = largest_fitting(lambda c: fits(cfg, replace(args, context=c)), args.context)
    batch = largest_fitting(lambda b: fits(cfg, replace(args, batch=b)), args.batch)
    tiny = preset("tiny")
    ways = [f"--layers {layers}" if layers else "", f"--context {context}" if context else "",
            f"--batch {batch}" if batch else "",
            "--model tiny" if args.model != "tiny" and fits(tiny, replace(args, model="tiny")) else "",
            "no --check-unsharded" if args.check_unsharded and fits(cfg, replace(args, check_unsharded=False))
            else "", "more GPUs (--nproc-per-node)" if args.distributed else ""]
    alone = ", ".join(w for w in ways if w)
    return (f"decode: needs about {need / GIB:.1f} GiB on {device} but {free / GIB:.1f} GiB are free; pass "
            + (f"one of: {alone}, or " if alone else "")
            + "smaller --layers, --context and --batch together")


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


# --------------------------------------------------------------------------------------------------
# Main


@dataclass
class BackendResult:
    name: str
    itl_ms: list[float] = field(default_factory=list)
    calls: list[CallRecord] = field(default_factory=list)
    algorithms: list[str] = field(default_factory=list)  # what ran each call
    rank_order: bool = False
    isolated_ar_ms: float = 0.0
    tokens: torch.Tensor | None = None  # free-running greedy tokens of the timed run
    check_logits: list[torch.Tensor] = field(default_factory=list)
    check_tokens: list[torch.Tensor] = field(default_factory=list)


def _percentile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def describe_calls(calls: Sequence[CallRecord], algorithms: Sequence[str]) -> str:
    groups = Counter((c.op, str(c.dtype).replace("torch.", ""), c.nbytes, a)
                     for c, a in zip(calls, algorithms, strict=True))
    parts = []
    for (op, dt, nbytes, algo), n in groups.items():
        size = f"{nbytes / 1024:g} KiB" if nbytes >= 1024 else f"{nbytes} B"
        parts.append(f"{n} x {size} {dt} {op} [{algo}]")
    return f"{len(calls)} per step: " + ", ".join(parts)


class _Dist:
    """What differs under torchrun: gathering logits shards and per-rank timings."""

    def __init__(self, distributed: bool, tp: int) -> None:
        self.distributed = distributed
        self.tp = tp
        self.rank = 0
        if distributed:
            import torch.distributed as dist

            self.rank = dist.get_rank()

    def full_logits(self, shards: Sequence[torch.Tensor]) -> torch.Tensor:
        if not self.distributed:
            return full_logits(shards).cpu()
        import torch.distributed as dist

        local = shards[0].float().contiguous()
        out = torch.empty((self.tp, *local.shape), dtype=local.dtype, device=local.device)
        dist.all_gather_into_tensor(out, local)
        return out.permute(1, 0, 2).reshape(local.shape[0], -1).cpu()

    def slowest(self, times: list[float]) -> list[float]:
        """Per step, the slowest rank's time."""
        if not self.distributed:
            return times
        import torch.distributed as dist

        gathered: list[Any] = [None] * self.tp
        dist.all_gather_object(gathered, times)
        return [max(col) for col in zip(*gathered, strict=True)]

    def print(self, *args: object) -> None:
        if self.rank == 0:
            print(*args, flush=True)


def run(args: DecodeArgs) -> dict[str, Any]:
    """Build, check and time; returns the results (printing as it goes on rank 0)."""
    device = setup_device(args.distributed, args.device, "decode")
    d = _Dist(args.distributed, args.tp)
    cfg = preset(args.model, args.layers)
    n_local = 1 if args.distributed else args.tp
    ranks = (d.rank,) if args.distributed else tuple(range(args.tp))
    mode = (f"torchrun, {args.tp} GPUs, one rank per GPU" if args.distributed
            else f"{args.tp} virtual rank(s) on {device}")
    d.print(f"model {args.model}: {cfg.n_layers} layers, hidden {cfg.hidden}, {cfg.n_heads}/{cfg.n_kv_heads} "
            f"heads x {cfg.head_dim}, ffn {cfg.ffn}, vocab {cfg.vocab}, {cfg.params() / 1e9:.2f} B params, "
            f"{str(args.dtype).replace('torch.', '')}")
    d.print(f"TP {args.tp} ({mode}); batch {args.batch}, context {args.context} prefilled tokens per sequence")

    # Memory: estimate, and refuse before allocating if it cannot fit (on every device, the CPU too).
    est, need = peak_memory(cfg, args, n_local)
    d.print(f"memory estimate per device: {est.describe()}"
            + (f"; peak with the unsharded reference {need / GIB:.2f} GiB" if args.check_unsharded else ""))
    free, total = available_memory(device)
    fit = max_context(cfg, tp=args.tp, n_local=n_local, batch=args.batch,
                      extra_tokens=args.max_len - args.context, dtype=args.dtype, budget=free)
    d.print(f"{device.type} memory: {free / GIB:.1f} GiB free of {total / GIB:.1f} GiB; "
            f"at most {fit} context tokens per sequence would fit")
    if need > free:
        raise MemoryError(too_big_message(cfg, args, n_local, device=device, need=need, free=free))

    gen = torch.Generator().manual_seed(args.seed)
    start = torch.randint(cfg.vocab, (args.batch,), generator=gen)

    # Baseline inputs for the teacher-forced check; the unsharded model is built and freed first.
    base_logits: list[torch.Tensor] = []
    base_label = ""
    forced: list[torch.Tensor] = []
    if args.check_unsharded and args.check_steps:
        ref = TPDecoder(cfg, tp=1, ranks=(0,), batch=args.batch, context=args.context, max_len=args.max_len,
                        device=device, dtype=args.dtype, seed=args.seed)
        noop = make_backend("noop", world_size=1, device=device, distributed=False)
        sess = DecodeSession(ref, noop, start_tokens=start, use_graph=args.graph)
        forced = [start.clone()]
        for _ in range(args.check_steps):
            base_logits.append(full_logits(sess.step()).cpu())
            forced.append(sess.tokens.cpu().clone())
        base_label = "unsharded"
        del sess, ref
        _free(device)

    t0 = time.perf_counter()
    model = TPDecoder(cfg, tp=args.tp, ranks=ranks, batch=args.batch, context=args.context,
                      max_len=args.max_len, device=device, dtype=args.dtype, seed=args.seed)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    d.print(f"built the model and KV cache in {time.perf_counter() - t0:.1f} s")

    results: list[BackendResult] = []
    # The same step with every AllReduce a no-op: what the step costs without communication.
    noop_itl: list[float] | None = None
    if args.tp > 1:
        sess = DecodeSession(model, make_backend("noop", world_size=args.tp, device=device,
                                                 distributed=args.distributed),
                             start_tokens=start, use_graph=args.graph, warmup=args.warmup)
        _run_steps(sess, args.warmup)
        noop_itl = d.slowest(time_steps(sess, args.steps))
        del sess
        _free(device)

    for spec in args.backends:
        backend = make_backend(spec, world_size=args.tp, device=device, distributed=args.distributed)
        res = BackendResult(backend.name)
        sess = DecodeSession(model, backend, start_tokens=start, use_graph=args.graph, warmup=args.warmup)
        res.calls = sess.calls
        res.algorithms = [backend.algorithm_for(c) for c in sess.calls]
        res.rank_order = backend.rank_order_for(sess.calls)
        if args.check_steps:
            if not forced:  # the first backend is the baseline
                forced = [start.clone()]
                for _ in range(args.check_steps):
                    base_logits.append(d.full_logits(sess.step()))
                    forced.append(sess.tokens.cpu().clone())
                base_label = backend.name
                sess.reset()
            for i in range(args.check_steps):
                res.check_logits.append(d.full_logits(sess.step(force_tokens=forced[i].to(device))))
                res.check_tokens.append(sess.tokens.cpu().clone())
            sess.reset()
        _run_steps(sess, args.warmup)
        res.itl_ms = d.slowest(time_steps(sess, args.steps))
        res.tokens = sess.generated()[args.warmup:].cpu().clone()
        del sess
        _free(device)
        if args.tp > 1:
            res.isolated_ar_ms = time_allreduces(backend, res.calls, device=device, use_graph=args.graph)
        results.append(res)
        d.print(f"  {backend.name}: {describe_calls(res.calls, res.algorithms)}")
        del backend
        _free(device)

    report = _report(args, d, results, base_label, base_logits, noop_itl)
    report["memory_estimate_bytes"] = asdict(est)
    if args.json_path and d.rank == 0:
        with open(args.json_path, "w") as f:
            json.dump(report, f, indent=2)
    return report


def _run_steps(sess: DecodeSession, n: int) -> None:
    for _ in range(n):
        sess.step()


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def _report(args: DecodeArgs, d: _Dist, results: list[BackendResult], base_label: str,
            base_logits: list[torch.Tensor], noop_itl: list[float] | None) -> dict[str, Any]:
    n_gpus = args.tp if args.distributed else 1
    noop_ms = None if noop_itl is None else statistics.median(noop_itl)

    def row(name: str, itl: list[float], share: float | None, alone: float | None) -> tuple[float, float, float,
                                                                                            float | None]:
        p50, p99 = statistics.median(itl), _percentile(itl, 99)
        tps = args.batch * len(itl) / (sum(itl) / 1e3)
        cost = None if args.price is None else cost_per_million_tokens(args.price, n_gpus, tps)
        d.print(f"{name:<24}{p50:>11.3f}{p99:>11.3f}{tps:>10.1f}{'-' if share is None else f'{share:.1%}':>10}"
                f"{'-' if alone is None else f'{alone:.3f}':>12}{'-' if cost is None else f'{cost:.2f}':>9}")
        return p50, p99, tps, cost

    timing_note = ("" if args.distributed or args.tp == 1 else
                   "  (virtual ranks: all ranks share one device, so times are not a TP measurement)")
    d.print(f"\ntiming: {args.steps} steps after {args.warmup} warm-up, "
            f"{'CUDA graph' if args.graph else 'eager'}{timing_note}")
    header = (f"{'backend':<24}{'ITL p50 ms':>11}{'ITL p99 ms':>11}{'tokens/s':>10}"
              f"{'AR share':>10}{'AR alone ms':>12}{'$/M tok':>9}")
    d.print(header)
    out: dict[str, Any] = {"config": {k: (str(v) if isinstance(v, torch.dtype) else v)
                                      for k, v in asdict(args).items() if k != "backends"},
                           "backends": [s.label for s in args.backends], "n_gpus": n_gpus,
                           "noop_step_ms": noop_ms, "results": {}, "checks": {}}
    for r in results:
        p50 = statistics.median(r.itl_ms)
        share = None if noop_ms is None else max(0.0, (p50 - noop_ms) / p50)
        p50, p99, tps, cost = row(r.name, r.itl_ms, share, None if noop_ms is None else r.isolated_ar_ms)
        out["results"][r.name] = {
            "itl_ms_p50": p50, "itl_ms_p99": p99, "tokens_per_s": tps, "ar_share": share,
            "isolated_ar_ms_per_step": r.isolated_ar_ms, "cost_per_million_tokens": cost,
            "allreduces_per_step": len(r.calls),
            "allreduce_calls": [{"op": c.op, "dtype": str(c.dtype), "bytes": c.nbytes, "algorithm": a}
                                for c, a in zip(r.calls, r.algorithms, strict=True)],
            "rank_order": r.rank_order, "itl_ms": r.itl_ms}
    if noop_itl is not None:  # the reference step: every AllReduce a no-op (add and RMSNorm unfused)
        p50, p99, tps, cost = row("no AllReduce (noop)", noop_itl, None, None)
        out["noop"] = {"itl_ms_p50": p50, "itl_ms_p99": p99, "tokens_per_s": tps, "cost_per_million_tokens": cost,
                       "itl_ms": noop_itl}
    if results:
        d.print(f"AllReduces: {describe_calls(results[0].calls, results[0].algorithms)}")
        if noop_ms is not None:
            d.print(f"step without AllReduce (noop backend): {noop_ms:.3f} ms; AR share = 1 - that / ITL p50")
        if args.price is not None:
            d.print(f"cost: ${args.price:g}/GPU-hour x {n_gpus} GPU(s) / (tokens/s x 3600) x 1e6")

    ok = True
    if base_logits:
        d.print(f"\ncorrectness: {args.check_steps} teacher-forced steps from {base_label}'s tokens; "
                f"|logit diff| tolerance {args.logit_tol:g}; tokens compared where the top-two margin > "
                f"{2 * args.logit_tol:g}")
        first = results[0] if results else None
        for r in results:
            cmp = compare_logits(base_logits, r.check_logits, args.logit_tol, r.check_tokens)
            vs_first = None
            if first is not None and r is not first:
                vs_first = all(torch.equal(a, b) for a, b in zip(first.check_logits, r.check_logits,
                                                                 strict=True))
            expect_bitwise = first is not None and r is not first and first.rank_order and r.rank_order
            line_ok = (cmp.max_abs_diff <= args.logit_tol and cmp.ok and cmp.sampler_exact
                       and (vs_first or not expect_bitwise))
            ok = ok and line_ok
            same = ""
            if vs_first is not None:
                same = f"; bitwise equal to {first.name}: {'yes' if vs_first else 'no'}"  # type: ignore[union-attr]
                same += " (expected)" if expect_bitwise else " (not required)"
            d.print(f"  {r.name:<22} max|diff| {cmp.max_abs_diff:.4g}; greedy tokens equal "
                    f"{cmp.tokens_equal}/{cmp.tokens_compared}; sampler == argmax: "
                    f"{'yes' if cmp.sampler_exact else 'NO'}{same}  {'ok' if line_ok else 'FAILED'}")
            out["checks"][r.name] = {**asdict(cmp), "bitwise_vs_first": vs_first,
                                     "bitwise_expected": expect_bitwise, "ok": line_ok}
    if len(results) > 1:
        base_tokens = results[0].tokens
        for r in results[1:]:
            assert base_tokens is not None and r.tokens is not None
            diff = (base_tokens != r.tokens).any(dim=1).nonzero()
            where = "never" if diff.numel() == 0 else f"first at step {int(diff[0])}"
            d.print(f"  free-running greedy tokens, {r.name} vs {results[0].name}: differ {where} "
                    f"of {base_tokens.shape[0]}")
            out["checks"].setdefault(r.name, {})["free_running_first_difference"] = (
                None if diff.numel() == 0 else int(diff[0]))
    out["ok"] = ok
    d.print("\nresult: " + ("ok" if ok else "CHECK FAILED"))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        report = run(args)
    except MemoryError as e:
        print(str(e), file=sys.stderr)
        return 3
    finally:
        teardown(args.distributed)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
