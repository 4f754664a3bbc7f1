"""Eager cost per call on real ranks: 500 back-to-back calls, then one
synchronize; per call = wall time / 500, the fastest of nine runs (the cases take turns), the
slowest rank. Beside
sollat (with and without ``out=``), on the same tensors and in the same run: torch's own
elementwise ``x.add_(y)`` and ``x + y`` (the yardsticks), torch symmetric memory's one-shot
(into a new tensor and with ``out``) and NCCL (``dist.all_reduce``, in place).

    torchrun --nproc-per-node 2 scripts/eager_real.py [--sizes 128,8192,131072] [--into DIR]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import _real_ranks
import torch
import torch.distributed as dist

import sollat

CALLS, RUNS = 500, 9


def one_size(comm: sollat.Communicator, nbytes: int, group: str) -> list[dict[str, object]]:
    import torch.distributed._symmetric_memory as symm_mem

    n = nbytes // 4
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.empty_like(x)
    sx = symm_mem.empty(n, device="cuda")
    symm_mem.rendezvous(sx, group)
    sx.copy_(x)
    cases: dict[str, Callable[[], object]] = {
        "torch x.add_(y)": lambda: x.add_(y),
        "torch x + y": lambda: x + y,
        "sollat out=": lambda: comm.all_reduce(x, out=out),
        "sollat new output": lambda: comm.all_reduce(x),
        "torch one_shot out=": lambda: torch.ops.symm_mem.one_shot_all_reduce_out(sx, "sum", group, out),
        "torch one_shot new output": lambda: torch.ops.symm_mem.one_shot_all_reduce(sx, "sum", group),
        "nccl in place": lambda: dist.all_reduce(out),
    }
    # The cases take turns, run after run (the fastest run of each counts): host noise that comes
    # and goes (other tenants, clock changes) then weighs on every case alike.
    best = dict.fromkeys(cases, float("inf"))
    for fn in cases.values():
        for _ in range(50):  # warm-up
            fn()
    for _ in range(RUNS):
        for name, fn in cases.items():
            x.normal_()  # add_ grows x; keep the values finite between cases
            best[name] = min(best[name], _real_ranks.eager_us(fn, CALLS))
    rows: list[dict[str, object]] = []
    for name in cases:
        us = _real_ranks.slowest(best[name])
        rows.append({"bytes": nbytes, "case": name, "us": us})
        if dist.get_rank() == 0:
            print(f"{nbytes:>8} B  {name:<26} {us:7.2f} us", flush=True)
    comm.check()
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="128,8192,131072", help="bytes per rank, comma list (fp32)")
    p.add_argument("--into", default=None, help="folder for eager.json")
    args = p.parse_args()
    rank = _real_ranks.start()
    comm = sollat.Communicator()
    group = dist.group.WORLD.group_name
    rows = [row for nbytes in (int(v) for v in args.sizes.split(",")) for row in one_size(comm, nbytes, group)]
    if rank == 0:
        by = {(r["bytes"], r["case"]): r["us"] for r in rows}
        for nbytes in sorted({r["bytes"] for r in rows}):
            a = by[(nbytes, "sollat out=")] / by[(nbytes, "torch x.add_(y)")]
            b = by[(nbytes, "sollat new output")] / by[(nbytes, "torch x + y")]
            print(f"{nbytes:>8} B  sollat out= / x.add_(y) = {a:.2f}; sollat new output / (x + y) = {b:.2f}")
        if args.into:
            _real_ranks.write(args.into, "eager.json", rows, calls=CALLS, runs=RUNS)
    _real_ranks.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
