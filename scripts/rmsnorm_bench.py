"""AllReduce + residual add + RMSNorm at decode shapes: sollat's fused kernels, its unfused path and
``auto`` against sollat's AllReduce followed by a torch.compile'd add + norm, timed the way every
sollat row is (sollat.bench.timing: CUDA-graph replay of back-to-back calls on rotating inputs,
median of replays; the empty-kernel floor in the same run).

Rows (µs per step; one step = one layer's AllReduce + add + norm, residual updated in place):
* ``fused_ll`` / ``fused_sentinel``: ``all_reduce_rmsnorm`` with that fused one-shot;
* ``auto``: the time of the algorithm ``auto`` picks (the same launches; the pick is recorded);
* ``unfused``: ``all_reduce_rmsnorm(algo="unfused")``: sollat's AllReduce, then its one-GPU epilogue;
* ``ar``: sollat's AllReduce alone (what the communication costs);
* ``ar+compiled``: sollat's AllReduce, then the add and norm compiled by ``torch.compile`` (rows
  dynamic, hidden static: one Triton kernel);
* ``epilogue`` / ``compiled_norm``: the add + norm alone, sollat's epilogue kernel
  (rmsnorm_epilogue.add_rmsnorm) against the compiled one, over the same rows;
* with ``+fp8``: every row also writes the float8_e4m3fn copy (the compiled one divides by the
  scale, clamps and converts).

Virtual ranks (one process, R ranks on GPU 0): the add and norm run once over all R ranks' rows
(``[R * tokens, hidden]``), as sollat's epilogue serves every rank in one launch: as many launches
as one real rank makes. Real ranks: ``torchrun --nproc-per-node N scripts/rmsnorm_bench.py``; each
row is the slowest rank's median. Before timing, every algorithm (auto and the epilogue alone
included) is checked bitwise against ``sollat.rmsnorm.reference`` on fresh inputs (the first four
rows and the last: a row's bits do not depend on its batch).

    python3 scripts/rmsnorm_bench.py --into /tmp/rmsnorm-bench            # the full sweep (R = 2, 4, 8)
    python3 scripts/rmsnorm_bench.py --quick
    python3 scripts/rmsnorm_bench.py --rules-from /tmp/rmsnorm-bench/rmsnorm-bench.json \\
        --write-tables sollat/collectives/tuning                           # auto's rules from a sweep

``--ab`` (development) also checks and times, at every shape, the fused ``oneshot_ll_block`` (one block
per row) and its pipelined build ``oneshot_ll_block_pipe``, and the epilogue's A/B builds (``AB_VARIANTS``), each checked bitwise first, and prints one
more line per shape: their µs, the fused rows' distance to ``ar``, the best fused row's margin under
``ar+compiled``, and each epilogue build's ratio to the compiled norm (FAIL where a check failed).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

import sollat
from sollat.bench import env, results
from sollat.bench import rmsnorm_sweep as sweep
from sollat.bench.timing import calls_for, measure_floor, sets_for, slowest_rank, time_calls
from sollat.collectives import rmsnorm, rmsnorm_epilogue
from sollat.collectives.rmsnorm_epilogue import add_rmsnorm

EPS = 1e-6
FP8_SCALE = 0.02
FP8 = torch.float8_e4m3fn
INT_OF = {1: torch.uint8, 2: torch.int16, 4: torch.int32}
# --ab: the fused algorithms outside auto's choices, and the epilogue's builds besides the default
AB_FUSED = ("oneshot_ll_block", "oneshot_ll_block_pipe")
AB_VARIANTS: dict[str, rmsnorm_epilogue.Variant] = {
    "epi_s2": rmsnorm_epilogue.Variant(2), "epi_s1": rmsnorm_epilogue.Variant(1),
    "epi_pow2": rmsnorm_epilogue.Variant(pow2_mean=True), "epi_s2_pow2": rmsnorm_epilogue.Variant(2, True)}


def _post(y: torch.Tensor, res: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What an unfused layer does after its AllReduce (vLLM's fused_add_rms_norm, unfused)."""
    r = y + res
    return F.rms_norm(r, (r.shape[-1],), w, EPS), r


