"""Real-rank checks, one process per GPU; run by test_multiprocess.py through torchrun.

Every rank draws every rank's inputs from the same seed, so each can check the result alone:
bitwise against the rank-order reference for deterministic algorithms, the summation bound for
LL128 (fused counter over NVLink: a torn 128-byte line would show up as a wrong sum), then the
timeout path (the last rank skips a call) and recovery.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _reference import assert_bitwise, assert_within_sum_bound, rank_order_reduce  # noqa: E402

import sollat  # noqa: E402
from sollat.algorithms import ALGORITHMS  # noqa: E402


def main() -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl")
    comm = sollat.Communicator(timeout_s=3.0)
    dev = comm.device
    calls = 0
    for algo, alg in ALGORITHMS.items():
        for dtype in [d for d in (torch.float32, torch.bfloat16, torch.float16, torch.float64) if d in alg.dtypes]:
            for n in (1, 7, 33, 1000, 4097, 65537, 300001):
                for rep in range(3 if n < 100000 else 1):
                    gen = torch.Generator(device=dev).manual_seed(hash((algo, str(dtype), n, rep)) % 2**31)
                    xs = [torch.randn(n, device=dev, generator=gen).to(dtype) for _ in range(world)]
                    out = torch.full_like(xs[rank], float("nan"))
                    y = comm.all_reduce(xs[rank], algo=algo, out=out)
                    what = f"rank {rank} {algo} {dtype} n={n}"
                    if alg.deterministic:
                        assert_bitwise(y, rank_order_reduce(xs, "sum"), what)
                    else:
                        assert_within_sum_bound(y, xs, what)
                    calls += 1
    # LL128 line atomicity over NVLink: many calls of random data, any torn line is a wrong sum
    gen = torch.Generator(device=dev).manual_seed(1234)
    for k in range(2000):
        xs = [torch.randn(20000, device=dev, generator=gen) for _ in range(world)]
        assert_within_sum_bound(comm.all_reduce(xs[rank], algo="ll128"), xs, f"rank {rank} ll128 soak call {k}")
    calls += 2000
    # auto, including the NCCL fallback above the table
    for nbytes in (128, 1 << 20, 64 << 20):
        x = torch.ones(nbytes // 4, device=dev) * (rank + 1)
        y = comm.all_reduce(x)
        assert bool((y == world * (world + 1) / 2).all()), f"rank {rank} auto {nbytes} B"
    comm.check()
    print(f"RANK {rank} CORRECT {calls} calls", flush=True)
    # timeout path: the last rank does not call; the others must name it
    x = torch.randn(1000, device=dev)
    if rank != world - 1:
        comm.all_reduce(x, algo="oneshot_ll")
        try:
            comm.check()
            raise AssertionError(f"rank {rank}: no timeout raised")
        except sollat.PeerTimeoutError as e:
            assert e.peer == world - 1, str(e)
            print(f"RANK {rank} TIMEOUT names peer {e.peer}", flush=True)
    comm.reset()
    xs = [torch.full((1000,), float(r + 1), device=dev) for r in range(world)]
    assert_bitwise(comm.all_reduce(xs[rank], algo="oneshot_ll"), rank_order_reduce(xs, "sum"), "after reset")
    print(f"RANK {rank} RECOVERED", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
