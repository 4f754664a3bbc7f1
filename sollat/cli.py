"""``python -m sollat VERB``: the one command line of sollat, the dispatcher of its verbs.

``python -m sollat.bench VERB`` is the same command line. The list of verbs (:data:`VERBS`) and
the argument helpers every verb uses (:class:`Parser`, :func:`positive_int`, ...) live in
:mod:`sollat.cli_args` and are importable from here too. This module imports each verb's module
when that verb runs; no verb imports this module.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from .cli_args import (
    BENCH_VERBS,
    PROG,
    VERBS,
    Parser,
    int_range,
    nonneg_int,
    positive_float,
    positive_int,
)
from .errors import EnvironmentValueError

__all__ = ["BENCH_VERBS", "PROG", "VERBS", "Parser", "int_range", "main", "nonneg_int", "nvrtc_line",
           "positive_float", "positive_int", "usage"]


def usage() -> str:
    rows = "\n".join(f"  {verb:<12}{text}" for verb, text in VERBS.items())
    return (f"usage: {PROG} VERB [options]     ({PROG} VERB --help: the options of one verb; "
            f"{PROG} --version)\n\n"
            f"verbs:\n{rows}\n\n"
            "applications (own modules): python -m sollat.apps.decode, python -m sollat.apps.cg "
            "(see docs/apps.md)\n")


def _arch(text: str) -> str:
    from .collectives.instantiations import check_arch

    try:
        return check_arch(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _precompile(argv: list[str]) -> int:
    import time
    from functools import partial

    from .bench.progress import Progress
    from .collectives import instantiations

    p = Parser(prog=f"{PROG} precompile", description=VERBS["precompile"])
    p.add_argument("--arch", type=_arch, default=None,
                   help=f"sm_XY (default: this GPU, or {instantiations.DEFAULT_ARCH} without one)")
    p.add_argument("-j", "--jobs", type=positive_int, default=8, help="parallel compiles (default 8)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    a = p.parse_args(argv)
    t = time.time()
    try:
        n = instantiations.precompile(a.arch, a.jobs, progress=partial(Progress, enabled=not a.no_progress))
    except instantiations.PrecompileError as exc:
        print(f"{p.prog}: error: {exc}", file=sys.stderr)
        return 1
    arch = a.arch or _default_arch()
    print(f"sollat: {n} kernel modules for {arch} in the cache {_cache_dir()} after {time.time() - t:.1f} s "
          f"({a.jobs} at a time; modules already cached are not compiled again)")
    return 0


def _default_arch() -> str:
    from .device import build

    return build.device_arch()


def _cache_dir() -> str:
    from .device import build

    return str(build.cache_dir())


def nvrtc_line() -> str:
    """``sollat info``'s NVRTC line: its version and where it was loaded from, or that it is missing
    and which extra brings it."""
    from .device import build

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

    from ._version import VERSION
    from .device import build

    print(f"sollat {VERSION}; torch {torch.__version__}; cache {build.cache_dir()}")
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
        from ._version import VERSION  # not sollat.__version__: see sollat/_version.py

        print(f"sollat {VERSION}")
        return 0
    verb, rest = argv[0], argv[1:]
    if verb not in VERBS:
        print(f"{PROG}: error: unknown verb {verb!r}; verbs: {', '.join(VERBS)} (see {PROG} --help)",
              file=sys.stderr)
        return 2
    handlers: dict[str, Callable[[list[str]], int]] = {
        "model": _model, "tune": _tune, "precompile": _precompile, "info": _info}
    try:
        return _bench(verb, rest) if verb in BENCH_VERBS else handlers[verb](rest)
    except EnvironmentValueError as exc:  # a SOLLAT_* variable not understood: one line, no traceback
        print(f"{PROG} {verb}: error: {str(exc).removeprefix('sollat: ')}", file=sys.stderr)
        return 2
