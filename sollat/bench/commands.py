"""What the measurement verbs do once their arguments are parsed (``cli.py``): ``cmd_sol``,
``cmd_barrier``, ``cmd_bench`` and ``cmd_plot``, and the session (GPU, torchrun placement, result
folder, metadata) they share. GPU-side modules are imported inside the functions."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..cli_args import PROG
from .plan import plan_bench
from .sizes import parse_int_list

# ---- shared plumbing ------------------------------------------------------------------------

class _Session:
    """GPU, torchrun placement, result folder and metadata of one command."""

    def __init__(self, a: argparse.Namespace, tool: str, ranks: list[int]) -> None:
        import torch

        from .env import apply_safety_env, collect_meta, dist_info

        apply_safety_env()
        self.info = dist_info()
        if self.info is not None:
            import torch.distributed as dist

            dev = torch.device("cuda", self.info.local_rank)
            torch.cuda.set_device(dev)
            if not dist.is_initialized():
                dist.init_process_group("nccl", device_id=dev)
            self.device_index = self.info.local_rank
            ranks = [self.info.world_size]
        else:
            self.device_index = a.device
            torch.cuda.set_device(self.device_index)
        self.device = torch.device("cuda", self.device_index)
        self.root = self.info is None or self.info.rank == 0
        self.mode = "virtual" if self.info is None else "distributed"
        self.meta = collect_meta(tool=tool, mode=self.mode, ranks=ranks,
                                 world_size=1 if self.info is None else self.info.world_size, commit=a.commit,
                                 args=vars(a), device_index=self.device_index)
        self.meta["quick"] = bool(getattr(a, "quick", False))
        self._record_commit()
        self.show_progress = not a.no_progress and self.root
        self.run_dir: Path | None = None
        if self.root:
            from .results import make_run_dir

            if a.into:
                self.run_dir = Path(a.into)
                self.run_dir.mkdir(parents=True, exist_ok=True)
            else:
                self.run_dir = make_run_dir(a.out, card=self.meta["card"], tag=tool)

    def _record_commit(self) -> None:
        from .results import commit_fields

        self.meta.update(commit_fields(self.meta.get("commit")))
        if self.meta["dirty"] and self.root:
            print(f"sollat: the checkout has uncommitted changes: the results record commit {self.meta['commit']} "
                  "with dirty: true, and their titles say +dirty", file=sys.stderr)

    def barrier(self) -> None:
        if self.info is not None:
            import torch.distributed as dist

            dist.barrier()

    def broadcast(self, obj: Any) -> Any:
        if self.info is None:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def close(self) -> None:
        if self.info is not None:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.barrier()
                dist.destroy_process_group()


def _progress(session: _Session, total: int, desc: str) -> Any:
    from .progress import Progress

    return Progress(total, desc, enabled=session.show_progress)


def _run_sol(session: _Session, a: argparse.Namespace, repeats: int) -> dict[str, Any] | None:
    from .sol import run_sol

    res = None
    # The bench's virtual ranks share one GPU: its SoL is the one-GPU (SM-to-SM) figure.
    single = getattr(a, "single_gpu", False) or (a.cmd == "bench" and session.info is None)
    if session.root:
        with _progress(session, 5, "sol") as prog:
            res = run_sol(session.device_index, repeats=repeats, timeout_s=a.timeout, single_gpu=single,
                          peer=getattr(a, "peer", None), progress=prog)
    return session.broadcast(res)


def _floor(session: _Session, calls: int, replays: int) -> dict[str, Any]:
    from .timing import floor_record

    rec = floor_record(session.device, calls=calls, replays=replays, sync=session.barrier if session.info else None)
    return session.broadcast(rec)


def _run_barrier(session: _Session, ranks: list[int], iters: int, repeats: int, timeout: float,
                 floor_us: float | None) -> list[Any]:
    from .barrier import VARIANTS, barrier_distributed, barrier_virtual

    if session.info is None:
        with _progress(session, len(ranks) * len(VARIANTS), "barrier") as prog:
            return barrier_virtual(session.device_index, ranks, iters=iters, repeats=repeats, floor_us=floor_us,
                                   timeout_s=timeout, progress=prog)
    sizes = sorted({n for n in ranks if n <= session.info.world_size} | {session.info.world_size})
    with _progress(session, len(sizes) * len(VARIANTS), "barrier") as prog:
        return barrier_distributed(session.info, sizes, iters=iters, repeats=repeats, floor_us=floor_us,
                                   timeout_s=max(timeout, 10.0), progress=prog)


def _write_barrier(session: _Session, rows: list[Any], floor: dict[str, Any], plots: bool) -> str:
    from .results import write_barrier_csv, write_json
    from .table import format_barrier

    assert session.run_dir is not None
    meta = dict(session.meta)
    meta["ranks"] = sorted({r.ranks for r in rows})
    write_json(session.run_dir / "barrier.json", {"meta": meta, "floor": floor, "rows": rows})
    write_barrier_csv(session.run_dir / "barrier.csv", rows, meta=meta)
    text = format_barrier(meta, rows, floor.get("median_us"))
    (session.run_dir / "barrier.txt").write_text(text)
    if plots:
        from .plots import plot_barrier

        _draw(lambda: plot_barrier(meta, rows, session.run_dir / "barrier", floor.get("median_us")))
    return text


def _draw(plot: Callable[[], Any]) -> None:
    """Draw figures; without matplotlib (the bench extra) say so in one line and go on: the
    result files are written already, and ``plot DIR`` draws them later."""
    from .plots import MatplotlibMissingError

    try:
        plot()
    except MatplotlibMissingError as exc:
        print(f"sollat: no figures drawn: {exc}", file=sys.stderr)


def _nothing_measured(verb: str, why: str) -> int:
    print(f"{PROG} {verb}: error: nothing could be measured: {why}", file=sys.stderr)
    return 1


# ---- subcommands ----------------------------------------------------------------------------

def cmd_sol(a: argparse.Namespace) -> int:
    from .results import write_json
    from .sol import sol_failures
    from .table import format_sol

    session = _Session(a, "sol", [])
    try:
        res = _run_sol(session, a, a.repeats or (5 if a.quick else 9))
        if session.root and res is not None and session.run_dir is not None:
            write_json(session.run_dir / "sol.json", {"meta": session.meta, "sol": res})
            text = format_sol(res)
            (session.run_dir / "sol.txt").write_text(text)
            print(text, end="")
            print(f"results: {session.run_dir}")
    finally:
        session.close()
    if res is None or res.get("sol_ns") is None:  # every rank has the root's result (broadcast)
        return _nothing_measured("sol", "no SoL figure; " + ("; ".join(sol_failures(res or {})) or "no result"))
    return 0


def cmd_barrier(a: argparse.Namespace) -> int:
    from .barrier import DEFAULT_RANKS as B_RANKS
    from .barrier import QUICK_RANKS as B_QUICK

    ranks = parse_int_list(a.ranks) if a.ranks else (B_QUICK if a.quick else B_RANKS)
    session = _Session(a, "barrier", ranks)
    try:
        floor = _floor(session, 50, 10 if a.quick else 30)
        rows = _run_barrier(session, ranks, a.iters or (500 if a.quick else 1000),
                            a.repeats or (5 if a.quick else 7), a.timeout, floor["median_us"])
        if session.root:
            print(_write_barrier(session, rows, floor, plots=True), end="")
            print(f"results: {session.run_dir}")
        failed = [r for r in rows if not r.ok]
        why = session.broadcast(None if len(failed) < len(rows) else
                                f"every barrier row failed or was skipped; first: {_first_reason(failed)}")
    finally:
        session.close()
    if why is not None:
        return _nothing_measured("barrier", why)
    return 0


def _first_reason(rows: list[Any]) -> str:
    """The first failure's reason (an error before a skip), for the one-line summary."""
    rows = sorted(rows, key=lambda r: r.status != "error")
    return f"{rows[0].variant} R={rows[0].ranks}: {rows[0].reason}" if rows else "no rows"


