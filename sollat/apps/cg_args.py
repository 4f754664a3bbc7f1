"""The command line of ``python -m sollat.apps.cg``: :func:`parse_args` -> :class:`CGArgs`, with the
defaults and tolerances it applies."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from .app_args import (
    add_placement_arguments,
    add_run_arguments,
    check_at_least,
    checked_backends,
    resolve_placement,
)
from .backends import BackendSpec

DTYPES: dict[str, torch.dtype] = {"fp64": torch.float64, "fp32": torch.float32}

# Largest accepted relative difference between two residual histories at the same iteration.
# Measured between 1, 2, 3 and 4 ranks on the CPU (n 16..48, 71..219 iterations): at most 3e-14 in
# fp64 and 9e-6 in fp32; the tolerances leave four and two orders of magnitude for longer solves and
# other reduction orders.
HISTORY_TOL: dict[torch.dtype, float] = {torch.float64: 1e-9, torch.float32: 1e-3}

# Default grid points per dimension. A CPU iterates a 128^3 grid at tens of ms per iteration, so
# the default solves there would take minutes; 32^3 takes a second or two.
DEFAULT_GRID: dict[str, int] = {"cuda": 128, "cpu": 32}


@dataclass
class CGArgs:
    grid: int
    nrhs: int
    dtype: torch.dtype
    tol: float
    max_iters: int
    chunk: int
    repeats: int
    backends: list[BackendSpec]
    distributed: bool
    world_size: int
    device: str
    halo: str
    history_tol: float
    check_single_rank: bool
    graph: bool
    seed: int
    json_path: str | None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sollat.apps.cg",
                                description="CG on the 3-D Poisson equation with NCCL or sollat dot products.")
    # Not --n: torchrun takes abbreviations of its own options (--nnodes, --nproc-per-node) anywhere.
    p.add_argument("--grid", type=int, default=None, metavar="N",
                   help=f"grid points per dimension, N^3 unknowns (default {DEFAULT_GRID['cuda']} on a GPU, "
                        f"{DEFAULT_GRID['cpu']} on a CPU)")
    p.add_argument("--nrhs", type=int, default=1,
                   help="systems solved together; each dot-product AllReduce carries nrhs numbers")
    p.add_argument("--dtype", default="fp64", choices=sorted(DTYPES))
    p.add_argument("--tol", type=float, default=None,
                   help="stop when every |r|/|r0| is below this (default 1e-8 fp64, 1e-5 fp32)")
    p.add_argument("--max-iters", type=int, default=None, help="give up after this many (default 10 N)")
    p.add_argument("--chunk", type=int, default=20,
                   help="iterations per CUDA-graph replay between convergence checks")
    p.add_argument("--repeats", type=int, default=3, help="timed solves per backend (the median is reported)")
    p.add_argument("--backends", default=None,
                   help="comma-separated: nccl, sollat, sollat:<algorithm>, reference; the first is the "
                        "baseline (default: nccl,sollat; cpu on a CPU device)")
    add_placement_arguments(p, virtual_flag="--virtual-ranks", ranks="ranks")
    p.add_argument("--halo", default="p2p", choices=("p2p", "allgather"),
                   help="under torchrun: how neighbours exchange boundary planes (always NCCL)")
    p.add_argument("--history-tol", type=float, default=None,
                   help="largest accepted relative difference of residual histories (default by dtype)")
    p.add_argument("--check-single-rank", action="store_true",
                   help="also solve with one rank on this device and compare residual histories")
    add_run_arguments(p, replayed="iterations")
    return p


def parse_args(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> CGArgs:
    """Parse and check the command line; errors exit with status 2 and a message."""
    parser = build_parser()
    a = parser.parse_args(argv)
    env = os.environ if env is None else env
    check_at_least(parser, a, {"grid": 2, "nrhs": 1, "chunk": 1, "repeats": 1, "max_iters": 1})
    if a.tol is not None and not 0 < a.tol < 1:
        parser.error("--tol must be in (0, 1)")
    check_at_least(parser, a, {"history_tol": 0})
    distributed, world, device = resolve_placement(
        parser, env, virtual=a.virtual_ranks, virtual_flag="--virtual-ranks", device=a.device,
        check_whole=a.check_single_rank, check_flag="--check-single-rank")
    on_gpu = torch.device(device).type == "cuda"
    grid = a.grid if a.grid is not None else DEFAULT_GRID["cuda" if on_gpu else "cpu"]
    if world > grid:
        parser.error(f"{world} ranks cannot split {grid} planes (need ranks <= --grid)")
    backends = checked_backends(
        parser, a.backends or ("nccl,sollat" if on_gpu else "cpu"), device=device, distributed=distributed,
        virtual_flag="--virtual-ranks", under_torchrun="nccl or sollat",
        refused={"noop": "backend noop is only used internally, to time an iteration without AllReduce",
                 "sollat_fused": "backend {label} fuses AllReduce with a residual add and RMSNorm; CG has "
                                 "nothing to fuse (use sollat or sollat:<algorithm>)"})
    dtype = DTYPES[a.dtype]
    return CGArgs(grid=grid, nrhs=a.nrhs, dtype=dtype,
                  tol=a.tol if a.tol is not None else (1e-8 if dtype == torch.float64 else 1e-5),
                  max_iters=a.max_iters or 10 * grid, chunk=a.chunk, repeats=a.repeats, backends=backends,
                  distributed=distributed, world_size=world, device=device, halo=a.halo,
                  history_tol=HISTORY_TOL[dtype] if a.history_tol is None else a.history_tol,
                  check_single_rank=a.check_single_rank, graph=on_gpu and not a.no_graph, seed=a.seed,
                  json_path=a.json_path)