def _post_fp8(y: torch.Tensor, res: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, ...]:
    n, r = _post(y, res, w)
    return n, r, (n.float() / scale).clamp(-448.0, 448.0).to(FP8)


# One compiled graph per (dtype, hidden): rows are marked dynamic, nothing else becomes dynamic on
# its own (a hidden size seen second would otherwise turn the reduction into a looped one).
torch._dynamo.config.automatic_dynamic_shapes = False
for _knob in ("recompile_limit", "cache_size_limit"):
    if hasattr(torch._dynamo.config, _knob):
        setattr(torch._dynamo.config, _knob, 64)
_compiled = torch.compile(_post)
_compiled_fp8 = torch.compile(_post_fp8)


class Case:
    """One shape on one communicator: rotating input sets, outputs, and one callable per row."""

    def __init__(self, comm: Any, virtual: bool, shape: sweep.Shape, dev: torch.device, gen: torch.Generator) -> None:
        self.comm, self.virtual, self.shape = comm, virtual, shape
        dtype = getattr(torch, shape.dtype)
        full = ((shape.ranks,) if virtual else ()) + (shape.tokens, shape.hidden)
        per_set = 3 * shape.ranks * shape.tokens * shape.row_bytes
        self.sets = sets_for(per_set, budget_bytes=8 << 30)

        def randn() -> torch.Tensor:
            return torch.randn(full, generator=gen, device=dev).to(dtype)

        self.xs = [randn() for _ in range(self.sets)]
        self.res = [randn() for _ in range(self.sets)]
        self.ys = [torch.full(full, float("nan"), device=dev, dtype=dtype) for _ in range(self.sets)]
        self.qs = [torch.empty(full, device=dev, dtype=FP8) for _ in range(self.sets)] if shape.fp8 else []
        self.w = (1 + 0.1 * torch.randn(shape.hidden, generator=gen, device=dev)).to(dtype)
        self.scale = torch.tensor([FP8_SCALE], device=dev) if shape.fp8 else None
        self.r = [[self.per_rank(t) for t in ts] for ts in (self.xs, self.res, self.ys, self.qs)]
        self.flat = [[t.view(-1, shape.hidden) for t in ts] for ts in (self.ys, self.res, self.qs)]
        for t in self.flat[0] + self.flat[1]:
            torch._dynamo.maybe_mark_dynamic(t, 0)

    def per_rank(self, t: torch.Tensor) -> Any:
        return list(t.unbind(0)) if self.virtual else t

    def fp8_args(self, i: int, flat: bool = False) -> dict[str, Any]:
        if not self.shape.fp8:
            return {}
        return {"fp8_scale": self.scale, "fp8_out": self.flat[2][i] if flat else self.r[3][i]}

    def fused(self, algo: str) -> Callable[[int], None]:
        def call(i: int) -> None:
            i %= self.sets
            xs, res, ys, _ = (r[i] if r else None for r in self.r)
            self.comm.all_reduce_rmsnorm(xs, res, self.w, EPS, algo, out=ys, residual_out=res, **self.fp8_args(i))
        return call

    def all_reduce(self, i: int) -> None:
        i %= self.sets
        self.comm.all_reduce(self.r[0][i], out=self.r[2][i])

    def norm(self, i: int) -> None:  # the compiled add + norm over every rank's rows
        i %= self.sets
        if self.shape.fp8:
            _compiled_fp8(self.flat[0][i], self.flat[1][i], self.w, self.scale)
        else:
            _compiled(self.flat[0][i], self.flat[1][i], self.w)

    def ar_norm(self, i: int) -> None:
        self.all_reduce(i)
        self.norm(i)

    def epilogue(self, i: int) -> None:  # sollat's epilogue alone, in place as in the unfused path
        i %= self.sets
        y, res = self.flat[0][i], self.flat[1][i]
        add_rmsnorm(y, res, self.w, EPS, out=y, residual_out=res, **self.fp8_args(i, flat=True))

    def epilogue_variant(self, v: rmsnorm_epilogue.Variant) -> Callable[[int], None]:
        def call(i: int) -> None:
            with rmsnorm_epilogue.variant(v):
                self.epilogue(i)
        return call


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().view(INT_OF[t.element_size()])


