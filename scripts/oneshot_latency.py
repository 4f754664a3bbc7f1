"""One-shot LL vs sentinel latency at 128 B (fp32, bf16) and 64 KiB (bf16), R = 2, 4, 8.

Timing as in the benchmark (CUDA-graph replay of back-to-back calls on rotating inputs, median of
three medians); every configuration is then checked bitwise against the rank-order sum. To
compare two source trees in one device call, run it once per tree:
``PYTHONPATH=<tree> python3 scripts/oneshot_latency.py <tag>`` (the tag starts every line).
"""

from __future__ import annotations

import sys

import torch
from _virtual_timing import timed_checked_us

CASES = ((torch.float32, 32), (torch.bfloat16, 64), (torch.bfloat16, 32768))  # (dtype, elements)


def main() -> int:
    tag = sys.argv[1] if len(sys.argv) > 1 else "sollat"
    dev = torch.device("cuda", 0)
    for r in (2, 4, 8):
        for dtype, n in CASES:
            size = n * torch.tensor([], dtype=dtype).element_size()
            for algo in ("oneshot_ll", "oneshot_sentinel"):
                print(f"{tag} R={r} {str(dtype)[6:]:8s} {size:6d}B {algo:17s} {timed_checked_us(r, algo, dtype, n, dev):.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
