"""Distributed conjugate gradients on the 3-D Poisson equation, with NCCL or sollat dot products.

    torchrun --nproc-per-node 4 -m sollat.apps.cg --grid 256 --backends nccl,sollat
    python -m sollat.apps.cg --virtual-ranks 4 --grid 64 --check-single-rank

Every iteration has two AllReduces of ``nrhs`` numbers (8 to 64 bytes in fp64 for 1 to 8 systems) on
its critical path. Each backend solves the same problem from the same start; the report gives the
time to solution, the time per iteration, and how the residual histories of the backends compare.
See docs/apps.md and :mod:`sollat.apps.poisson` for the method. The command line is ``cg_args.py``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .backends import AllReduceBackend, make_backend, setup_device, teardown
from .cg_args import DEFAULT_GRID, DTYPES, HISTORY_TOL, CGArgs, build_parser, parse_args
from .poisson import DistHalo, PoissonCG, VirtualHalo

__all__ = ["DEFAULT_GRID", "DTYPES", "HISTORY_TOL", "BackendRun", "CGArgs", "Solve", "Solver", "build_parser",
           "compare_histories", "main", "parse_args", "run"]

# Seconds between progress lines of a running solve.
PROGRESS_EVERY_S = 10.0


# --------------------------------------------------------------------------------------------------
# Solving

ProgressFn = Callable[[int, float], None]


class Progress:
    """A ``ProgressFn`` that prints where a solve is, at most once per ``every_s`` seconds, so a long
    solve shows it is moving (the first line after ``every_s``: short solves print nothing)."""

    def __init__(self, say: Callable[[str], None], label: str, *, every_s: float = PROGRESS_EVERY_S,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.say, self.label, self.every_s, self.clock = say, label, every_s, clock
        self.t0 = self.last = clock()

    def __call__(self, iterations: int, residual: float) -> None:
        now = self.clock()
        if now - self.last >= self.every_s:
            self.last = now
            self.say(f"    {self.label}: {iterations} iterations, max |r|/|r0| {residual:.2e}, "
                     f"{now - self.t0:.0f} s")


@dataclass
class Solve:
    iterations: int  # first iteration with every |r|/|r0| < tol (0 if not reached)
    iterations_run: int  # including those after convergence inside the last chunk
    seconds: float  # wall clock from the first iteration to the host seeing convergence
    iter_ms: list[float] = field(default_factory=list)  # per chunk, ms per iteration (CUDA events)
    residuals: torch.Tensor | None = None  # [iterations_run, nrhs] |r|/|r0|, fp64 on the CPU


class Solver:
    """Runs CG iterations of ``problem`` through ``backend`` in chunks, eagerly or as CUDA-graph replays."""

    def __init__(self, problem: PoissonCG, backend: AllReduceBackend, *, chunk: int, use_graph: bool) -> None:
        self.problem, self.backend, self.chunk = problem, backend, chunk
        self.graph: torch.cuda.CUDAGraph | None = None
        problem.reset(backend)
        with backend.tracing() as calls:
            if use_graph:
                dev = problem.device
                side = torch.cuda.Stream(dev)
                side.wait_stream(torch.cuda.current_stream(dev))
                with torch.cuda.stream(side):
                    for _ in range(2):
                        problem.iterate(backend)
                torch.cuda.current_stream(dev).wait_stream(side)
                problem.reset(backend)
                calls.clear()
                self.graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.graph):
                    for _ in range(chunk):
                        problem.iterate(backend)
            else:
                problem.iterate(backend)
        self.calls_per_iteration = calls[:len(calls) // (chunk if use_graph else 1)]

    def run_chunk(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            for _ in range(self.chunk):
                self.problem.iterate(self.backend)

    def timed_chunk(self) -> float:
        """Run one chunk; milliseconds per iteration (CUDA events on a GPU, wall clock on the CPU)."""
        from sollat.bench.timing import event_times_ms

        return event_times_ms(self.run_chunk, 1, self.problem.device)[0] / self.chunk

    def solve(self, tol: float, max_iters: int, progress: ProgressFn | None = None) -> Solve:
        """Iterate until every ``|r|/|r0| < tol`` or ``max_iters``; ``progress(iterations, max |r|/|r0|)``
        is called after every chunk."""
        p = self.problem
        if max_iters + self.chunk > p.capacity:
            raise ValueError(f"cg: history holds {p.capacity} iterations; max_iters + chunk is larger")
        p.reset(self.backend)
        if p.device.type == "cuda":
            torch.cuda.synchronize(p.device)
        iter_ms: list[float] = []
        done, it = 0, 0
        t0 = time.perf_counter()
        while it < max_iters:
            iter_ms.append(self.timed_chunk())
            rel = (p.history[it:it + self.chunk] / p.rr0).sqrt().amax(dim=1)
            below = (rel < tol).nonzero()
            it += self.chunk
            if progress is not None:
                progress(it, float(rel[-1]))
            if below.numel():
                done = it - self.chunk + int(below[0]) + 1
                break
        seconds = time.perf_counter() - t0
        residuals = (p.history[:it] / p.rr0).sqrt().double().cpu()
        return Solve(iterations=done, iterations_run=it, seconds=seconds, iter_ms=iter_ms, residuals=residuals)


def compare_histories(base: torch.Tensor, other: torch.Tensor, upto: int) -> tuple[float, bool]:
    """Largest relative difference of two ``|r|/|r0|`` histories over the first ``upto`` iterations, and bitwise."""
    a, b = base[:upto], other[:upto]
    if a.shape != b.shape:
        return float("inf"), False
    rel = ((a - b).abs() / a.abs().clamp_min(torch.finfo(a.dtype).tiny)).max().item() if upto else 0.0
    return rel, torch.equal(a, b)


# --------------------------------------------------------------------------------------------------
# Main


def _setup_device(args: CGArgs) -> tuple[torch.device, int]:
    device = setup_device(args.distributed, args.device, "cg")
    if args.distributed:
        import torch.distributed as dist

        return device, dist.get_rank()
    return device, 0


@dataclass
class BackendRun:
    name: str
    rank_order: bool
    algorithms: list[str]
    solves: list[Solve]
    noop_iter_ms: float | None = None

    @property
    def best(self) -> Solve:
        return sorted(self.solves, key=lambda s: s.seconds)[len(self.solves) // 2]  # the median solve


def run(args: CGArgs) -> dict[str, Any]:
    device, rank = _setup_device(args)

    def say(line: str) -> None:
        if rank == 0:
            print(line, flush=True)

    ranks = (rank,) if args.distributed else tuple(range(args.world_size))
    capacity = args.max_iters + 2 * args.chunk
    halo = (DistHalo(args.halo, rank, args.world_size, (args.nrhs, args.grid + 2, args.grid + 2),
                     device=device, dtype=args.dtype) if args.distributed else VirtualHalo())
    problem = PoissonCG(args.grid, args.nrhs, world_size=args.world_size, ranks=ranks, device=device,
                        dtype=args.dtype, seed=args.seed, capacity=capacity, halo=halo)
    es = torch.empty((), dtype=args.dtype).element_size()
    mode = (f"torchrun, {args.world_size} GPUs, halo {args.halo}" if args.distributed
            else f"{args.world_size} virtual rank(s) on {device}")
    say(f"3-D Poisson, {args.grid}^3 unknowns x {args.nrhs} system(s), {str(args.dtype).replace('torch.', '')}; "
        f"{mode}; z-slabs {[z1 - z0 for z0, z1 in problem.slabs]}")
    say(f"stop at |r|/|r0| < {args.tol:g} (at most {args.max_iters} iterations); "
        f"{'CUDA graph of ' + str(args.chunk) + ' iterations per replay' if args.graph else 'eager'}")

    reference: Solve | None = None
    if args.check_single_rank:
        single = PoissonCG(args.grid, args.nrhs, world_size=1, ranks=(0,), device=device, dtype=args.dtype,
                           seed=args.seed, capacity=capacity)
        solver = Solver(single, make_backend("noop", world_size=1, device=device, distributed=False),
                        chunk=args.chunk, use_graph=args.graph)
        reference = solver.solve(args.tol, args.max_iters, Progress(say, "single-rank reference"))
        say(f"single-rank reference: {reference.iterations} iterations")
        del solver, single

    noop_ms: float | None = None
    if args.world_size > 1:
        noop = make_backend("noop", world_size=args.world_size, device=device, distributed=args.distributed)
        solver = Solver(problem, noop, chunk=args.chunk, use_graph=args.graph)
        times = []
        for _ in range(max(3, args.repeats)):
            problem.reset(noop)
            t0 = _now(device)
            solver.run_chunk()
            times.append((_now(device) - t0) * 1e3 / args.chunk)
        noop_ms = statistics.median(times)
        del solver

    runs: list[BackendRun] = []
    for spec in args.backends:
        backend = make_backend(spec, world_size=args.world_size, device=device, distributed=args.distributed)
        solver = Solver(problem, backend, chunk=args.chunk, use_graph=args.graph)
        solver.solve(args.tol, args.max_iters, Progress(say, f"{backend.name} warm-up solve"))
        solves = [solver.solve(args.tol, args.max_iters,
                               Progress(say, f"{backend.name} solve {i + 1}/{args.repeats}"))
                  for i in range(args.repeats)]
        calls = solver.calls_per_iteration
        err = problem.relative_error(backend).max().item()
        run_ = BackendRun(backend.name, backend.rank_order_for(calls), [backend.algorithm_for(c) for c in calls],
                          solves, noop_ms)
        runs.append(run_)
        say(f"  {backend.name}: {len(calls)} AllReduces per iteration of "
            f"{', '.join(sorted({f'{c.nbytes} B [{a}]' for c, a in zip(calls, run_.algorithms, strict=True)}))}; "
            f"|x - u*|/|u*| = {err:.2e}")
        del solver, backend
    report = _report(args, say, runs, reference, es)
    if args.json_path and rank == 0:
        with open(args.json_path, "w") as f:
            json.dump(report, f, indent=2)
    return report


def _now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _report(args: CGArgs, say: Callable[[str], None], runs: list[BackendRun], reference: Solve | None,
            es: int) -> dict[str, Any]:
    say(f"\n{'backend':<24}{'iters':>7}{'to solution ms':>16}{'us/iter p50':>13}{'AR share':>10}")
    out: dict[str, Any] = {"config": {k: (str(v) if isinstance(v, torch.dtype) else v)
                                      for k, v in asdict(args).items() if k != "backends"},
                           "backends": [s.label for s in args.backends], "message_bytes": args.nrhs * es,
                           "results": {}, "checks": {}}
    for r in runs:
        s = r.best
        per_iter = statistics.median(x for sv in r.solves for x in sv.iter_ms)
        share = None if r.noop_iter_ms is None else max(0.0, (per_iter - r.noop_iter_ms) / per_iter)
        say(f"{r.name:<24}{s.iterations:>7}{s.seconds * 1e3:>16.2f}{per_iter * 1e3:>13.2f}"
            f"{'-' if share is None else f'{share:.1%}':>10}")
        out["results"][r.name] = {"iterations": s.iterations, "iterations_run": s.iterations_run,
                                  "time_to_solution_s": [sv.seconds for sv in r.solves],
                                  "us_per_iteration_p50": per_iter * 1e3, "ar_share": share,
                                  "rank_order": r.rank_order, "algorithms": r.algorithms}
    if runs and runs[0].noop_iter_ms is not None:
        say(f"iteration without AllReduce (noop backend): {runs[0].noop_iter_ms * 1e3:.2f} us; "
            f"AR share = 1 - that / us per iteration")
    ok = all(r.best.iterations > 0 for r in runs)
    base_name, base = ("single rank", reference) if reference is not None else (
        (runs[0].name, runs[0].best) if runs else ("", None))
    if base is not None and base.residuals is not None:
        say(f"\nresidual histories vs {base_name} (relative tolerance {args.history_tol:g}):")
        for r in runs:
            s = r.best
            assert s.residuals is not None
            upto = max(base.iterations, s.iterations)
            rel, bitwise = compare_histories(base.residuals, s.residuals, upto)
            first = runs[0]
            vs_first = None if r is first else compare_histories(first.best.residuals, s.residuals,  # type: ignore[arg-type]
                                                                 upto)[1]
            expect = r is not first and first.rank_order and r.rank_order
            line_ok = s.iterations == base.iterations and rel <= args.history_tol and (vs_first or not expect)
            ok = ok and line_ok
            extra = "" if vs_first is None else (f"; bitwise equal to {first.name}: {'yes' if vs_first else 'no'}"
                                                 f"{' (expected)' if expect else ' (not required)'}")
            say(f"  {r.name:<22} iterations {s.iterations} vs {base.iterations}; max rel diff {rel:.3g}"
                f"{'; bitwise' if bitwise else ''}{extra}  {'ok' if line_ok else 'FAILED'}")
            out["checks"][r.name] = {"iterations": s.iterations, "base_iterations": base.iterations,
                                     "max_rel_diff": rel, "bitwise_vs_base": bitwise,
                                     "bitwise_vs_first": vs_first, "bitwise_expected": expect, "ok": line_ok}
    out["ok"] = ok
    say("\nresult: " + ("ok" if ok else "CHECK FAILED"))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        report = run(args)
    finally:
        teardown(args.distributed)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