def check(case: Case, gen: torch.Generator, world: int, rank: int, ab: bool = False) -> dict[str, str]:
    """Each algorithm (and the epilogue alone) on fresh inputs, bitwise against the reference on
    the first four rows and the last (every rank's inputs come from the same generator state, so
    each rank can build all of them)."""
    s, dev = case.shape, case.w.device
    dtype = case.w.dtype
    xs = [torch.randn(s.tokens, s.hidden, generator=gen, device=dev).to(dtype) for _ in range(world)]
    res = torch.randn(s.tokens, s.hidden, generator=gen, device=dev).to(dtype)
    keep = sorted({0, 1, 2, 3, s.tokens - 1} & set(range(s.tokens)))
    want_y, want_r = rmsnorm.reference([x[keep] for x in xs], res[keep], case.w, EPS)
    want = [want_y, want_r] + ([rmsnorm.fp8_reference(want_y, case.scale)] if s.fp8 else [])
    kw = {"fp8_scale": case.scale} if s.fp8 else {}
    out = {}
    for algo in ("oneshot_ll", "oneshot_sentinel", "unfused", "auto", *(AB_FUSED if ab else ())):
        if case.virtual:
            got = case.comm.all_reduce_rmsnorm(xs, [res.clone() for _ in range(world)], case.w, EPS, algo, **kw)
            same = all(torch.equal(_bits(a), _bits(g[0])) for g in got for a in g[1:])
            mine = [g[0] for g in got]
        else:
            mine, same = list(case.comm.all_reduce_rmsnorm(xs[rank], res.clone(), case.w, EPS, algo, **kw)), True
        ok = all(torch.equal(_bits(m)[keep], _bits(w)) for m, w in zip(mine, want, strict=True))
        out[algo] = ("bitwise ok" if ok else "MISMATCH") + ("" if same else ", ranks differ")
    acc = xs[0].float()
    for x in xs[1:]:  # rank order in fp32, one rounding: the AllReduce's s, on the GPU
        acc = acc + x.float()
    total = acc.to(dtype)
    got = add_rmsnorm(total, res.clone(), case.w, EPS, **kw)
    ok = all(torch.equal(_bits(m)[keep], _bits(w)) for m, w in zip(got, want, strict=True))
    out["epilogue"] = "bitwise ok" if ok else "MISMATCH"
    for name, v in AB_VARIANTS.items() if ab else ():
        with rmsnorm_epilogue.variant(v):
            got = add_rmsnorm(total, res.clone(), case.w, EPS, **kw)
        ok = all(torch.equal(_bits(m)[keep], _bits(w)) for m, w in zip(got, want, strict=True))
        out[name] = "bitwise ok" if ok else "MISMATCH"
    case.comm.check()
    return out


