"""Latency of chosen sollat algorithms on real ranks (torchrun) or virtual ranks, public API only.

    torchrun --nproc-per-node 2 scripts/ab_latency.py [--algos oneshot_ll,oneshot_sentinel]
        [--sizes 128,65536] [--dtype float32,bfloat16] [--define SOLLAT_FENCE_SYS=0] [--tag TEXT]
    python scripts/ab_latency.py --virtual 2 ...

Real ranks also take the library paths ``nccl`` and ``torch_twoshot`` in --algos; $SOLLAT_MAX_BLOCKS
sets the communicator's blocks per rank.

One CUDA graph of 100 back-to-back calls per (algorithm, size), replayed 25 times after a
barrier; prints the median per call (the slowest rank's), in µs, one line per case, so two
source trees (or two builds) can be compared in one device call. Results are checked once
against the rank-order sum (bitwise).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import types
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import sollat

BENCH = Path(__file__).resolve().parents[1] / "sollat" / "bench"


def checkout_time_calls() -> Any:
    """This checkout's ``time_calls``, whichever tree's sollat is on PYTHONPATH: every tree an A/B
    compares (scripts/ab_trees.py) is timed by the same code."""
    pkg = types.ModuleType("_ab_bench")
    pkg.__path__ = [str(BENCH)]
    sys.modules[pkg.__name__] = pkg
    for name in ("stats", "timing"):
        spec = importlib.util.spec_from_file_location(f"_ab_bench.{name}", BENCH / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return sys.modules["_ab_bench.timing"].time_calls


time_calls = checkout_time_calls()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--algos", default="oneshot_ll,oneshot_sentinel")
    p.add_argument("--sizes", default="128,65536", help="bytes")
    p.add_argument("--dtype", default="float32", help="one or more, comma-separated")
    p.add_argument("--define", action="append", default=[], help="NAME=VALUE for every kernel (diagnostic)")
    p.add_argument("--kernel-file", action="append", default=[],
                   help="ALGO=FILE: build ALGO from another file of csrc/kernels or csrc/probes (diagnostic, e.g. "
                        "oneshot_ll=diag_oneshot_breakdown.cu with --define SOLLAT_BREAKDOWN=K)")
    p.add_argument("--virtual", type=int, default=0, help="world size on one GPU instead of torchrun")
    p.add_argument("--tag", default="")
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--replays", type=int, default=25)
    a = p.parse_args()
    if a.virtual:
        comm: sollat.VirtualCommunicator | sollat.Communicator = sollat.VirtualCommunicator(a.virtual, timeout_s=10)
        rank, world = 0, a.virtual
        barrier = torch.cuda.synchronize
    else:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
        # torch_twoshot (a library path) needs its buffer sized for the largest size asked for
        extra = ({"torch_twoshot_bytes": max(int(s) for s in a.sizes.split(","))}
                 if "torch_twoshot" in a.algos.split(",") else {})
        comm = sollat.Communicator(timeout_s=10, **extra)
        rank, world = comm.rank, comm.world_size
        barrier = dist.barrier
    if a.define or a.kernel_file:
        from sollat import testing  # not in trees older than the fault-path change

        testing.set_defines(comm, dict(d.split("=", 1) for d in a.define),
                            kernel_files=dict(f.split("=", 1) for f in a.kernel_file))
    for dtype_name, algo in ((d, al) for d in a.dtype.split(",") for al in a.algos.split(",")):
        dtype = getattr(torch, dtype_name)
        esize = torch.tensor([], dtype=dtype).element_size()
        for nbytes in (int(s) for s in a.sizes.split(",")):
            n = max(1, nbytes // esize)
            gen = torch.Generator(device="cuda").manual_seed(n)
            xs = [torch.randn(n, generator=gen, device="cuda").to(dtype) for _ in range(world)]
            ref = xs[0].float()
            for x in xs[1:]:
                ref = ref + x.float()
            ref = ref.to(dtype)

            def call(algo: str = algo, xs: list[torch.Tensor] = xs) -> torch.Tensor:
                if isinstance(comm, sollat.VirtualCommunicator):
                    return comm.all_reduce(xs, algo=algo)[0]
                return comm.all_reduce(xs[rank], algo=algo)

            y = call()
            ok = bool((y.view(torch.uint8) == ref.view(torch.uint8)).all()) if dtype != torch.float64 else True
            # 3 eager calls, then each of the replays after a barrier, alone on the GPU
            us = time_calls(lambda _i, call=call: call(), calls=a.calls, replays=a.replays, warmup=0, eager=3,
                            sync=barrier, barrier_each=True).stats.median
            t = torch.tensor([us], device="cuda")
            if not a.virtual:
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
            comm.check()
            if rank == 0:
                print(f"AB {a.tag} {algo} {dtype_name} {nbytes} B: {t.item():.3f} us/call (slowest rank)"
                      f"{'' if ok else '  WRONG RESULT'}", flush=True)
    if not a.virtual:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
