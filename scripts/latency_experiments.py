"""Development measurements behind the one-shot's small-message latency (docs/benchmarks.md).

1. Block-start skew: a probe kernel records %globaltimer right after `griddepcontrol.wait` in
   every block of a (1, R) grid, launched back to back in a CUDA graph, with and without a
   (1, R) thread-block cluster. Printed: median over calls of (latest - earliest start) and of
   (latest end - earliest start).
2. One-shot at 128 B and two-shot at 8 KiB, 64 KiB and 1 MiB (fp32) for R = 2, 4, 8, each
   without and with the rank cluster. Results are checked bitwise; timing as in the benchmark.

Run:  python3 scripts/latency_experiments.py
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from _virtual_timing import timed_checked_us

from sollat.device import build, launch

PROBE = r"""
extern "C" __global__ void skew_probe(unsigned long long* t) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  unsigned long long now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  if (threadIdx.x == 0) t[2 * (blockIdx.y * gridDim.x + blockIdx.x)] = now;
  __syncthreads();
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  if (threadIdx.x == 0) t[2 * (blockIdx.y * gridDim.x + blockIdx.x) + 1] = now;
}
"""


def skew(dev: torch.device, r: int, cluster: bool, calls: int = 200) -> tuple[float, float]:
    from cuda.core import ObjectCode

    k = ObjectCode.from_cubin(build.compile_cubin(PROBE, name="skew_probe", arch=build.device_arch())).get_kernel(
        "skew_probe")
    cfg = (launch.launch_config((1, 1), 32, pdl=True, cluster=(1, r)) if cluster
           else launch.launch_config((1, r), 32, pdl=True))
    buf = torch.zeros(calls, r, 2, dtype=torch.int64, device=dev)
    g = torch.cuda.CUDAGraph()
    launch.launch(k, cfg, (buf[0].data_ptr(),), device=dev)
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        for i in range(calls):
            launch.launch(k, cfg, (buf[i].data_ptr(),), device=dev)
    g.replay()
    g.replay()
    torch.cuda.synchronize()
    t = buf.cpu().numpy().astype(np.int64)
    start_spread = (t[:, :, 0].max(1) - t[:, :, 0].min(1))[10:]
    span = (t[:, :, 1].max(1) - t[:, :, 0].min(1))[10:]
    return float(np.median(start_spread)), float(np.median(span))


def main() -> int:
    dev = torch.device("cuda", 0)
    launch.ensure_device(0)
    for r in (2, 4, 8):
        cells = []
        for cluster in (False, True):
            s, span = skew(dev, r, cluster)
            cells.append(f"cluster={cluster}: start spread {s:.0f} ns, span {span:.0f} ns")
        print(f"skew R={r}: " + " | ".join(cells), flush=True)

    for r in (2, 4, 8):
        for algo, sizes in (("oneshot_ll", (32,)), ("oneshot_sentinel", (32,)),
                            ("twoshot_ll", (2048, 16384, 262144)), ("twoshot_sentinel", (2048, 16384, 262144))):
            cells = []
            for n in sizes:
                for cluster in (False, True):
                    us = timed_checked_us(r, algo, torch.float32, n, dev, cluster_ranks=cluster)
                    cells.append(f"{4 * n}B{'+cluster' if cluster else ''}={us:.3f}")
            print(f"R={r} {algo} fp32: " + "  ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