def run_one(comm: Any, virtual: bool, shape: sweep.Shape, rank: int, dev: torch.device, a: Any,
            sync: Callable[[], None] | None, ar_us: dict[tuple[Any, ...], float]) -> dict[str, Any]:
    gen = torch.Generator(device=dev).manual_seed(1000 * shape.tokens + shape.hidden + 7 * shape.ranks)  # same on every rank
    case = Case(comm, virtual, shape, dev, gen)
    checks = check(case, gen, shape.ranks, rank, a.ab)
    nbytes = shape.tokens * shape.row_bytes * (shape.ranks if virtual else 1)
    calls = calls_for(nbytes, a.calls)

    def timed(fn: Callable[[int], None]) -> float:
        t = time_calls(fn, calls=calls, replays=a.replays, warmup=1, eager=1, sync=sync, device=dev)
        return slowest_rank(t.stats.median)

    rows: dict[str, Callable[[int], None]] = {"fused_ll": case.fused("oneshot_ll"),
                                              "fused_sentinel": case.fused("oneshot_sentinel"),
                                              "unfused": case.fused("unfused"), "ar": case.all_reduce,
                                              "ar+compiled": case.ar_norm, "epilogue": case.epilogue,
                                              "compiled_norm": case.norm}
    plain_key = (shape.ranks, shape.dtype, shape.tokens, shape.hidden)
    if shape.fp8 and plain_key in ar_us:  # the AllReduce is the same with or without the copy
        del rows["ar"]
    us = {name: timed(fn) for name, fn in rows.items()}
    us["ar"] = us.get("ar", ar_us.get(plain_key))
    ar_us.setdefault(plain_key, us["ar"])
    pick = comm.selected_rmsnorm_algorithm(shape.tokens * shape.row_bytes, getattr(torch, shape.dtype), shape.tokens)
    us["auto"] = us[{"oneshot_ll": "fused_ll", "oneshot_sentinel": "fused_sentinel"}.get(pick, pick)]
    row = {"ranks": shape.ranks, "dtype": shape.dtype, "fp8": shape.fp8, "tokens": shape.tokens,
           "hidden": shape.hidden, "row_bytes": shape.row_bytes, "calls_per_graph": calls,
           "us": {n: us.get(n) for n in sweep.NAMES}, "auto_pick": pick, "checks": checks}
    if a.ab:
        extra = {f"fused_{algo.removeprefix('oneshot_')}": case.fused(algo) for algo in AB_FUSED}
        extra.update({name: case.epilogue_variant(v) for name, v in AB_VARIANTS.items()})
        row["ab"] = {name: timed(fn) for name, fn in extra.items()}
    return row


def format_ab(row: dict[str, Any]) -> str:
    """--ab's line of one shape: each fused row's µs and distance to ar, the margin of the best fused
    row that passed its check under ar+compiled, each epilogue build against the compiled norm;
    FAIL where a check failed."""
    us, ab, checks = row["us"], row["ab"], row["checks"]
    ar, arc, cn = us.get("ar"), us.get("ar+compiled"), us.get("compiled_norm")
    fused = {"fused_ll": us.get("fused_ll"), "fused_sentinel": us.get("fused_sentinel"),
             **{k: v for k, v in ab.items() if k.startswith("fused_")}}
    check_of = {"fused_ll": checks.get("oneshot_ll", ""), "fused_sentinel": checks.get("oneshot_sentinel", ""),
                **{f"fused_{a.removeprefix('oneshot_')}": checks.get(a, "") for a in AB_FUSED}}
    passed = {name: str(check_of.get(name, "")).startswith("bitwise ok") for name in fused}
    parts = []
    for name, t in fused.items():
        bad = "" if passed[name] else " FAIL"
        parts.append(f"{name} {t:.2f} (+{t - ar:.2f} ar){bad}" if t is not None and ar is not None else f"{name} -")
    best = min((t for name, t in fused.items() if t is not None and passed[name]), default=None)
    if best is not None and arc is not None:
        parts.append(f"ar+compiled - best fused = {arc - best:.2f}")
    epi = [("epilogue", us.get("epilogue"))] + [(k, v) for k, v in ab.items() if k.startswith("epi_")]
    for name, t in epi:
        bad = "" if str(checks.get(name, "bitwise ok")).startswith("bitwise ok") else " FAIL"
        parts.append(f"{name} {t:.2f} ({t / cn:.2f}x cn){bad}" if t is not None and cn else f"{name} -")
    return "   ab: " + "; ".join(parts)


