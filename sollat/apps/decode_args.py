"""The command line of ``python -m sollat.apps.decode`` (:func:`parse_args` -> :class:`DecodeArgs`)
and whether a run of those arguments fits in memory (:func:`peak_memory`, :func:`too_big_message`)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import torch

from .app_args import (
    add_placement_arguments,
    add_run_arguments,
    check_at_least,
    checked_backends,
    resolve_placement,
)
from .backends import BackendSpec
from .llama import GIB, PRESETS, LlamaConfig, preset
from .llama_memory import MemoryEstimate, estimate_memory, largest_fitting

DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# Largest |logit difference| accepted between two backends, or between sharded and unsharded runs.
# Logits have a standard deviation of about 1 and the top ones lie in [4, 8), where a bf16 ulp is
# 2**-5: measured sharded-vs-unsharded differences at 1-4 layers were one ulp (0.031), and the
# tolerance allows four. Deeper models drift further; pass --logit-tol for them.
LOGIT_TOL: dict[torch.dtype, float] = {torch.bfloat16: 0.125, torch.float16: 0.02, torch.float32: 1e-3}


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
                        "residual add + RMSNorm fused), sollat_fused:<algorithm>, dist_sollat (plain "
                        "dist.all_reduce on a sollat torch.distributed group; torchrun), reference (virtual "
                        "ranks); the first is the baseline (default: nccl,sollat,sollat_fused; cpu on a CPU device)")
    add_placement_arguments(p, virtual_flag="--virtual-tp", ranks="tensor-parallel ranks")
    p.add_argument("--dtype", default=None, choices=sorted(DTYPES),
                   help="model dtype (default: bf16 on GPU, fp32 on CPU)")
    p.add_argument("--price", type=float, default=None, metavar="USD",
                   help="$ per GPU-hour, for the cost per million output tokens")
    p.add_argument("--logit-tol", type=float, default=None,
                   help="largest accepted |logit difference| (default by dtype, see docs/apps.md)")
    p.add_argument("--check-unsharded", action="store_true",
                   help="also build the unsharded (TP 1) model on this device and compare against it")
    add_run_arguments(p, replayed="steps", seed_help="seed of the random weights, cache and prompts")
    return p


def parse_args(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> DecodeArgs:
    """Parse and check the command line; errors exit with status 2 and a message, as argparse does."""
    parser = build_parser()
    a = parser.parse_args(argv)
    env = os.environ if env is None else env
    check_at_least(parser, a, {"batch": 1, "context": 1, "steps": 1, "warmup": 0, "check_steps": 0, "layers": 1,
                               "price": 0, "logit_tol": 0})
    distributed, tp, device = resolve_placement(
        parser, env, virtual=a.virtual_tp, virtual_flag="--virtual-tp", device=a.device,
        check_whole=a.check_unsharded, check_flag="--check-unsharded")
    try:
        cfg = preset(a.model, a.layers)
        cfg.check(tp)
    except ValueError as e:
        parser.error(str(e))
    on_gpu = torch.device(device).type == "cuda"
    backends = checked_backends(
        parser, a.backends or ("nccl,sollat,sollat_fused" if on_gpu else "cpu"), device=device,
        distributed=distributed, virtual_flag="--virtual-tp", under_torchrun="nccl, sollat, sollat_fused or dist_sollat",
        refused={"noop": "backend noop is only used internally, to time a step without AllReduce"})
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
