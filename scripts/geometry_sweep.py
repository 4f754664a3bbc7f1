"""Launch geometry sweep: ``layout.plan``'s ``block_threads`` (threads per block while a message can
still spread over more blocks) against latency, per algorithm, size and R (virtual ranks).

``python3 scripts/geometry_sweep.py --ranks 2,4,8 --caps 512,128,64 --sizes f32:1024,bf16:65536``
Each cell: algorithm/cap(blocks x threads x slots) = µs (graph replay, median of three medians),
checked bitwise against the rank-order sum afterwards.
"""

from __future__ import annotations

import argparse
import sys

import torch
from _virtual_timing import timed_checked_us

from sollat import testing
from sollat.collectives import algorithms
from sollat.device import layout
from sollat.device.dtypes import DTYPES

ALGOS = ("oneshot_ll", "oneshot_sentinel", "twoshot_ll", "twoshot_sentinel")
SHORT = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="2,4,8")
    ap.add_argument("--caps", default="512,128,64")
    ap.add_argument("--sizes", default="f32:1024,f32:4096,bf16:16384,bf16:65536")
    ap.add_argument("--algos", default=",".join(ALGOS))
    args = ap.parse_args()
    dev = torch.device("cuda", 0)
    for r in (int(x) for x in args.ranks.split(",")):
        for item in args.sizes.split(","):
            short, nbytes = item.split(":")
            dtype = SHORT[short]
            n = int(nbytes) // torch.tensor([], dtype=dtype).element_size()
            cells = []
            for algo in args.algos.split(","):
                alg = algorithms.ALGORITHMS[algo]
                for cap in (int(x) for x in args.caps.split(",")):
                    with testing.override_block_threads(cap):  # read by every new plan
                        geo = layout.plan(alg.lines_per_rank(n, DTYPES[dtype], r), max_blocks=alg.max_blocks,
                                          max_slots=alg.max_slots(algorithms.max_ranks_template(r)))
                        us = timed_checked_us(r, algo, dtype, n, dev, sets=3, calls=50, replays=11)
                    cells.append(f"{algo}/{cap}({geo.blocks}x{geo.threads}x{geo.slots})={us:.2f}")
            print(f"R={r} {short} {nbytes}B: " + "  ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
