"""What the engines' communicator options cost at decode sizes, on virtual ranks (one GPU): ``auto``
on a communicator built as the vLLM / SGLang plugins build theirs
(``sollat.integrations.settings.communicator_options``: the one-shot algorithms only, no
AllGather / ReduceScatter regions) against ``auto`` on a plain one (every algorithm), every size
from 4 B to ``SOLLAT_ENGINE_MAX_BYTES``'s default (1 MiB), in the same process, alternating.

    python scripts/engine_default_bench.py [--ranks 2,4,8] [--dtype bfloat16] [--calls 50] [--replays 11]

Timing is sollat.bench's (CUDA-graph replay of ``--calls`` calls rotating over input sets, median
of ``--replays``); every timed output is checked against the rank-order sum. Prints per (R, size)
``ENGINE R bytes plain_us engine_us ratio plain_pick engine_pick`` and per R the scratch of each
communicator. The real-rank block count is the same for both on real ranks, so the virtual-rank
difference is the algorithm set's alone.
"""

from __future__ import annotations

import argparse

import torch

import sollat
from sollat.bench.timing import floor_record
from sollat.bench.virtual import rank_order_sum, rotating_sets, time_rotating
from sollat.integrations import settings


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", default="2,4,8")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--replays", type=int, default=11)
    a = p.parse_args()
    dev = torch.device("cuda", 0)
    dtype = getattr(torch, a.dtype)
    esize = torch.tensor([], dtype=dtype).element_size()
    fl = floor_record(dev, calls=a.calls, replays=a.replays)
    print(f"FLOOR plain {fl['median_us']:.3f} pdl {fl['pdl_median_us']:.3f}", flush=True)
    sizes = [4 ** k for k in range(1, 11)]  # 4 B .. 1 MiB
    worst = 0.0
    for r in (int(v) for v in a.ranks.split(",")):
        opts = settings.communicator_options(r)
        plain = sollat.VirtualCommunicator(r, dev)
        engine = sollat.VirtualCommunicator(r, dev, algorithms=opts["algorithms"],
                                            gather_scatter=opts["gather_scatter"])
        print(f"SETUP R={r} engine_algorithms {','.join(opts['algorithms'])} scratch_per_rank_MiB plain "
              f"{plain.scratch_bytes_per_rank / 2**20:.1f} engine {engine.scratch_bytes_per_rank / 2**20:.1f}",
              flush=True)
        for nbytes in sizes:
            n = max(1, nbytes // esize)
            sets = rotating_sets(r, n, dtype, dev, 2)
            ref = rank_order_sum(sets[0][0])
            us = []
            for comm in (plain, engine):
                t = time_rotating(comm, "auto", sets, calls=a.calls, replays=a.replays, device=dev)
                if not all(torch.equal(o, ref) for o in sets[1][0]):
                    print(f"WRONG R={r} bytes={n * esize}", flush=True)
                    return 1
                us.append(t.stats.median)
            picks = [comm.selected_algorithm(n * esize, dtype) for comm in (plain, engine)]
            ratio = us[1] / us[0]
            worst = max(worst, ratio)
            print(f"ENGINE {r} {n * esize} {us[0]:.3f} {us[1]:.3f} {ratio:.3f} {picks[0]} {picks[1]}", flush=True)
        del plain, engine
        torch.cuda.empty_cache()
    print(f"WORST engine/plain {worst:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
