"""Quick core latency check (graph replay of back-to-back calls, median): used during development.

The full measurement suite is ``python -m sollat bench``; this script only prints a small table.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch

import sollat
from sollat.bench.timing import time_calls
from sollat.device import build, launch


def time_graph(fn: Callable[[], object], calls: int = 100, reps: int = 30) -> float:
    """Median µs per call: one eager call, ``calls`` calls in a graph, one warm replay, then each
    of ``reps`` replays alone on the GPU (``sollat.bench.timing.time_calls``)."""
    return time_calls(lambda _i: fn(), calls=calls, replays=reps, warmup=1, eager=1, barrier_each=True).stats.median


def main() -> int:
    dev = torch.device("cuda", 0)
    launch.ensure_device(0)
    src = 'extern "C" __global__ void empty_kernel() {}'
    from cuda.core import ObjectCode

    k = ObjectCode.from_cubin(build.compile_cubin(src, name="empty", arch=build.device_arch())).get_kernel("empty_kernel")
    floor = time_graph(lambda: launch.launch(k, launch.launch_config((1, 1), 32, pdl=False), (), device=dev))
    print(f"empty kernel floor: {floor:.3f} us", flush=True)
    sizes = [128, 1024, 8192, 65536, 262144]
    if len(sys.argv) > 1:
        sizes = [int(s) for s in sys.argv[1].split(",")]
    for r in (2, 4, 8):
        c = sollat.VirtualCommunicator(r, dev)
        for dtype in (torch.float32, torch.bfloat16):
            row = []
            for nbytes in sizes:
                n = nbytes // torch.tensor([], dtype=dtype).element_size()
                xs = [torch.randn(n, device=dev).to(dtype) for _ in range(r)]
                outs = [torch.empty_like(x) for x in xs]
                cells = []
                for algo in c.algorithms:
                    t = time_graph(lambda c=c, algo=algo, xs=xs, outs=outs: c.all_reduce(xs, algo=algo, out=outs))
                    cells.append(f"{algo.split('_')[-1]}={t:.2f}")
                row.append(f"{nbytes}B " + "/".join(cells))
            print(f"R={r} {str(dtype)[6:]}: " + " | ".join(row), flush=True)
        c.check()
    # reference: torch symmetric memory one-shot at world size 1
    try:
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        if not dist.is_initialized():
            dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29555", rank=0, world_size=1)
        for nbytes in sizes:
            t = symm_mem.empty(nbytes // 4, dtype=torch.float32, device=dev)
            symm_mem.rendezvous(t, dist.group.WORLD.group_name)
            us = time_graph(lambda t=t: torch.ops.symm_mem.one_shot_all_reduce(t, "sum", dist.group.WORLD.group_name))
            print(f"torch symm_mem one_shot ws=1 {nbytes}B: {us:.2f} us")
    except Exception as e:  # pragma: no cover
        print(f"symm_mem reference unavailable: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
