"""The measurement verbs of ``python -m sollat``: ``bench``, ``sol``, ``barrier`` and ``plot DIR``.

One command per measurement; each works with virtual ranks on one GPU in a single process and,
unchanged, under ``torchrun --nproc-per-node N`` (one GPU per process). Results land in a
timestamped folder under ``--out`` (default ``results/``), or exactly in ``--into DIR``.
``python -m sollat.bench`` is the same command line as ``python -m sollat`` (one list of verbs:
``sollat.cli_args.VERBS``); the dispatcher ``sollat.cli`` imports this module, never the reverse.
See docs/measurement.md for the method and for how to reproduce every figure.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import cli_args as top
from ..cli_args import nonneg_int, positive_float, positive_int
from ..layout import MAX_RANKS
from .sizes import DEFAULT_SIZES, QUICK_SIZES, parse_int_list, parse_sizes

SUBCOMMANDS = top.BENCH_VERBS
DEFAULT_RANKS = "2,4,8"


def _ranks(lo: int, hi: int | None) -> Callable[[str], str]:
    """Argument type: a rank list (``2,4,8`` or ``2:8``) within lo..hi, kept as text."""
    def parse(text: str) -> str:
        try:
            ranks = parse_int_list(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if any(r < lo or (hi is not None and r > hi) for r in ranks):
            bounds = f"{lo}..{hi}" if hi is not None else f"at least {lo}"
            raise argparse.ArgumentTypeError(f"rank counts must be {bounds}, got {text!r}")
        return text
    return parse


def _folder(text: str) -> str:
    """Argument type: an existing folder, kept as text."""
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"there is no folder {text!r}")
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file, not a result folder")
    return text


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="results", help="parent folder of the timestamped result folder (default: results)")
    p.add_argument("--into", default=None, help="write into exactly this folder instead of a new timestamped one")
    p.add_argument("--device", type=nonneg_int, default=0, help="GPU index in virtual mode (default 0)")
    p.add_argument("--commit", default=None, help="commit to name in titles (default: git, else $SOLLAT_COMMIT)")
    p.add_argument("--quick", action="store_true", help="fewer sizes/repeats: about a minute")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--timeout", type=positive_float, default=5.0, help="seconds before any device spin gives up (default 5)")


def build_parser() -> argparse.ArgumentParser:
    parser = top.Parser(prog=top.PROG, description="sollat measurement verbs (all verbs: python -m sollat --help)")
    sub = parser.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("sol", help=top.VERBS["sol"])
    _common(p)
    p.add_argument("--repeats", type=positive_int, default=None, help="launches per figure (default 9, quick 5)")
    p.add_argument("--single-gpu", action="store_true", help="SM-to-SM ping-pong even when two GPUs are visible")
    p.add_argument("--peer", type=nonneg_int, default=None, help="GPU for the GPU-to-GPU ping-pong (default: next one)")

    p = sub.add_parser("barrier", help=top.VERBS["barrier"])
    _common(p)
    p.add_argument("--ranks", type=_ranks(2, None), default=None,
                   help="rank counts (default 2,4,8,16,32,64; quick 2..32; torchrun: 2,4..N)")
    p.add_argument("--iters", type=positive_int, default=None, help="barriers per launch (default 1000, quick 500)")
    p.add_argument("--repeats", type=positive_int, default=None, help="launches per figure (default 7, quick 5)")

    p = sub.add_parser("bench", help=top.VERBS["bench"])
    _common(p)
    p.add_argument("--sizes", default=None,
                   help=f"message sizes per rank: LO:HI[:FACTOR] and/or a comma list (default {DEFAULT_SIZES}, "
                        f"quick {QUICK_SIZES})")
    p.add_argument("--ranks", type=_ranks(2, MAX_RANKS), default=DEFAULT_RANKS,
                   help="virtual rank counts (default 2,4,8; ignored under torchrun)")
    p.add_argument("--one-gpu", action="store_true",
                   help="virtual ranks on one GPU even when several GPUs are visible (default: one process per GPU)")
    p.add_argument("--dtypes", default="float32,bfloat16", help="element types (default float32,bfloat16)")
    p.add_argument("--algos", default="all", help="sollat algorithms, comma list, 'auto' included (default all)")
    p.add_argument("--peers", default="all",
                   help="peers: all, none, or a comma list (nccl, nccl-ring-ll, ..., nccl-window, torch-symm)")
    p.add_argument("--replays", type=positive_int, default=None, help="timed graph replays per row (default 30, quick 7)")
    p.add_argument("--calls", type=positive_int, default=None, help="calls per graph up to 256 KiB (default 100, quick 50)")
    p.add_argument("--barrier", action="store_true", help="also run the barrier sweep into the same folder")
    p.add_argument("--no-sol", action="store_true", help="skip the SoL probe (the table then has no SoL)")
    p.add_argument("--no-check", action="store_true", help="skip the correctness check of the timed outputs")
    p.add_argument("--no-plots", action="store_true", help="write no figures")
    p.add_argument("--child-timeout", type=positive_float, default=None, help="seconds per peer child (default 600, quick 150)")

    p = sub.add_parser("plot", help=top.VERBS["plot"])
    p.add_argument("dir", type=_folder, help="a result folder with bench.json and/or barrier.json")
    return parser


@dataclass
class BenchPlan:
    """``bench`` arguments with the ``--quick`` defaults applied."""

    sizes: list[int]
    ranks: list[int]
    dtypes: list[str]
    algos: list[str] | None
    peers: list[Any]
    replays: int
    warmup: int
    max_calls: int
    sol_repeats: int
    barrier_ranks: list[int]
    barrier_iters: int
    barrier_repeats: int
    child_timeout: float
    check: bool


def known_algos() -> list[str]:
    """What ``bench --algos`` accepts: every sollat algorithm, ``auto``, and ``auto_symm`` (auto in
    place on symmetric memory, real ranks only)."""
    from ..algorithms import ALGORITHMS
    from .sweep import AUTO_SYMM

    return [*ALGORITHMS, "auto", AUTO_SYMM]


def plan_bench(a: argparse.Namespace) -> BenchPlan:
    from .barrier import DEFAULT_RANKS as B_RANKS
    from .barrier import QUICK_RANKS as B_QUICK
    from .peers import select_peers
    from .sweep import DTYPES

    dtypes = []
    for d in a.dtypes.split(","):
        d = d.strip()
        if d not in DTYPES:
            raise ValueError(f"unknown dtype {d!r}; use float32, bfloat16 or float16")
        dtypes.append(DTYPES[d])
    algos = None if a.algos in ("all", "") else [x.strip() for x in a.algos.split(",") if x.strip()]
    known = known_algos()
    unknown = [x for x in algos or () if x not in known]
    if unknown:
        raise ValueError(f"unknown algorithm {unknown[0]!r} in --algos; known: {', '.join(known)} "
                         "(auto_symm: under torchrun only), or all")
    return BenchPlan(
        sizes=parse_sizes(a.sizes or (QUICK_SIZES if a.quick else DEFAULT_SIZES)),
        ranks=parse_int_list(a.ranks),
        dtypes=dtypes,
        algos=algos,
        peers=select_peers(a.peers),
        replays=a.replays or (7 if a.quick else 30),
        warmup=1 if a.quick else 3,
        max_calls=a.calls or (50 if a.quick else 100),
        sol_repeats=5 if a.quick else 9,
        barrier_ranks=B_QUICK if a.quick else B_RANKS,
        barrier_iters=500 if a.quick else 1000,
        barrier_repeats=5 if a.quick else 7,
        child_timeout=a.child_timeout or (150.0 if a.quick else 600.0),
        check=not a.no_check,
    )


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
    print(f"{top.PROG} {verb}: error: nothing could be measured: {why}", file=sys.stderr)
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
        print(f"{top.PROG} plot: error: {exc}", file=sys.stderr)
        return 1
    if not paths:
        print(f"{top.PROG} plot: error: no bench.json or barrier.json in {a.dir}", file=sys.stderr)
        return 1
    for p in paths:
        print(p)
    return 0


def _gpus_to_spread_over(a: argparse.Namespace) -> int:
    """The main job on a machine with several GPUs measures them (one process each), unless it
    already runs under torchrun or ``--one-gpu`` asks for virtual ranks on one GPU."""
    import torch

    from .env import dist_info

    if a.one_gpu or dist_info() is not None:
        return 0
    n = torch.cuda.device_count()
    return n if n >= 2 else 0


def _spawn(cmd: list[str], env: dict[str, str]) -> int:
    import subprocess

    return subprocess.call(cmd, env=env)


def relaunch_under_torchrun(argv: list[str], n: int) -> int:
    """Runs ``python -m sollat <argv>`` once per GPU under torchrun (the safety variables set)
    and returns its exit status; the first line printed says exactly what runs."""
    from .env import SAFETY_ENV

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
           "-m", "sollat", *argv]
    print(f"sollat bench: {n} GPUs visible, so the main job runs one process per GPU: "
          f"{' '.join(cmd[1:])}   (--one-gpu: virtual ranks on GPU 0 instead)", flush=True)
    return int(_spawn(cmd, {**os.environ, **SAFETY_ENV}))


def main(argv: list[str] | None = None) -> int:
    """Entry point of the measurement verbs: ``main(["bench", "--quick"])``; returns the exit status.

    The dispatcher (``sollat.cli.main``, also ``python -m sollat.bench``) hands these verbs here;
    anything else (another verb, ``--help``) gets this parser's answer."""
    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(argv)
    if a.cmd == "plot":
        return cmd_plot(a)
    if a.cmd == "bench":
        try:
            plan_bench(a)  # argument errors first, with or without a GPU
        except ValueError as exc:
            print(f"{top.PROG} bench: error: {exc}", file=sys.stderr)
            return 2
    from .env import NO_GPU_MESSAGE, gpu_available

    if not gpu_available():
        if a.cmd != "bench":
            return _nothing_measured(a.cmd, "no CUDA GPU is present (torch.cuda.is_available() is False); "
                                            f"the protocols can be checked on the CPU: {top.PROG} model --demo")
        # the main job (README's first command) shows what runs without a GPU, and succeeds
        from ..model import cli as model_cli

        print(NO_GPU_MESSAGE.format(cmd=a.cmd))
        print("\nRunning the CPU protocol demo now (python -m sollat model --demo):\n", flush=True)
        return model_cli.main(["--demo"])
    if a.cmd == "bench":
        n = _gpus_to_spread_over(a)
        if n:
            return relaunch_under_torchrun(argv, n)
        return cmd_bench(a)
    if a.cmd == "sol":
        return cmd_sol(a)
    return cmd_barrier(a)


if __name__ == "__main__":
    sys.exit(main())
