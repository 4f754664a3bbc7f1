"""The measurement verbs of ``python -m sollat``: ``bench``, ``sol``, ``barrier`` and ``plot DIR``.

One command per measurement; each works with virtual ranks on one GPU in a single process and,
unchanged, under ``torchrun --nproc-per-node N`` (one GPU per process). Results land in a
timestamped folder under ``--out`` (default ``results/``), or exactly in ``--into DIR``.
``python -m sollat.bench`` is the same command line as ``python -m sollat`` (one list of verbs:
``sollat.cli_args.VERBS``); the dispatcher ``sollat.cli`` imports this module, never the reverse.
This module parses the arguments and picks what runs; ``plan.py`` turns ``bench``'s arguments
into a plan and ``commands.py`` runs each verb. See docs/measurement.md for the method and for how
to reproduce every figure.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from .. import cli_args as top
from ..cli_args import nonneg_int, positive_float, positive_int
from ..device.layout import MAX_RANKS
from .commands import _nothing_measured, cmd_barrier, cmd_bench, cmd_plot, cmd_sol
from .plan import BenchPlan, known_algos, plan_bench
from .sizes import DEFAULT_SIZES, QUICK_SIZES, parse_int_list, parse_sizes

__all__ = ["DEFAULT_RANKS", "SUBCOMMANDS", "BenchPlan", "build_parser", "cmd_barrier", "cmd_bench", "cmd_plot",
           "cmd_sol", "known_algos", "main", "plan_bench", "relaunch_under_torchrun"]

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


def _sizes(text: str) -> str:
    """Argument type: a ``--sizes`` spec that parses, kept as text."""
    try:
        parse_sizes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


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
    p.add_argument("--commit", default=None, help="commit to name in titles (default: $SOLLAT_COMMIT, else git)")
    p.add_argument("--quick", action="store_true", help="fewer sizes/repeats: about a minute")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--timeout", type=positive_float, default=5.0, help="seconds before any device spin gives up (default 5)")


def build_parser() -> argparse.ArgumentParser:
    return _parsers()[0]


def _parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The command line and each verb's own parser (which reports that verb's errors)."""
    parser = top.Parser(prog=top.PROG, description="sollat measurement verbs (all verbs: python -m sollat --help)")
    sub = parser.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("sol", help=top.VERBS["sol"], description=top.VERBS["sol"])
    _common(p)
    p.add_argument("--repeats", type=positive_int, default=None, help="launches per figure (default 9, quick 5)")
    p.add_argument("--single-gpu", action="store_true", help="SM-to-SM ping-pong even when two GPUs are visible")
    p.add_argument("--peer", type=nonneg_int, default=None, help="GPU for the GPU-to-GPU ping-pong (default: next one)")

    p = sub.add_parser("barrier", help=top.VERBS["barrier"], description=top.VERBS["barrier"])
    _common(p)
    p.add_argument("--ranks", type=_ranks(2, None), default=None,
                   help="rank counts (default 2,4,8,16,32,64; quick 2..32; torchrun: 2,4..N)")
    p.add_argument("--iters", type=positive_int, default=None, help="barriers per launch (default 1000, quick 500)")
    p.add_argument("--repeats", type=positive_int, default=None, help="launches per figure (default 7, quick 5)")

    p = sub.add_parser("bench", help=top.VERBS["bench"], description=top.VERBS["bench"])
    _common(p)
    p.add_argument("--sizes", type=_sizes, default=None,
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

    p = sub.add_parser("plot", help=top.VERBS["plot"], description=top.VERBS["plot"])
    p.add_argument("dir", type=_folder, help="a result folder with bench.json and/or barrier.json")
    return parser, dict(sub.choices)


def parse(argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed; an argument no option of the verb takes is an error of that verb
    (``python -m sollat bench: error: unrecognized arguments: --bogus``), not of the command line."""
    parser, verbs = _parsers()
    a, extra = parser.parse_known_args(argv)
    if extra:
        verbs[a.cmd].error(f"unrecognized arguments: {' '.join(extra)}")
    return a


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
    a = parse(argv)
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
