"""One-shot LL vs sentinel latency at 128 B (fp32, bf16) and 64 KiB (bf16), R = 2, 4, 8.

Timing as in the benchmark (CUDA-graph replay of back-to-back calls on rotating inputs, median of
three medians); every configuration is then checked bitwise against the rank-order sum. To
compare two source trees in one device call, run it once per tree:
``PYTHONPATH=<tree> python3 scripts/oneshot_latency.py <tag>`` (the tag starts every line).
"""

from __future__ import annotations

import statistics
import sys

import torch

import sollat
from sollat.bench.timing import time_calls

CASES = ((torch.float32, 32), (torch.bfloat16, 64), (torch.bfloat16, 32768))  # (dtype, elements)


def one(r: int, dtype: torch.dtype, n: int, algo: str, dev: torch.device) -> float:
    c = sollat.VirtualCommunicator(r, dev, algorithms=[algo])
    sets = [[torch.randn(n, device=dev).to(dtype) for _ in range(r)] for _ in range(4)]
    outs = [[torch.empty_like(x) for x in s] for s in sets]
    us = [time_calls(lambda i: c.all_reduce(sets[i % 4], algo=algo, out=outs[i % 4]), calls=100, replays=21,
                     device=dev).stats.median for _ in range(3)]
    ref = sets[0][0].float()
    for x in sets[0][1:]:
        ref = ref + x.float()
    for o in outs[0]:
        o.fill_(float("nan"))
    c.all_reduce(sets[0], algo=algo, out=outs[0])
    c.check()
    if not all(torch.equal(o, ref.to(dtype)) for o in outs[0]):
        raise AssertionError(f"{algo} R={r} {dtype} n={n}: wrong result")
    return statistics.median(us)


def main() -> int:
    tag = sys.argv[1] if len(sys.argv) > 1 else "sollat"
    dev = torch.device("cuda", 0)
    for r in (2, 4, 8):
        for dtype, n in CASES:
            size = n * torch.tensor([], dtype=dtype).element_size()
            for algo in ("oneshot_ll", "oneshot_sentinel"):
                print(f"{tag} R={r} {str(dtype)[6:]:8s} {size:6d}B {algo:17s} {one(r, dtype, n, algo, dev):.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