def rules_only(a: Any) -> int:
    doc = results.read_json(a.rules_from)
    for path in sweep.write_tables(doc, a.tables_from, a.write_tables):
        print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    a = sweep.parse_args(argv, __doc__.split("\n\n")[0])
    if a.rules_from:
        return rules_only(a)
    if a.row_lines is not None:
        rmsnorm.ROW_LINES_PER_BLOCK = a.row_lines  # read by every geometry (the kernel's and the reference's)
    env.apply_safety_env()
    dist_info = env.dist_info()
    dev = torch.device("cuda", dist_info.local_rank if dist_info else 0)
    torch.cuda.set_device(dev)
    t0 = time.monotonic()
    sync: Callable[[], None] | None = None
    if dist_info:
        import torch.distributed as dist

        dist.init_process_group("nccl", device_id=dev)
        rank, world = dist.get_rank(), dist.get_world_size()
        comms = {world: sollat.Communicator()}
        sync = dist.barrier
    else:
        rank = 0
        comms = {r: sollat.VirtualCommunicator(r, dev) for r in a.ranks}
        world = max(comms)
    shapes = sweep.plan_shapes(comms, a.dtypes, a.fp8, a.hidden, a.rows)
    floor = measure_floor(dev, calls=a.calls, replays=a.replays, sync=sync).stats.median
    meta = env.collect_meta(tool="scripts/rmsnorm_bench.py", mode="distributed" if dist_info else "virtual",
                            ranks=sorted(comms), world_size=world, commit=a.commit, args=vars(a))
    meta["command"] = " ".join(["python3", "scripts/rmsnorm_bench.py", *(sys.argv[1:] if argv is None else argv)])
    if rank == 0:
        print(f"# {len(shapes)} shapes on {meta['card']}, {meta['mode']} ranks {sorted(comms)}; floor {floor:.2f} us; "
              f"µs per step (median of {a.replays} graph replays)\n{sweep.header()}", flush=True)
    done: list[dict[str, Any]] = []
    ar_us: dict[tuple[Any, ...], float] = {}
    for k, shape in enumerate(shapes):
        if a.budget_s and time.monotonic() - t0 > a.budget_s:
            if rank == 0:
                print(f"budget of {a.budget_s:.0f} s spent: {len(shapes) - k} of {len(shapes)} shapes not run")
            break
        done.append(run_one(comms[shape.ranks], not dist_info, shape, rank, dev, a, sync, ar_us))
        trim_memory()
        if rank == 0:
            print(f"{sweep.format_row(done[-1])}  [{k + 1}/{len(shapes)} {time.monotonic() - t0:.0f} s]", flush=True)
            if a.ab:
                print(format_ab(done[-1]), flush=True)
            if a.into:
                sweep.write_report(a.into, sweep.report(meta, floor, done, len(shapes), time.monotonic() - t0))
    if rank == 0:
        doc = sweep.report(meta, floor, done, len(shapes), time.monotonic() - t0)
        if a.into:
            print(f"wrote {sweep.write_report(a.into, doc)}")
        if a.write_tables and not dist_info:
            for path in sweep.write_tables(doc, a.tables_from, a.write_tables):
                print(f"wrote {path}")
        s = doc["summary"]
        print(f"{s['shapes']} of {len(shapes)} shapes in {time.monotonic() - t0:.0f} s; auto meets its target at "
              f"{s['auto_meets_target']}, is not slower than ar+compiled at {s['auto_not_slower']}; the epilogue "
              f"is within 1.1x of the compiled norm at {s['epilogue_within_1.1x']}; failed checks: "
              f"{len(s['failed_checks'])} {s['failed_checks'][:5]}")
    if dist_info:
        import torch.distributed as dist

        dist.destroy_process_group()
    return 0


def trim_memory() -> None:
    """Give cached blocks back once a run of large shapes has reserved much (finished cases hold none)."""
    if torch.cuda.memory_reserved() > (24 << 30):
        torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
