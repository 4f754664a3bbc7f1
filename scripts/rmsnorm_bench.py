"""AllReduce + residual add + RMSNorm at decode shapes: sollat's fused kernel against the unfused
ways a tensor-parallel model does it, timed the way every sollat row is (sollat.bench.timing:
CUDA-graph replay of back-to-back calls on rotating inputs, median of replays; the empty-kernel
floor in the same run).

Rows (µs per step; one step = one layer's AllReduce + add + norm):
* ``fused_ll`` / ``fused_sentinel`` / ``fused_auto``: ``all_reduce_rmsnorm`` (residual in place;
  ``fused_auto`` is ``unfused`` but for one or two wide rows: rmsnorm.auto_choice);
* ``unfused``: ``all_reduce_rmsnorm(algo="unfused")``: sollat's AllReduce, then its one-GPU epilogue;
* ``ar``: sollat's AllReduce alone (what the communication costs);
* ``ar+torch``: sollat AllReduce, then ``r = y + residual`` and ``F.rms_norm`` (eager kernels);
* ``ar+compiled``: sollat AllReduce, then the add and norm compiled by ``torch.compile`` (one
  Triton kernel);
* real ranks also: ``nccl+torch`` / ``nccl+compiled`` (NCCL's AllReduce, in place).

Virtual ranks (one process, R ranks on GPU 0): the add and norm run once over all R ranks' rows
(a stacked ``[R, tokens, hidden]`` tensor), i.e. as many kernel launches as one real rank makes.
Real ranks: ``torchrun --nproc-per-node N scripts/rmsnorm_bench.py``; each row is the slowest
rank's median. Before timing, each fused algorithm's output is checked bitwise against
``sollat.rmsnorm.reference`` on fresh inputs, and the unfused result against the fused one.

    python3 scripts/rmsnorm_bench.py --ranks 2,4,8 --into /tmp/rmsnorm-bench
    torchrun --nproc-per-node 2 scripts/rmsnorm_bench.py --into /tmp/rmsnorm-bench
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import sollat
from sollat.bench import env
from sollat.bench.timing import measure_floor, slowest_rank, time_calls
from sollat.collectives import algorithms, rmsnorm

SHAPES = ((1, 4096), (1, 8192), (4, 8192), (8, 4096), (8, 8192))  # (tokens, hidden): decode steps
EPS = 1e-6
SETS = 4
ONESHOT = ("oneshot_ll", "oneshot_sentinel", "unfused", "auto")
TWOSHOT = ("twoshot_sentinel",)  # rows only with SOLLAT_EXPERIMENTAL_RMSNORM_TWOSHOT=1


def fused_algos() -> tuple[str, ...]:
    return ONESHOT + (TWOSHOT if algorithms.rmsnorm_twoshot_enabled() else ())


def _post(y: torch.Tensor, res: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What an unfused layer does after its AllReduce (vLLM's fused_add_rms_norm, unfused)."""
    r = y + res
    return F.rms_norm(r, (r.shape[-1],), w, EPS), r


# One compiled graph per shape (R x shapes of them on virtual ranks): above dynamo's recompile limit
# it would silently run the eager function instead.
for _knob in ("recompile_limit", "cache_size_limit"):
    if hasattr(torch._dynamo.config, _knob):
        setattr(torch._dynamo.config, _knob, 64)
_post_compiled = torch.compile(_post, dynamic=False)


