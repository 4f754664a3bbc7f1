"""The verbs of ``python -m sollat`` and the argument helpers every verb's parser uses.

:data:`VERBS` is the one list of verbs. :class:`Parser` is argparse, but a bad argument is one line on
stderr and exit status 2; :func:`positive_int`, :func:`positive_float`, :func:`nonneg_int` and
:func:`int_range` are argument types. The dispatcher (:mod:`sollat.cli`) and each verb's module
(:mod:`sollat.bench.cli`, :mod:`sollat.model.cli`, :mod:`sollat.tune`) import this module; it
imports nothing of sollat, so a verb never imports the dispatcher.
"""

from __future__ import annotations

import argparse
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
