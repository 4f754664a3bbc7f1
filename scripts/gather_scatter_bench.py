"""AllGather and ReduceScatter latency: sollat's built-in kernels (LL, sentinel, auto) against
NCCL (``all_gather_into_tensor`` / ``reduce_scatter_tensor``, real ranks only), timed the way every
sollat row is (sollat.bench.timing: CUDA-graph replay of back-to-back calls on rotating inputs,
median of replays, slowest rank; the empty-kernel floor in the same run). Each sollat algorithm's
output is checked bitwise against sollat.gather_scatter's references first. torch symmetric
memory's AllGather / ReduceScatter (``torch.ops.symm_mem._low_contention_*``) are not rows: on
torch 2.11 their capture fails ("capturing stream has unjoined work": they run on a side stream
that the capturing stream never joins), and the failed captures then abort the process
(docs/benchmarks.md, AllGather/ReduceScatter tuned).

Sizes are bytes of one rank's input (AllGather) or of one rank's output chunk (ReduceScatter).

    python3 scripts/gather_scatter_bench.py --ranks 2,4,8 --into /tmp/gs-bench
    torchrun --nproc-per-node 2 scripts/gather_scatter_bench.py --into /tmp/gs-bench
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import sollat
from sollat.bench import env
from sollat.bench.timing import calls_for, measure_floor, slowest_rank, time_calls
from sollat.collectives import gather_scatter as gs

SIZES = tuple(sorted({*(64 << (2 * k) for k in range(9)), 512 << 10}))  # 64 B .. 4 MiB per rank, and 512 KiB
ALGOS = ("ll", "sentinel", "auto")
KINDS = ("all_gather", "reduce_scatter")
SETS = 4


def _inputs(kind: str, nbytes: int, ranks: int, dtype: torch.dtype, dev: torch.device,
            gen: torch.Generator) -> list[Any]:
    """One input set: every rank's input (on real ranks too, each rank draws all of them from the
    same generator state and uses its own: the check needs the others). A ReduceScatter input
    holds R chunks of ``nbytes``."""
    n = max(1, nbytes // torch.tensor([], dtype=dtype).element_size()) * (ranks if kind == "reduce_scatter" else 1)
    xs = [torch.randn(n, generator=gen, device=dev).to(dtype) for _ in range(ranks)]
    return xs


def _call(comm: Any, kind: str, virtual: bool, rank: int) -> Callable[[list[Any], str], Any]:
    def run(xs: list[Any], algo: str) -> Any:
        x = xs if virtual else xs[rank]
        return comm.all_gather(x, algo=algo) if kind == "all_gather" else comm.reduce_scatter(x, algo=algo)
    return run


def check(comm: Any, kind: str, virtual: bool, rank: int, xs: list[Any], algo: str) -> bool:
    got = _call(comm, kind, virtual, rank)(xs, algo)
    comm.check()
    if kind == "all_gather":
        want = [gs.all_gather_reference(xs)] * len(xs)
    else:
        want = gs.reduce_scatter_reference(xs, "sum")
    got = got if virtual else [got]
    want = want if virtual else [want[rank]]
    return all(torch.equal(g.cpu(), w.cpu()) for g, w in zip(got, want, strict=True))


def run_size(comm: Any, virtual: bool, ranks: int, rank: int, kind: str, nbytes: int, dtype: torch.dtype,
             dev: torch.device, replays: int, sync: Callable[[], None] | None) -> dict[str, Any]:
    gen = torch.Generator(device=dev).manual_seed(nbytes + (0 if kind == "all_gather" else 1))  # same on every rank
    sets = [_inputs(kind, nbytes, ranks, dtype, dev, gen) for _ in range(SETS)]
    checks = {algo: check(comm, kind, virtual, rank, sets[0], algo) for algo in ALGOS}
    call = _call(comm, kind, virtual, rank)
    rows: dict[str, Callable[[int], None]] = {algo: (lambda i, a=algo: call(sets[i % SETS], a)) for algo in ALGOS}
    if not virtual:
        import torch.distributed as dist

        outs = [torch.empty(ranks * s[rank].numel() if kind == "all_gather" else s[rank].numel() // ranks,
                            device=dev, dtype=dtype) for s in sets]
        nccl = dist.all_gather_into_tensor if kind == "all_gather" else dist.reduce_scatter_tensor
        rows["nccl"] = lambda i: nccl(outs[i % SETS], sets[i % SETS][rank])
    calls = calls_for(nbytes * ranks)
    us = {name: slowest_rank(time_calls(fn, calls=calls, replays=replays, sync=sync, device=dev).stats.median)
          for name, fn in rows.items()}
    return {"kind": kind, "ranks": ranks, "bytes": nbytes, "dtype": str(dtype).removeprefix("torch."), "us": us,
            "checks": checks}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="2,4,8", help="virtual ranks (ignored under torchrun)")
    p.add_argument("--replays", type=int, default=25)
    p.add_argument("--into", default=None, help="folder for gather-scatter-bench.json")
    p.add_argument("--commit", default=None)
    a = p.parse_args(argv)
    env.apply_safety_env()
    info = env.dist_info()
    dev = torch.device("cuda", info.local_rank if info else 0)
    torch.cuda.set_device(dev)
    sync: Callable[[], None] | None = None
    if info:
        import torch.distributed as dist

        dist.init_process_group("nccl", device_id=dev)
        rank, world = dist.get_rank(), dist.get_world_size()
        configs = [(sollat.Communicator(), False, world)]
        sync = dist.barrier
    else:
        rank = 0
        configs = [(sollat.VirtualCommunicator(r, dev), True, r) for r in (int(v) for v in a.ranks.split(","))]
        world = max(c[2] for c in configs)
    floor = measure_floor(dev, replays=a.replays, sync=sync).stats.median
    results = []
    for comm, virtual, ranks in configs:
        for kind in KINDS:
            for nbytes in SIZES:
                r = run_size(comm, virtual, ranks, rank, kind, nbytes, torch.bfloat16, dev, a.replays, sync)
                results.append(r)
                if rank == 0:
                    cells = "  ".join(f"{k} {v:7.2f}" for k, v in r["us"].items())
                    bad = [k for k, ok in r["checks"].items() if not ok]
                    print(f"{kind:>14} R={ranks} {nbytes:>9} B  {cells}  {'checks ok' if not bad else f'MISMATCH {bad}'}")
                    sys.stdout.flush()
    if rank == 0:
        meta = env.collect_meta(tool="scripts/gather_scatter_bench.py", mode="distributed" if info else "virtual",
                                ranks=sorted({r["ranks"] for r in results}), world_size=world, commit=a.commit,
                                args=vars(a))
        if a.into:
            Path(a.into).mkdir(parents=True, exist_ok=True)
            (Path(a.into) / "gather-scatter-bench.json").write_text(
                json.dumps({"meta": meta, "floor_us": floor, "rows": results}, indent=1))
        bad = sum(not ok for r in results for ok in r["checks"].values())
        print(f"floor {floor:.2f} us; {len(results)} rows; checks: {'all ok' if not bad else f'{bad} FAILED'}")
    if info:
        import torch.distributed as dist

        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