class Case:
    """One shape on one communicator: rotating input sets, outputs, and one callable per row."""

    def __init__(self, comm: Any, virtual: bool, ranks: int, tokens: int, hidden: int, dtype: torch.dtype,
                 dev: torch.device, gen: torch.Generator) -> None:
        self.comm, self.virtual, self.ranks = comm, virtual, ranks
        lead = (ranks,) if virtual else ()
        shape = (*lead, tokens, hidden)

        def randn() -> torch.Tensor:
            return torch.randn(shape, generator=gen, device=dev).to(dtype)

        self.xs = [randn() for _ in range(SETS)]
        self.res = [randn() for _ in range(SETS)]
        self.ys = [torch.full(shape, float("nan"), device=dev, dtype=dtype) for _ in range(SETS)]
        self.w = torch.randn(hidden, generator=gen, device=dev).to(dtype)

    def per_rank(self, t: torch.Tensor) -> Any:
        return list(t.unbind(0)) if self.virtual else t

    def all_reduce(self, i: int) -> None:
        i %= SETS
        self.comm.all_reduce(self.per_rank(self.xs[i]), out=self.per_rank(self.ys[i]))

    def fused(self, algo: str) -> Callable[[int], None]:
        def call(i: int) -> None:
            i %= SETS
            res = self.per_rank(self.res[i])
            self.comm.all_reduce_rmsnorm(self.per_rank(self.xs[i]), res, self.w, EPS, algo,
                                         out=self.per_rank(self.ys[i]), residual_out=res)
        return call

    def unfused(self, post: Callable[..., Any], nccl: bool = False) -> Callable[[int], None]:
        def call(i: int) -> None:
            i %= SETS
            if nccl:  # NCCL reduces in place: xs[i] holds the sum
                import torch.distributed as dist

                dist.all_reduce(self.xs[i])
                post(self.xs[i], self.res[i], self.w)
            else:
                self.all_reduce(i)
                post(self.ys[i], self.res[i], self.w)
        return call


def check(case: Case, algo: str, gen: torch.Generator, world: int, rank: int) -> str:
    """The fused output on fresh inputs, bitwise against the reference (every rank's inputs are
    drawn from the same generator state, so each rank can build all of them)."""
    dev = case.w.device
    shape = case.xs[0].shape[-2:]
    dt = case.w.dtype
    xs = [torch.randn(shape, generator=gen, device=dev).to(dt) for _ in range(world)]
    res = torch.randn(shape, generator=gen, device=dev).to(dt)
    before = res.clone()
    if case.virtual:
        ys, rs = case.comm.all_reduce_rmsnorm(xs, [res.clone() for _ in range(world)], case.w, EPS, algo)
        y, r = ys[0], rs[0]
        same = all(torch.equal(a, y) for a in ys) and all(torch.equal(a, r) for a in rs)
    else:
        y, r = case.comm.all_reduce_rmsnorm(xs[rank], res, case.w, EPS, algo)
        same = True
    case.comm.check()
    if algo == "auto":
        return "ok (auto)" if same else "ranks differ"
    want_y, want_r = rmsnorm.algo_reference(algo, xs, before, case.w, EPS)
    ok = same and torch.equal(y.cpu(), want_y) and torch.equal(r.cpu(), want_r)
    unfused_y, _ = _post(sum(x.float() for x in xs).to(dt), before, case.w)
    close = torch.allclose(unfused_y.float(), y.float(), rtol=5e-2, atol=5e-2)
    return ("bitwise ok" if ok else "MISMATCH") + ("" if close else ", far from the unfused result")


