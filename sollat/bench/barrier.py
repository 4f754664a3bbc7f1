"""Barrier cost vs rank count (``python -m sollat barrier``).

The barrier is sollat's all-to-all flag barrier (``probe_barrier.cu``): every rank stores a flag
into every peer's inbox, then waits until it has seen every peer's flag; it has the shape of the
unicast path of NCCL's ``ncclLsaBarrierSession``. Two memory orders: relaxed (the signal alone,
the setting the paper measured) and release/acquire at system scope.

Two numbers per (variant, ranks):
* in-kernel: ``iters`` barriers back to back inside one launch, after ``warm`` untimed ones;
  per launch the slowest rank's time / iters; median over launches. This is the barrier alone.
* graph: one barrier per launch, launches back to back in a CUDA graph, minus the empty-kernel
  floor. This is what a kernel pays for a barrier it adds in front of its work.

Virtual ranks (one GPU): rank = blockIdx.y, all inboxes in one allocation, any rank count up to
the SM count. torchrun (N GPUs): inboxes in torch symmetric memory (CUDA backend, peer-mapped),
rank counts 2, 4, ... N on sub-groups of ranks 0..n-1.

NCCL's own ``ncclLsaBarrierSession`` is not measured (reported as a skipped row): see
NCCL_LSA_REASON.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .env import DistInfo
from .results import ERROR, SKIPPED, BarrierRow
from .stats import Stats

SOURCE = "probe_barrier.cu"
VARIANTS: dict[str, int] = {"a2a relaxed": 0, "a2a acq_rel": 1}
DEFAULT_RANKS = [2, 4, 8, 16, 32, 64]
QUICK_RANKS = [2, 4, 8, 16, 32]
INBOX_STRIDE_WORDS = 32  # each rank's inbox starts on its own 128-byte line

NCCL_LSA_REASON = (
    "not measured: ncclLsaBarrierSession's wait loop has no timeout (it polls until the "
    "communicator's abort flag is set), which sollat's bounded-spin rule forbids; it also needs "
    "<cuda/atomic> (CCCL), which NVRTC does not ship, and an ncclDevComm from ncclDevCommCreate, "
    "which torch 2.11 does not expose; with one GPU NCCL refuses a second rank on the same device, "
    "so its LSA team would have one member. The a2a rows follow the same arrive/wait algorithm."
)


def _kernel() -> Any:
    from ..device.build import get_kernel

    return get_kernel(SOURCE, "sollat_barrier_a2a")


def _threads(nranks: int) -> int:
    return max(32, (nranks + 31) // 32 * 32)


class _Setup:
    """Device buffers of one barrier configuration (virtual: all ranks; distributed: this rank)."""

    def __init__(self, device: Any, inbox_ptrs: list[int], rank_base: int, local_ranks: int, nranks: int,
                 timeout_s: float, keep: Any = None) -> None:
        import torch

        self.device = device
        self.keep = keep  # the allocation(s) the inbox pointers point into
        self.ptrs = torch.tensor(inbox_ptrs, dtype=torch.int64, device=device)
        self.epochs = torch.zeros(nranks, dtype=torch.int32, device=device)
        self.times = torch.zeros(2 * nranks, dtype=torch.int64, device=device)
        self.fault = torch.zeros(8, dtype=torch.int32, device=device)
        self.rank_base, self.local_ranks, self.nranks = rank_base, local_ranks, nranks
        self.timeout_ns = np.uint64(int(timeout_s * 1e9))
        self.kernel = _kernel()

    def launch(self, warm: int, iters: int, order: int) -> None:
        from ..device.launch import launch, launch_config

        args = (self.ptrs.data_ptr(), np.int32(self.rank_base), np.int32(self.nranks), self.epochs.data_ptr(),
                np.int32(warm), np.int32(iters), np.int32(order), self.times.data_ptr(), self.fault.data_ptr(),
                self.timeout_ns)
        launch(self.kernel, launch_config((1, self.local_ranks), _threads(self.nranks), pdl=False), args,
               device=self.device)

    def check(self) -> None:
        f = self.fault.tolist()
        if f[0] != 0:
            raise RuntimeError(f"barrier: rank {f[1]} timed out waiting for rank {f[2]} at epoch {f[6]}")

    def per_barrier_us(self, iters: int) -> float:
        """The slowest local rank's time per barrier in the last launch."""
        t = self.times.tolist()
        lo, hi = self.rank_base, self.rank_base + self.local_ranks
        return max(t[2 * r] for r in range(lo, hi)) / iters / 1000.0


def _measure(setup: _Setup, order: int, *, iters: int, warm: int, repeats: int, graph_calls: int,
             graph_replays: int, floor_us: float | None, sync: Any = None) -> tuple[list[float], Any]:
    import torch

    from .timing import time_calls

    samples = []
    for _ in range(repeats):
        if sync is not None:
            torch.cuda.synchronize(setup.device)
            sync()
        setup.launch(warm, iters, order)
        torch.cuda.synchronize(setup.device)
        setup.check()
        samples.append(setup.per_barrier_us(iters))
    graph = None
    if graph_calls > 0:
        g = time_calls(lambda _i: setup.launch(0, 1, order), calls=graph_calls, replays=graph_replays, sync=sync,
                       device=setup.device)
        setup.check()
        shift = floor_us or 0.0
        graph = Stats.of([v - shift for v in g.per_call_us])
    return samples, graph


