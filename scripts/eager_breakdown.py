"""Where an eager ``all_reduce`` spends its host time on real ranks.

Each step of ``Communicator.all_reduce(x, out=out)`` timed on its own, in the same process and
run as the yardsticks ``x.add_(y)`` and ``x + y``: the pure-host steps (no launch) over many
iterations, the launching ones as in ``scripts/eager_real.py`` (500 back-to-back calls, one
synchronize, fastest of five runs, slowest rank). The steps are ``sollat.testing.eager_probes``.
Every launching case is a real collective (both ranks make the same calls), so the loops stay
paired.

    torchrun --nproc-per-node 2 scripts/eager_breakdown.py [--bytes 128] [--into DIR]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import _real_ranks
import torch
import torch.distributed as dist
from _host_timing import eager_us, host_us

import sollat
from sollat import testing

CALLS, RUNS = 500, 5


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bytes", type=int, default=128, help="fp32 bytes per rank")
    p.add_argument("--into", default=None, help="folder for eager-breakdown.json")
    args = p.parse_args()
    rank = _real_ranks.start()
    comm = sollat.Communicator()
    n = args.bytes // 4
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.empty_like(x)
    comm.all_reduce(x, out=out)  # compile and agree on the call shape (the hot path's cache)
    torch.cuda.synchronize()
    probes = testing.eager_probes(comm, x, out)
    host: dict[str, Callable[[], object]] = {k: v for k, v in probes.items() if k.startswith("host")}
    host.update({
        "empty loop": lambda: None,
        "torch.compiler.is_compiling()": torch.compiler.is_compiling,
        "torch.empty_like(x)": lambda: torch.empty_like(x),
    })
    launched: dict[str, Callable[[], object]] = {k: v for k, v in probes.items() if not k.startswith("host")}
    launched.update({
        "torch x.add_(y)": lambda: x.add_(y),
        "torch x + y": lambda: x + y,
        "comm.all_reduce(x, out=out)": lambda: comm.all_reduce(x, out=out),
        "comm.all_reduce(x, out=x)": lambda: comm.all_reduce(x, out=x),
        "comm.all_reduce(x)": lambda: comm.all_reduce(x),
    })
    rows: list[dict[str, object]] = []
    for name, fn in host.items():
        rows.append({"case": name, "kind": "host", "us": _real_ranks.slowest(host_us(fn))})
    for name, fn in launched.items():
        x.normal_()
        rows.append({"case": name, "kind": "launched", "us": _real_ranks.slowest(eager_us(fn, CALLS, RUNS, before=dist.barrier))})
    comm.check()
    if rank == 0:
        for r in rows:
            print(f"{args.bytes:>6} B  {r['kind']:<8} {r['case']:<34} {r['us']:7.3f} us", flush=True)
        if args.into:
            _real_ranks.write(args.into, "eager-breakdown.json", rows, calls=CALLS, runs=RUNS, bytes=args.bytes)
    _real_ranks.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
