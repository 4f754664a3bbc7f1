"""Real ranks: one process per GPU over NCCL + torch symmetric memory. Skips with fewer than 2 GPUs."""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.multigpu]


def _worker(rank: int, world: int, port: int, q) -> None:  # type: ignore[no-untyped-def]
    import torch.distributed as dist

    import sollat
    from sollat.algorithms import ALGORITHMS

    from ._reference import rank_order_reduce, same_bits

    os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        comm = sollat.Communicator(timeout_s=5.0)
        bad = []
        for algo in [a for a, alg in ALGORITHMS.items() if alg.deterministic]:
            for n in (1, 33, 4097, 300001):
                gen = torch.Generator(device="cuda").manual_seed(n)  # same seed: every rank knows all inputs
                xs = [torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(world)]
                y = comm.all_reduce(xs[rank], algo=algo)
                if not bool(same_bits(y, rank_order_reduce(xs, "sum")).all()):
                    bad.append((algo, n))
        comm.check()
        q.put((rank, bad))
    except Exception as e:  # report, do not hang the parent
        q.put((rank, [repr(e)]))
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs >= 2 GPUs")
def test_two_processes_bitwise() -> None:
    import torch.multiprocessing as mp

    world = 2
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, world, 29611, q)) for r in range(world)]
    for p in procs:
        p.start()
    results = dict(q.get(timeout=300) for _ in range(world))
    for p in procs:
        p.join(timeout=60)
    assert all(not bad for bad in results.values()), results
