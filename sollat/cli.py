"""``python -m sollat VERB``: the one command line of sollat; :data:`VERBS` is its one list of verbs.

``python -m sollat.bench VERB`` is the same command line. Argument helpers for every verb live
here too: :class:`Parser` (a bad argument is one line on stderr and exit status 2) and the
argument types :func:`positive_int`, :func:`positive_float` and :func:`nonneg_int`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NoReturn, TypeVar

PROG = "python -m sollat"

#: Every verb, in the order the help lists them, with its one-line description.
VERBS: dict[str, str] = {
    "bench": "AllReduce latency sweep against the peers (the main job; without a GPU it says so "
             "and runs the model demo)",
    "sol": "speed-of-light probe: L2 round trip, remote store, SoL (GPU)",
    "barrier": "all-to-all flag barrier latency vs rank count (GPU)",
    "plot": "re-draw the figures of a result folder: plot DIR (no GPU needed)",
    "tune": "measure every algorithm here and write the selection table (GPU)",
    "model": "protocol model and interleaving checker (CPU only; the default is a short demo)",
    "precompile": "compile every kernel instantiation into the disk cache",
    "info": "versions, GPU and arch, kernel cache",
}
BENCH_VERBS = ("bench", "sol", "barrier", "plot")
N = TypeVar("N", int, float)


def usage() -> str:
    rows = "\n".join(f"  {verb:<12}{text}" for verb, text in VERBS.items())
    return (f"usage: {PROG} VERB [options]     ({PROG} VERB --help: the options of one verb; "
            f"{PROG} --version)\n\n"
            f"verbs:\n{rows}\n\n"
            "applications (own modules): python -m sollat.apps.decode, python -m sollat.apps.cg "
            "(see docs/apps.md)\n")


class Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line on stderr (no usage block) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _checked(kind: Callable[[str], N], test: Callable[[N], bool], what: str) -> Callable[[str], N]:
    def parse(text: str) -> N:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not test(value):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value
    return parse


positive_int = _checked(int, lambda v: v >= 1, "a positive integer")
nonneg_int = _checked(int, lambda v: v >= 0, "an integer >= 0")
positive_float = _checked(float, lambda v: v > 0 and v != float("inf"), "a positive number")


def int_range(lo: int, hi: int) -> Callable[[str], int]:
    """Argument type: an integer in ``lo..hi``."""
    return _checked(int, lambda v: lo <= v <= hi, f"an integer in {lo}..{hi}")


def _arch(text: str) -> str:
    from .instantiations import check_arch

    try:
        return check_arch(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _precompile(argv: list[str]) -> int:
    import time

    from . import instantiations

    p = Parser(prog=f"{PROG} precompile", description=VERBS["precompile"])
    p.add_argument("--arch", type=_arch, default=None,
                   help=f"sm_XY (default: this GPU, or {instantiations.DEFAULT_ARCH} without one)")
    p.add_argument("-j", "--jobs", type=positive_int, default=8, help="parallel compiles (default 8)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    a = p.parse_args(argv)
    t = time.time()
    try:
        n = instantiations.precompile(a.arch, a.jobs, progress=not a.no_progress)
    except instantiations.PrecompileError as exc:
        print(f"{p.prog}: error: {exc}", file=sys.stderr)
        return 1
    arch = a.arch or _default_arch()
    print(f"sollat: {n} kernel modules for {arch} in the cache {_cache_dir()} after {time.time() - t:.1f} s "
          f"({a.jobs} at a time; modules already cached are not compiled again)")
    return 0


def _default_arch() -> str:
    from . import build

    return build.device_arch()


def _cache_dir() -> str:
    from . import build

    return str(build.cache_dir())


def nvrtc_line() -> str:
    """``sollat info``'s NVRTC line: its version and where it was loaded from, or that it is missing
    and which extra brings it."""
    from . import build

    missing = build.nvrtc_missing()
    if missing is not None:
        return f"NVRTC: not found, so no kernel can be compiled; install sollat's nvrtc extra: {build.NVRTC_EXTRA}"
    from importlib.metadata import PackageNotFoundError, version

    from cuda.bindings import nvrtc

    _, major, minor = nvrtc.nvrtcVersion()
    try:
        package = f"the nvidia-cuda-nvrtc {version('nvidia-cuda-nvrtc')} package"
    except PackageNotFoundError:
        package = "no nvidia-cuda-nvrtc package"
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        where = f", {load_nvidia_dynamic_lib('nvrtc').abs_path}"
    except Exception:  # the version is known; where it came from is a detail
        where = ""
    old = "" if (major, minor) >= (13, 0) else " (too old: sollat needs NVRTC 13.0 or newer)"
    return f"NVRTC: {major}.{minor}{old} ({package}{where})"


def _info(argv: list[str]) -> int:
    Parser(prog=f"{PROG} info", description=VERBS["info"]).parse_args(argv)
    import torch

    from . import __version__, build

    print(f"sollat {__version__}; torch {torch.__version__}; cache {build.cache_dir()}")
    print(nvrtc_line())
    if torch.cuda.is_available():
        print(f"GPU: {torch.cuda.get_device_name()} x {torch.cuda.device_count()}; arch {build.device_arch()}")
    else:
        print("GPU: none visible, so no arch (precompile --arch sm_XY compiles for one)")
    return 0


def _bench(verb: str, rest: list[str]) -> int:
    from .bench import cli as bench_cli

    return bench_cli.main([verb, *rest])


def _model(rest: list[str]) -> int:
    from .model import cli as model_cli

    return model_cli.main(rest)


def _tune(rest: list[str]) -> int:
    from . import tune

    return tune.main(rest)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), end="")
        return 0
    if argv == ["--version"]:
        from . import __version__

        print(f"sollat {__version__}")
        return 0
    verb, rest = argv[0], argv[1:]
    if verb not in VERBS:
        print(f"{PROG}: error: unknown verb {verb!r}; verbs: {', '.join(VERBS)} (see {PROG} --help)",
              file=sys.stderr)
        return 2
    if verb in BENCH_VERBS:
        return _bench(verb, rest)
    handlers: dict[str, Callable[[list[str]], int]] = {
        "model": _model, "tune": _tune, "precompile": _precompile, "info": _info}
    return handlers[verb](rest)
