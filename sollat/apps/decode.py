"""Tensor-parallel decode of a Llama-3.1-70B-shaped model with a switchable AllReduce.

    torchrun --nproc-per-node 4 -m sollat.apps.decode --backends nccl,sollat,sollat_fused --context 65536 --price 10
    python -m sollat.apps.decode --virtual-tp 4 --layers 2 --context 512 --check-unsharded

Under torchrun every process is one TP rank on its own GPU. With ``--virtual-tp R`` all R ranks run in
this process on one device (correctness, not speed: R ranks share one GPU's SMs and memory
bandwidth). Each backend in ``--backends`` decodes from the same state, so their logits and greedy
tokens are compared; see docs/apps.md for the method and what each number means.

This module runs and reports; the command line is ``decode_args.py``, the steps, their timing and
the comparison of logits ``decode_session.py``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from .backends import CallRecord, make_backend, setup_device, teardown
from .decode_args import (
    DTYPES,
    LOGIT_TOL,
    DecodeArgs,
    build_parser,
    parse_args,
    peak_memory,
    too_big_message,
)
from .decode_session import DecodeSession, LogitComparison, compare_logits, time_allreduces, time_steps
from .llama import GIB, TPDecoder, full_logits, preset
from .llama_memory import available_memory, max_context

__all__ = ["DTYPES", "LOGIT_TOL", "BackendResult", "DecodeArgs", "DecodeSession", "LogitComparison",
           "build_parser", "compare_logits", "cost_per_million_tokens", "main", "parse_args", "peak_memory",
           "run", "time_allreduces", "time_steps", "too_big_message"]


def cost_per_million_tokens(price_per_gpu_hour: float, n_gpus: int, tokens_per_s: float) -> float:
    """Dollars per million output tokens: ``price * n_gpus / (tokens_per_s * 3600) * 1e6``."""
    if price_per_gpu_hour < 0 or n_gpus < 1 or tokens_per_s <= 0:
        raise ValueError(f"cost: need price >= 0, n_gpus >= 1, tokens/s > 0 "
                         f"(got {price_per_gpu_hour}, {n_gpus}, {tokens_per_s})")
    return price_per_gpu_hour * n_gpus / (tokens_per_s * 3600.0) * 1e6


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
        p50, p99 = statistics.median(itl), float(np.percentile(itl, 99))
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
