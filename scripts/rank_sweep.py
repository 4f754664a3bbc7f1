"""Latency against the world size on virtual ranks (one GPU), with the empty-kernel floor in the
same process: every AllReduce algorithm that runs at R, at a few sizes, R = 2 .. 72.

    python scripts/rank_sweep.py [--ranks 2,3,4,8,9,16,17,32,33,64,72] [--sizes 4,128,8192,65536]
        [--dtype float32] [--calls 50] [--replays 11] [--algos oneshot_ll,oneshot_ll_wide]

``--algos``: only these algorithms, each at the world sizes it runs on (``oneshot_ll_wide``: 9 and
more); default every deterministic one.

Timing is sollat.bench's (CUDA-graph replay of ``--calls`` calls rotating over input sets, median
of ``--replays``; docs/measurement.md). Each timed output set is checked against the rank-order
sum once. Prints one line per (R, algorithm, size): ``SWEEP R algo bytes median_us p10 p90``,
then ``FLOOR`` lines (plain and with PDL), and per R the construction time and scratch per rank.
"""

from __future__ import annotations

import argparse
import time

import torch

import sollat
from sollat.bench.timing import floor_record
from sollat.bench.virtual import rank_order_sum, rotating_sets, time_rotating
from sollat.collectives.algorithms import ALGORITHMS


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", default="2,3,4,8,9,16,17,32,33,64,72")
    p.add_argument("--sizes", default="4,128,8192,65536")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--replays", type=int, default=11)
    p.add_argument("--algos", default="", help="comma-separated algorithm names (default: every deterministic one)")
    a = p.parse_args()
    wanted = [x.strip() for x in a.algos.split(",") if x.strip()] or \
        [n for n, alg in ALGORITHMS.items() if alg.deterministic]
    unknown = [x for x in wanted if x not in ALGORITHMS]
    if unknown:
        p.error(f"unknown algorithm {unknown[0]!r}; known: {', '.join(ALGORITHMS)}")
    dev = torch.device("cuda", 0)
    dtype = getattr(torch, a.dtype)
    esize = torch.tensor([], dtype=dtype).element_size()
    fl = floor_record(dev, calls=a.calls, replays=a.replays)
    print(f"FLOOR plain {fl['median_us']:.3f} pdl {fl['pdl_median_us']:.3f}", flush=True)
    for r in (int(v) for v in a.ranks.split(",")):
        algos = [n for n in wanted if ALGORITHMS[n].runs_on(r)]
        if not algos:
            continue
        t0 = time.perf_counter()
        comm = sollat.VirtualCommunicator(r, dev, algorithms=algos)
        built = time.perf_counter() - t0
        print(f"SETUP R={r} construct_s {built:.3f} scratch_per_rank_MiB {comm.scratch_bytes_per_rank / 2**20:.1f} "
              f"max_blocks {comm.max_blocks}", flush=True)
        for nbytes in (int(v) for v in a.sizes.split(",")):
            n = max(1, nbytes // esize)
            sets = rotating_sets(r, n, dtype, dev, 2)
            for algo in algos:
                t = time_rotating(comm, algo, sets, calls=a.calls, replays=a.replays, device=dev)
                ref = rank_order_sum(sets[0][0])
                ok = all(torch.equal(o, ref) for o in sets[1][0])
                s = t.stats
                print(f"SWEEP {r} {algo} {n * esize} {s.median:.3f} {s.p10:.3f} {s.p90:.3f}{'' if ok else ' WRONG'}",
                      flush=True)
        del comm
        torch.cuda.empty_cache()
    fl = floor_record(dev, calls=a.calls, replays=a.replays)
    print(f"FLOOR plain {fl['median_us']:.3f} pdl {fl['pdl_median_us']:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
