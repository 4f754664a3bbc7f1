"""Where an eager ``all_reduce`` spends its host time on real ranks (issue 13, item 3).

Each step of ``Communicator.all_reduce(x, out=out)`` timed on its own, in the same process and
run as the yardsticks ``x.add_(y)`` and ``x + y``: the pure-host steps (no launch) over many
iterations, the launching ones as in ``scripts/eager_real.py`` (500 back-to-back calls, one
synchronize, fastest of five runs, slowest rank). The driver launch is timed three ways on
sollat's own kernel: ``cuLaunchKernelEx`` with the PDL attribute (what sollat does), without it,
and the plain ``cuLaunchKernel``. Every launching case is a real collective (both ranks make the
same calls), so the loops stay paired.

    torchrun --nproc-per-node 2 scripts/eager_breakdown.py [--bytes 128] [--into DIR]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

import sollat
from sollat import driver_launch, launch
from sollat.dtypes import DTYPES

CALLS, RUNS, HOST_ITERS = 500, 5, 20000


def launched_us(fn: Callable[[], object]) -> float:
    for _ in range(50):
        fn()
    best = float("inf")
    for _ in range(RUNS):
        torch.cuda.synchronize()
        dist.barrier()
        t = time.perf_counter()
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / CALLS * 1e6)
    return best


def host_us(fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(RUNS):
        t = time.perf_counter()
        for _ in range(HOST_ITERS):
            fn()
        best = min(best, (time.perf_counter() - t) / HOST_ITERS * 1e6)
    return best


def slowest(v: float) -> float:
    t = torch.tensor([v], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def plain_launcher(bound: driver_launch.BoundLaunch) -> Callable[[int, tuple[int, int]], None]:
    """The same kernel and arguments through cuLaunchKernel (no launch attributes)."""
    lib = ctypes.CDLL("libcuda.so.1")
    f, cfg, params = bound._func, bound._cfg, bound._params  # noqa: SLF001 - diagnostic reuse
    fn = lib.cuLaunchKernel
    g, b = tuple(cfg.grid), tuple(cfg.block)
    pack, slots = bound._pack_ptrs, bound._slots  # noqa: SLF001

    def go(stream: int, ptrs: tuple[int, int]) -> None:
        pack(slots, 0, *ptrs)
        rc = fn(f, g[0], g[1], g[2], b[0], b[1], b[2], cfg.shared_mem_bytes, ctypes.c_void_p(stream), params, None)
        if rc:
            raise RuntimeError(f"cuLaunchKernel failed: {rc}")
    return go


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bytes", type=int, default=128, help="fp32 bytes per rank")
    p.add_argument("--into", default=None, help="folder for eager-breakdown.json")
    args = p.parse_args()
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    comm = sollat.Communicator()
    n = args.bytes // 4
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.empty_like(x)
    comm.all_reduce(x, out=out)  # compile and agree on the call shape
    torch.cuda.synchronize()
    dt = DTYPES[torch.float32]
    plan = comm._call_plan(n, dt, "sum", "auto", False, False)  # noqa: SLF001
    assert not isinstance(plan, str) and plan.bound is not None, "expected a sollat kernel at this size"
    ptrs = (x.data_ptr(), out.data_ptr())
    idx = torch.cuda.current_device()
    stream = launch.stream_handle(idx)
    no_pdl = driver_launch.BoundLaunch(plan.kernel, _without_pdl(plan.config), plan.tail, 2)
    plain = plain_launcher(plan.bound)
    symm = comm._symm  # noqa: SLF001

    host: dict[str, Callable[[], object]] = {
        "empty loop": lambda: None,
        "torch.compiler.is_compiling()": torch.compiler.is_compiling,
        "comm._before_call()": comm._before_call,  # noqa: SLF001
        "fast-path checks": lambda: (DTYPES.get(x.dtype) is not None and x.get_device() == idx and x.is_contiguous()
                                     and x.numel() <= 1 << 40 and out.get_device() == idx
                                     and out.dtype is x.dtype and out.shape == x.shape and out.is_contiguous()),
        "symm.zero_copy(x, out)": lambda: bool(symm) and symm.zero_copy(x, out),
        "comm._call_plan(...)": lambda: comm._call_plan(n, dt, "sum", "auto", False, False),  # noqa: SLF001
        "stream_handle": lambda: launch.stream_handle(idx),
        "2 x data_ptr()": lambda: (x.data_ptr(), out.data_ptr()),
        "launch.is_capturing()": launch.is_capturing,
        "torch.empty_like(x)": lambda: torch.empty_like(x),
        "x.new_empty(x.shape)": lambda: x.new_empty(x.shape),
        "torch.empty(n, dtype, device)": lambda: torch.empty(n, dtype=x.dtype, device=x.device),
    }
    launched: dict[str, Callable[[], object]] = {
        "torch x.add_(y)": lambda: x.add_(y),
        "torch x + y": lambda: x + y,
        "cuLaunchKernelEx + PDL (bound)": lambda: plan.bound(stream, ptrs),
        "cuLaunchKernelEx, no PDL": lambda: no_pdl(stream, ptrs),
        "comm._launch(plan, ptrs)": lambda: comm._launch(plan, ptrs),  # noqa: SLF001
        "comm._all_reduce_impl(out=)": lambda: comm._all_reduce_impl(x, "sum", "auto", out, False),  # noqa: SLF001
        "comm.all_reduce(x, out=out)": lambda: comm.all_reduce(x, out=out),
        "comm.all_reduce(x)": lambda: comm.all_reduce(x),
    }
    if getattr(plan.config, "cluster", None) is None:  # cuLaunchKernel cannot ask for a cluster
        launched["cuLaunchKernel"] = lambda: plain(stream, ptrs)
    rows: list[dict[str, object]] = []
    for name, fn in host.items():
        rows.append({"case": name, "kind": "host", "us": slowest(host_us(fn))})
    for name, fn in launched.items():
        x.normal_()
        rows.append({"case": name, "kind": "launched", "us": slowest(launched_us(fn))})
    comm.check()
    if rank == 0:
        for r in rows:
            print(f"{args.bytes:>6} B  {r['kind']:<8} {r['case']:<34} {r['us']:7.3f} us", flush=True)
        if args.into:
            Path(args.into).mkdir(parents=True, exist_ok=True)
            meta = {"card": torch.cuda.get_device_name(), "world_size": dist.get_world_size(), "bytes": args.bytes,
                    "commit": os.environ.get("SOLLAT_COMMIT", "unknown"), "calls": CALLS, "runs": RUNS,
                    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            (Path(args.into) / "eager-breakdown.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _without_pdl(config: object) -> object:
    from cuda.core import LaunchConfig

    return LaunchConfig(grid=config.grid, block=config.block, cluster=getattr(config, "cluster", None),  # type: ignore[attr-defined]
                        programmatic_stream_serialization=False)


if __name__ == "__main__":
    raise SystemExit(main())