def cmd_bench(a: argparse.Namespace) -> int:
    import torch

    from .peers import Placement as _Placement
    from .peers import SubprocessRunner, make_jobs, run_jobs, torch_placement
    from .results import ERROR, Row, write_bench_csv, write_json
    from .sol import sol_us
    from .sweep import DistributedTarget, SweepConfig, VirtualTarget, algo_list, sweep_target
    from .table import format_bench

    plan = plan_bench(a)
    session = _Session(a, "bench", plan.ranks)
    try:
        session.meta.update({"dtypes": plan.dtypes, "sizes": plan.sizes, "replays": plan.replays,
                             "max_calls": plan.max_calls})
        sol = None if a.no_sol else _run_sol(session, a, plan.sol_repeats)
        floor = _floor(session, plan.max_calls, plan.replays)
        cfg = SweepConfig(plan.sizes, plan.dtypes, plan.algos, replays=plan.replays, warmup=plan.warmup,
                          max_calls=plan.max_calls, check=plan.check)
        rows: list[Row] = []

        # sollat, every algorithm plus auto
        if session.info is None:
            targets: list[tuple[int, Any]] = []
            for R in plan.ranks:
                try:
                    targets.append((R, VirtualTarget(R, session.device)))
                except Exception as exc:
                    targets.append((R, f"sollat.VirtualCommunicator(world_size={R}) failed: {type(exc).__name__}: {exc}"))
        else:
            try:
                targets = [(session.info.world_size, DistributedTarget(session.device))]
            except Exception as exc:
                targets = [(session.info.world_size, f"sollat.Communicator failed: {type(exc).__name__}: {exc}")]
        n_algos = max((len(algo_list(t, plan.algos)) for _, t in targets if not isinstance(t, str)), default=1)
        total = len(targets) * len(plan.dtypes) * len(plan.sizes) * n_algos
        gather = agree = None
        if session.info is not None:
            import torch.distributed as dist

            world = session.info.world_size

            def _all(x: Any) -> list[Any]:
                got: list[Any] = [None] * world
                dist.all_gather_object(got, x)
                return got

            def gather(per_call: list[float]) -> list[float]:
                return [max(v) for v in zip(*_all(per_call), strict=True)]  # per replay, the slowest rank

            agree = _all

        with _progress(session, total, "sollat") as prog:
            for R, t in targets:
                if isinstance(t, str):
                    rows += [Row("sollat", "all", R, dt, None, status=ERROR, reason=t) for dt in plan.dtypes]
                    continue
                remake = (lambda R=R: VirtualTarget(R, session.device)) if session.info is None else None
                rows += sweep_target(t, cfg, make_target=remake, progress=prog, gather=gather, agree=agree)
        del targets
        torch.cuda.synchronize()
        torch.cuda.empty_cache()

        # peers, each in its own child process(es)
        world = 1 if session.info is None else session.info.world_size
        jobs, skipped = make_jobs(plan.peers, world_size=world, sizes=plan.sizes, dtypes=plan.dtypes,
                                  replays=plan.replays, warmup=plan.warmup, max_calls=plan.max_calls,
                                  skip_ranks=plan.ranks if session.info is None else None)
        rows += skipped if session.root else []
        where = _Placement() if session.info is None else torch_placement()
        with _progress(session, max(1, len(jobs)), "peers") as prog:
            rows += run_jobs(jobs, SubprocessRunner(), where, timeout_s=plan.child_timeout, progress=prog)

        barrier_text = ""
        if a.barrier:
            brows = _run_barrier(session, plan.barrier_ranks, plan.barrier_iters, plan.barrier_repeats, a.timeout,
                                 floor["median_us"])
            if session.root:
                barrier_text = _write_barrier(session, brows, floor, plots=not a.no_plots)

        if session.root and session.run_dir is not None:
            s_us = sol_us(sol)
            if session.info is None:
                session.meta["notes"] = [
                    "virtual ranks: all R ranks run on one GPU and share its SMs and L2; large sizes do not "
                    "represent NVLink",
                    "torch symm_mem rows ran at world size 1 (one GPU): a reference for launch + kernel cost only",
                ]
            write_json(session.run_dir / "bench.json", {"meta": session.meta, "floor": floor, "sol": sol,
                                                        "rows": rows})
            write_bench_csv(session.run_dir / "bench.csv", rows, meta=session.meta, floor_us=floor["median_us"],
                            sol_us=s_us)
            text = format_bench(session.meta, floor["median_us"], s_us, rows)
            (session.run_dir / "bench.txt").write_text(text)
            if sol is not None:
                from .results import write_json as _wj
                from .table import format_sol

                _wj(session.run_dir / "sol.json", {"meta": session.meta, "sol": sol})
                print(format_sol(sol))
            print(text, end="")
            if barrier_text:
                print()
                print(barrier_text, end="")
            if not a.no_plots:
                from .plots import plot_latency, plot_speedup

                _draw(lambda: plot_latency(session.meta, floor["median_us"], s_us, rows, session.run_dir / "latency"))
                _draw(lambda: plot_speedup(session.meta, rows, session.run_dir / "speedup"))
            print(f"results: {session.run_dir}")
        measured = session.broadcast(any(r.ok for r in rows))
    finally:
        session.close()
    if not measured:
        return _nothing_measured("bench", "no sollat algorithm and no peer gave a time (the rows' reasons are in "
                                          "the table above)")
    return 0


def cmd_plot(a: argparse.Namespace) -> int:
    from .plots import MatplotlibMissingError, plot_dir

    try:
        paths = plot_dir(a.dir)
    except MatplotlibMissingError as exc:
        print(f"{PROG} plot: error: {exc}", file=sys.stderr)
        return 1
    if not paths:
        print(f"{PROG} plot: error: no bench.json or barrier.json in {a.dir}", file=sys.stderr)
        return 1
    for p in paths:
        print(p)
    return 0
