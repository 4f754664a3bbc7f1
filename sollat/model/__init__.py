"""Executable model of sollat's barrier-free protocols, and a checker that drives it.

The model runs the one-shot, two-shot, LL128-atomic and wide one-shot AllReduce kernels (and the
exchange of the fused RMSNorm two-shot) as thread programs of memory operations (LL, sentinel, epoch-parity double
buffering, chunked iterations, kernel boundaries), with the slot mapping and geometry taken from :mod:`sollat.device.layout`. The checker
explores adversarial random schedules and, for tiny configurations, every interleaving; it
checks exact sums, that no line is overwritten before it is consumed, that no reader accepts
stale data, and that every run terminates. See ``docs/protocol-model.md``.

    >>> from sollat.model import Config, exhaustive
    >>> exhaustive(Config(algorithm="oneshot", protocol="sentinel", nranks=2, calls=(1, 2))).ok
    True
"""

from __future__ import annotations

from .config import Config, Fault, Mutation
from .explore import Report, exhaustive, random_runs
from .machine import Machine
from .ptx import PtxMachine  # Machine(cfg) finds it for memory="ptx"
from .state import Violation
from .sweep import BENIGN, EXHAUSTIVE, PLANTED, RANDOM, Planted, SweepResult, soak, sweep
from .trace import Counterexample

__all__ = [
    "BENIGN",
    "EXHAUSTIVE",
    "PLANTED",
    "RANDOM",
    "Config",
    "Counterexample",
    "Fault",
    "Machine",
    "Mutation",
    "Planted",
    "PtxMachine",
    "Report",
    "SweepResult",
    "Violation",
    "exhaustive",
    "random_runs",
    "soak",
    "sweep",
]