def run_one(comm: Any, virtual: bool, ranks: int, rank: int, tokens: int, hidden: int, dtype: torch.dtype,
            dev: torch.device, calls: int, replays: int, sync: Callable[[], None] | None) -> dict[str, Any]:
    gen = torch.Generator(device=dev).manual_seed(1000 * tokens + hidden)  # same on every rank
    case = Case(comm, virtual, ranks, tokens, hidden, dtype, dev, gen)
    fused = fused_algos()
    checks = {algo: check(case, algo, gen, ranks, rank) for algo in fused}
    rows: dict[str, Callable[[int], None]] = {
        a if a == rmsnorm.UNFUSED else f"fused_{a.removeprefix('oneshot_')}": case.fused(a) for a in fused}
    rows["ar"] = case.all_reduce
    rows["ar+torch"] = case.unfused(_post)
    rows["ar+compiled"] = case.unfused(_post_compiled)
    if not virtual:
        rows["nccl+torch"] = case.unfused(_post, nccl=True)
        rows["nccl+compiled"] = case.unfused(_post_compiled, nccl=True)
    us = {}
    for name, fn in rows.items():
        t = time_calls(fn, calls=calls, replays=replays, sync=sync, device=dev).stats.median
        us[name] = slowest_rank(t)
    return {"ranks": ranks, "tokens": tokens, "hidden": hidden, "dtype": str(dtype).removeprefix("torch."),
            "us": us, "checks": checks}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="2,4,8", help="virtual ranks (ignored under torchrun)")
    p.add_argument("--calls", type=int, default=50, help="steps per CUDA graph")
    p.add_argument("--replays", type=int, default=25)
    p.add_argument("--into", default=None, help="folder for rmsnorm-bench.json")
    p.add_argument("--commit", default=None)
    p.add_argument("--row-lines", type=int, default=None,
                   help="development: rmsnorm.ROW_LINES_PER_BLOCK for this run (how wide a row's cluster gets)")
    p.add_argument("--shapes", default=",".join(f"{t}x{h}" for t, h in SHAPES),
                   help="comma list of TOKENSxHIDDEN (default: decode steps)")
    a = p.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    if a.row_lines is not None:
        rmsnorm.ROW_LINES_PER_BLOCK = a.row_lines  # read by every geometry (the kernel's and the reference's)
    env.apply_safety_env()
    dist_info = env.dist_info()
    dev = torch.device("cuda", dist_info.local_rank if dist_info else 0)
    torch.cuda.set_device(dev)
    results = []
    if dist_info:
        import torch.distributed as dist

        dist.init_process_group("nccl", device_id=dev)
        comm = sollat.Communicator()
        rank, world = dist.get_rank(), dist.get_world_size()
        configs = [(comm, False, world)]
        sync: Callable[[], None] | None = dist.barrier
    else:
        rank, sync = 0, None
        configs = [(sollat.VirtualCommunicator(r, dev), True, r) for r in (int(v) for v in a.ranks.split(","))]
        world = max(c[2] for c in configs)
    floor = measure_floor(dev, calls=a.calls, replays=a.replays, sync=sync).stats.median
    for comm, virtual, ranks in configs:
        for tokens, hidden in shapes:
            results.append(run_one(comm, virtual, ranks, rank, tokens, hidden, torch.bfloat16, dev, a.calls,
                                   a.replays, sync))
            if rank == 0:
                _print(results[-1], floor)
    if rank == 0:
        meta = env.collect_meta(tool="scripts/rmsnorm_bench.py", mode="virtual" if not dist_info else "distributed",
                                ranks=sorted({r["ranks"] for r in results}), world_size=world, commit=a.commit,
                                args=vars(a))
        out = {"meta": meta, "floor_us": floor, "rows": results}
        if a.into:
            Path(a.into).mkdir(parents=True, exist_ok=True)
            (Path(a.into) / "rmsnorm-bench.json").write_text(json.dumps(out, indent=1))
        bad = [r for r in results for c in r["checks"].values() if not c.startswith(("bitwise ok", "ok"))]
        print(f"floor {floor:.2f} us; {len(results)} shapes; checks: {'all ok' if not bad else f'{len(bad)} FAILED'}")
    if dist_info:
        import torch.distributed as dist

        dist.destroy_process_group()
    return 0


_printed_header = False


def _print(r: dict[str, Any], floor: float) -> None:
    global _printed_header
    names = list(r["us"])
    if not _printed_header:
        print(f"# floor {floor:.2f} us; median us per step; bf16; {'  '.join(names)}")
        print(f"{'R':>2} {'shape':>9} " + " ".join(f"{n:>13}" for n in names) + "  best unfused / fused")
        _printed_header = True
    fused = min(v for k, v in r["us"].items() if k.startswith("fused"))
    unfused = min(v for k, v in r["us"].items() if "+" in k)
    print(f"{r['ranks']:>2} {r['tokens']:>3}x{r['hidden']:<5} " + " ".join(f"{r['us'][n]:>13.2f}" for n in names)
          + f"  {unfused / fused:.2f}x  [{', '.join(f'{k}: {v}' for k, v in r['checks'].items())}]")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
