"""What the sollat torch.distributed backend costs beside calling sollat directly.

    torchrun --nproc-per-node 2 scripts/dist_backend_bench.py [--sizes 1024,32768] [--into DIR]

The group is ``init_process_group("cpu:gloo,cuda:sollat")``. Per size (float32, sum), the slowest
rank's figures:

* host time of one eager call (``CALLS`` back-to-back calls, the host loop alone timed, no
  synchronisation inside; the fastest of ``RUNS`` runs): ``comm.all_reduce(x, out=x)`` on the
  group's own communicator, the backend's ``pg.allreduce([x], opts)``, ``dist.all_reduce(x)``
  through the backend, and ``dist.all_reduce`` on a group of the inner library alone (NCCL; gloo
  where the processes share one GPU, since NCCL refuses that: host time only);
* device time per call under CUDA graphs (``GRAPH_CALLS`` calls captured, replays timed with CUDA
  events, the median of ``REPLAYS``): ``dist.all_reduce`` through the backend and
  ``comm.all_reduce`` on the same real ranks (the same kernel: the communicator's ``auto`` choice,
  printed), and ``comm.all_reduce`` of that algorithm on virtual ranks of one GPU. Where the
  processes share one GPU their kernels time-slice and the real-rank figures are no speed figures;
  the virtual-rank one is.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from datetime import timedelta

import _real_ranks
import torch
import torch.distributed as dist
from _virtual_timing import timed_checked_us

from sollat.integrations import dist_backend

CALLS, RUNS, GRAPH_CALLS, REPLAYS = 200, 7, 20, 11


def host_loop_us(fn: Callable[[], object], calls: int = CALLS, runs: int = RUNS) -> float:
    """Host time per call of ``calls`` back-to-back calls (the loop alone), fastest of ``runs``."""
    for _ in range(20):
        fn()
    best = float("inf")
    for _ in range(runs):
        torch.cuda.synchronize()
        dist.barrier()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t) / calls * 1e6)
        torch.cuda.synchronize()
    return best


def graph_us(fn: Callable[[], object]) -> float:
    """Device time per call of ``fn`` captured GRAPH_CALLS times in one CUDA graph (median replay)."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(GRAPH_CALLS):
            fn()
    times = []
    for _ in range(REPLAYS):
        dist.barrier()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / GRAPH_CALLS)
    return statistics.median(times)


def one_size(nbytes: int, rank: int, world: int, dev: torch.device, library: str, lib_group: object,
             shared: bool) -> dict[str, object]:
    n = nbytes // 4
    x = torch.randn(n, device=dev)
    dist.all_reduce(x)  # builds the communicator and this shape's plan
    comm, pg = dist_backend.router().comm, dist.group.WORLD
    algo = comm.selected_algorithm(nbytes, torch.float32)
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    row: dict[str, object] = {"bytes": nbytes, "algorithm": algo, "library": library, "shared_gpu": shared}
    cases = {"host comm.all_reduce": lambda: comm.all_reduce(x, out=x),
             "host pg.allreduce (backend)": lambda: pg.allreduce([x], opts),
             "host dist.all_reduce (backend)": lambda: dist.all_reduce(x),
             f"host dist.all_reduce ({library})": lambda: dist.all_reduce(x, group=lib_group)}
    for name, fn in cases.items():
        row[name] = _real_ranks.slowest(host_loop_us(fn))
    row["graph dist.all_reduce (backend)"] = _real_ranks.slowest(graph_us(lambda: dist.all_reduce(x)))
    row["graph comm.all_reduce"] = _real_ranks.slowest(graph_us(lambda: comm.all_reduce(x, out=x)))
    if algo not in ("nccl", "torch_twoshot") and rank == 0:
        row["graph comm.all_reduce, virtual ranks"] = timed_checked_us(world, algo, torch.float32, n, dev)
    if rank == 0:
        print(" | ".join(f"{k}: {v:.2f}" if isinstance(v, float) else f"{k}: {v}" for k, v in row.items()), flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1024,32768", help="message sizes in bytes, comma-separated")
    p.add_argument("--into", default="", help="write the rows as JSON into this folder")
    args = p.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    shared = torch.cuda.device_count() < world
    dev = torch.device("cuda", 0 if shared else int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(dev)
    dist_backend.register()
    dist.init_process_group("cpu:gloo,cuda:sollat", device_id=dev, timeout=timedelta(seconds=300))
    library = "gloo" if shared else "nccl"
    lib_group = dist.new_group(backend=library)
    rows = [one_size(int(v), rank, world, dev, library, lib_group, shared) for v in args.sizes.split(",")]
    if rank == 0:
        for r in rows:
            over = float(r["host dist.all_reduce (backend)"]) - float(r["host comm.all_reduce"])  # type: ignore[arg-type]
            backend = float(r["host pg.allreduce (backend)"]) - float(r["host comm.all_reduce"])  # type: ignore[arg-type]
            print(f"{r['bytes']} B: dist.all_reduce adds {over:.2f} µs of host time over comm.all_reduce, the backend "
                  f"call alone {backend:.2f} µs (goal: at most 3 µs)", flush=True)
        if args.into:
            _real_ranks.write(args.into, "dist_backend_bench.json", rows, torch=torch.__version__,
                              route=dist_backend.route())
    _real_ranks.finish()


if __name__ == "__main__":
    main()