def _rows(variant: str, ranks: int, samples: list[float], graph: Stats | None) -> list[BarrierRow]:
    rows = [BarrierRow(variant, ranks, "in-kernel").set_stats(Stats.of(samples))]
    if graph is not None:
        rows.append(BarrierRow(variant, ranks, "graph").set_stats(graph))
    return rows


def nccl_rows(ranks: list[int]) -> list[BarrierRow]:
    return [BarrierRow("nccl lsa", R, "in-kernel", status=SKIPPED, reason=NCCL_LSA_REASON) for R in ranks]


def barrier_virtual(device_index: int, ranks: list[int], *, iters: int = 1000, warm: int = 20, repeats: int = 7,
                    graph_calls: int = 50, graph_replays: int = 10, floor_us: float | None = None,
                    timeout_s: float = 5.0, progress: Any = None) -> list[BarrierRow]:
    """Barrier rows for every rank count in ``ranks`` (virtual ranks on one GPU)."""
    import torch

    from ..device.launch import ensure_device

    dev = torch.device("cuda", device_index)
    ensure_device(device_index)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    out: list[BarrierRow] = []
    for R in ranks:
        for variant, order in VARIANTS.items():
            if R < 2 or sms < R:
                out.append(BarrierRow(variant, R, "in-kernel", status=SKIPPED,
                                      reason=f"needs 2..{sms} ranks (one resident block per rank)"))
            else:
                try:
                    flags = torch.zeros(R * max(R, INBOX_STRIDE_WORDS), dtype=torch.int32, device=dev)
                    stride = 4 * max(R, INBOX_STRIDE_WORDS)
                    ptrs = [flags.data_ptr() + r * stride for r in range(R)]
                    setup = _Setup(dev, ptrs, 0, R, R, timeout_s, keep=flags)
                    samples, graph = _measure(setup, order, iters=iters, warm=warm, repeats=repeats,
                                              graph_calls=graph_calls, graph_replays=graph_replays, floor_us=floor_us)
                    out += _rows(variant, R, samples, graph)
                except Exception as exc:
                    out.append(BarrierRow(variant, R, "in-kernel", status=ERROR, reason=f"{type(exc).__name__}: {exc}"))
            if progress is not None:
                progress.advance(note=f"{variant} R={R}")
    return out + nccl_rows(ranks)


def barrier_distributed(info: DistInfo, ranks: list[int], *, iters: int = 1000, warm: int = 20, repeats: int = 7,
                        graph_calls: int = 50, graph_replays: int = 10, floor_us: float | None = None,
                        timeout_s: float = 10.0, progress: Any = None) -> list[BarrierRow]:
    """Barrier rows on sub-groups of ranks 0..n-1 for n in ``ranks`` (n <= world size); rank 0 gets them."""
    import torch
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    dev = torch.device("cuda", info.local_rank)
    sizes = [n for n in ranks if 2 <= n <= info.world_size]
    out: list[BarrierRow] = []
    for n in sizes:
        group = dist.new_group(list(range(n)))  # every rank must call new_group
        member = info.rank < n
        for variant, order in VARIANTS.items():
            result: Any = None
            if member:
                try:
                    buf = symm_mem.empty(max(n, INBOX_STRIDE_WORDS), dtype=torch.int32, device=dev)
                    buf.zero_()
                    hdl = symm_mem.rendezvous(buf, group.group_name)
                    ptrs = [int(p) for p in hdl.buffer_ptrs[:n]]
                    setup = _Setup(dev, ptrs, info.rank, 1, n, timeout_s, keep=(buf, hdl))
                    torch.cuda.synchronize(dev)
                    dist.barrier(group=group)
                    samples, graph = _measure(setup, order, iters=iters, warm=warm, repeats=repeats,
                                              graph_calls=graph_calls, graph_replays=graph_replays,
                                              floor_us=floor_us, sync=lambda g=group: dist.barrier(group=g))
                    result = (samples, graph.to_dict() if graph is not None else None)
                except Exception as exc:
                    result = f"{type(exc).__name__}: {exc}"
            gathered: list[Any] = [None] * info.world_size
            dist.all_gather_object(gathered, result)
            if info.rank == 0:
                got = gathered[:n]
                errors = [g for g in got if isinstance(g, str)]
                if errors:
                    out.append(BarrierRow(variant, n, "in-kernel", status=ERROR, reason=errors[0]))
                else:
                    # per launch, the slowest rank
                    per_launch = [max(g[0][i] for g in got) for i in range(len(got[0][0]))]
                    graphs = [Stats.from_dict(g[1]) for g in got if g[1] is not None]
                    graph = max(graphs, key=lambda s: s.median) if graphs else None
                    out += _rows(variant, n, per_launch, graph)
            if progress is not None:
                progress.advance(note=f"{variant} n={n}")
    return out + (nccl_rows(sizes) if info.rank == 0 else [])
