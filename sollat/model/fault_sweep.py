"""The fault path's configurations, its planted bugs and its bounded sweep.

Every configuration injects a fault the device's test hooks inject (``Fault``: an absent rank, a
call with another signature) or lets any waiting thread time out (``timeouts="any"``), and most
end with ``reset()`` and healthy calls. The checker then requires, on every schedule: no thread
hangs, every output is the exact sum or NaN, no line of a faulted call is accepted later, every
rank's record holds the fault, and after ``reset()`` every call is exact again.
(``docs/protocol-model.md``, "The fault path".)
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from .config import Config, Fault, Mutation
from .explore import exhaustive, random_runs
from .sweep import Planted, SweepResult, config_named, planted

#: The fault-path mutations (each planted below, or proved harmless).
FAULT_MUTATIONS = frozenset({Mutation.NO_PROPAGATION, Mutation.NO_REFUSAL, Mutation.NO_POISON,
                             Mutation.COMMIT_AFTER_GIVE_UP, Mutation.EARLY_PRIOR})


def absent(rank: int, call: int, rejoin: str = "launch") -> Fault:
    return Fault("absent", rank, call, rejoin)


def mismatch(rank: int, call: int) -> Fault:
    return Fault("mismatch", rank, call)


def _c(name: str, **kw: Any) -> Config:
    return Config(name=name, **kw)


_O = {"algorithm": "oneshot", "calls": (1, 2, 1), "reset_at": 2}
_T = {"algorithm": "twoshot", "calls": (2, 4, 2), "reset_at": 2}
_L = {"algorithm": "ll128", "calls": (2, 4, 2), "reset_at": 2}

#: Tiny configurations explored exhaustively: 2-3 ranks, 1-2 threads, 2-4 calls, faults in the first
#: or a middle call, a fault in the last call without a reset, multi-iteration calls.
FAULT_EXHAUSTIVE: list[Config] = [
    _c("f-oneshot-ll-absent", protocol="ll", faults=(absent(1, 0),), **_O),
    _c("f-oneshot-ll-mismatch", protocol="ll", faults=(mismatch(1, 0),), **_O),
    _c("f-oneshot-sentinel-any", protocol="sentinel", timeouts="any", **_O),
    _c("f-oneshot-sentinel-absent-last", algorithm="oneshot", protocol="sentinel", calls=(2, 1),
       faults=(absent(0, 1),)),
    _c("f-oneshot-sentinel-2t-absent", algorithm="oneshot", protocol="sentinel", threads=2, calls=(2, 3, 1),
       faults=(absent(1, 0),), reset_at=2),
    _c("f-oneshot-ll-3r-absent-any", algorithm="oneshot", protocol="ll", nranks=3, calls=(2, 1, 1),
       faults=(absent(1, 0),), reset_at=2, timeouts="any"),
    _c("f-twoshot-ll-any", protocol="ll", timeouts="any", **_T),
    _c("f-twoshot-sentinel-absent", protocol="sentinel", faults=(absent(1, 0),), **_T),
    _c("f-twoshot-sentinel-any", protocol="sentinel", timeouts="any", **_T),
    _c("f-twoshot-ll-3r-mismatch", algorithm="twoshot", protocol="ll", nranks=3, calls=(2, 5, 3, 2),
       faults=(mismatch(2, 1),), reset_at=3),
    _c("f-ll128-any", timeouts="any", **_L),
    _c("f-ll128-mismatch", faults=(mismatch(1, 0),), **_L),
    _c("f-ll128-absent-mid", algorithm="ll128", nranks=2, calls=(2, 5, 3, 2), faults=(absent(1, 1),), reset_at=3),
    # sentinel call mismatches: seen in the signature words (ll_buffer.h), recorded on every rank;
    # every thread checks its own words, and the fused two-shot's exchange goes through a row's owner
    _c("f-oneshot-sentinel-mismatch", protocol="sentinel", faults=(mismatch(1, 0),), **_O),
    _c("f-twoshot-sentinel-mismatch", protocol="sentinel", faults=(mismatch(0, 1),), **_T),
    _c("f-rmsnorm-twoshot-sentinel-3r-mismatch", algorithm="rmsnorm_twoshot", protocol="sentinel", nranks=3,
       calls=(1, 3, 1), faults=(mismatch(0, 1),), reset_at=2),
]

#: Explored exhaustively too, in the tests marked slow only (PTX state graphs of 50,000+ states).
FAULT_EXHAUSTIVE_LARGE: list[Config] = [
    # two threads, each checking its own words (54,145 states)
    _c("f-oneshot-sentinel-2t-mismatch", algorithm="oneshot", protocol="sentinel", threads=2, calls=(2, 1),
       faults=(mismatch(1, 0),), reset_at=1),
]

#: Larger configurations for random schedules: (config, runs).
FAULT_RANDOM: list[tuple[Config, int]] = [
    # 3 ranks, rank 1 differs: each other rank sees it in rank 1's words, rank 1 in both of theirs
    # (exhaustively: 1,017,344 states)
    (_c("f-oneshot-sentinel-3r-mismatch", algorithm="oneshot", protocol="sentinel", nranks=3, calls=(1,),
        faults=(mismatch(1, 0),)), 300),
    # the fused two-shot: rank 2 of 4 is compared with row 0's owner (sig-ring/rmsnorm-twoshot-sentinel
    # is the same with a ring of words: rank 2 is compared with nobody)
    (_c("f-rmsnorm-twoshot-sentinel-4r-mismatch", algorithm="rmsnorm_twoshot", protocol="sentinel", nranks=4,
        calls=(1, 1), faults=(mismatch(2, 0),), reset_at=1), 100),
    (_c("f-oneshot-sentinel-3r-mismatch-calls3", algorithm="oneshot", protocol="sentinel", nranks=3, calls=(1, 1, 1),
        faults=(mismatch(1, 0),), reset_at=2), 100),
    (_c("f-twoshot-sentinel-3r2t-mismatch", algorithm="twoshot", protocol="sentinel", nranks=3, threads=2,
        calls=(4, 6, 2), faults=(mismatch(1, 1),), reset_at=2), 100),
    (_c("f-ll128-3r2t-mismatch", algorithm="ll128", nranks=3, threads=2, calls=(3, 7, 2), faults=(mismatch(2, 0),),
        reset_at=2), 150),
    # an absent rank in a middle call with spurious timeouts, 3 ranks (PTX mode: ~60,000 states)
    (_c("f-oneshot-ll-3r-absent-mid-any", algorithm="oneshot", protocol="ll", nranks=3, calls=(1, 3, 2, 1),
        faults=(absent(1, 1),), reset_at=3, timeouts="any"), 300),
    (_c("f-oneshot-ll-3r2t-b2s2-any", algorithm="oneshot", protocol="ll", nranks=3, threads=2, max_blocks=2,
        max_slots=2, calls=(1, 5, 2, 12, 3), reset_at=3, timeouts="any"), 200),
    (_c("f-oneshot-sentinel-4r2t-absent", algorithm="oneshot", protocol="sentinel", nranks=4, threads=2,
        max_blocks=2, max_slots=2, calls=(3, 1, 9, 2), faults=(absent(2, 1),), reset_at=3), 120),
    (_c("f-oneshot-ll-4r1t-mismatch-bits2", algorithm="oneshot", protocol="ll", nranks=4, calls=(2, 1, 3, 1, 2),
        faults=(mismatch(3, 2),), reset_at=4, epoch_bits=2), 400),
    (_c("f-twoshot-ll-3r2t-b2s2-mismatch", algorithm="twoshot", protocol="ll", nranks=3, threads=2, max_blocks=2,
        max_slots=2, calls=(4, 13, 2, 7), faults=(mismatch(0, 1),), reset_at=3), 150),
    (_c("f-twoshot-sentinel-4r2t-any", algorithm="twoshot", protocol="sentinel", nranks=4, threads=2,
        max_blocks=2, max_slots=2, calls=(4, 13, 2, 7), reset_at=2, timeouts="any"), 100),
    (_c("f-ll128-3r2t-absent", algorithm="ll128", nranks=3, threads=2, calls=(3, 7, 2, 3), faults=(absent(0, 1),),
        reset_at=2), 200),
    (_c("f-ll128-split-torn-3r1t-any", algorithm="ll128", nranks=3, calls=(3, 7, 2), ll128_line_atomic=False,
        ll128_split=True, reset_at=2, timeouts="any"), 200),
]


_p = planted


_ABSENT = Config(calls=(1, 1, 1), faults=(absent(1, 0),), reset_at=2)
_PROPAGATE = "a thread that records a fault writes every peer's record too (FaultSink::raise)"
_REFUSE = "a kernel whose rank's record holds a fault refuses: sends nothing, NaN outputs (refused())"
_POISON = "a thread that gives up or refuses writes NaN into every output it has not written (poison_from)"
_PRIOR = "the record code is loaded after griddepcontrol.wait (prologue, then prior)"

FAULT_PLANTED: list[Planted] = [
    _p("no-propagation/oneshot-sentinel", replace(_ABSENT, protocol="sentinel").with_mutation(
        Mutation.NO_PROPAGATION), ("stale",), _PROPAGATE),
    _p("no-propagation/ll128", replace(_ABSENT, algorithm="ll128", calls=(2, 2, 2)).with_mutation(
        Mutation.NO_PROPAGATION), ("overwrite", "stale"), _PROPAGATE),
    _p("no-propagation/oneshot-ll-any", Config(protocol="ll", timeouts="any", **_O).with_mutation(
        Mutation.NO_PROPAGATION), ("unnoticed",), _PROPAGATE),
    _p("no-refusal/oneshot-ll", _ABSENT.with_mutation(Mutation.NO_REFUSAL), ("overwrite", "stale"), _REFUSE),
    # The rank that should refuse runs call 1 from the epochs it did not commit and finds its peers'
    # leftover lines of the faulted call: its all-gather send lands on the line the peer never took
    # (overwrite), or, PTX mode (a load may be performed before the thread's earlier store to another
    # line), its all-gather poll first finds the peer's call-0 line at the epoch it waits for, under
    # call 0's signature: a call mismatch reported in a call where every rank agrees (mismatch).
    _p("no-refusal/ll128-mismatch", Config(faults=(mismatch(1, 0),), **_L).with_mutation(Mutation.NO_REFUSAL),
       ("overwrite", "stale", "mismatch"), _REFUSE),
    _p("no-poison/twoshot-ll-any", Config(protocol="ll", timeouts="any", **_T).with_mutation(Mutation.NO_POISON),
       ("unwritten",), _POISON),
    _p("no-poison/ll128-absent", Config(faults=(absent(0, 1),), **_L).with_mutation(Mutation.NO_POISON),
       ("unwritten",), _POISON),
    _p("early-prior/twoshot-sentinel", replace(_ABSENT, algorithm="twoshot", protocol="sentinel",
                                               calls=(2, 2, 2)).with_mutation(Mutation.EARLY_PRIOR),
       ("overwrite", "stale", "reset-race"), _PRIOR),
]

#: Proved harmless on every schedule: a thread that gave up never runs again before reset()
#: (its record is set before its kernel ends, so every later call of its rank refuses), and
#: reset() re-initialises the epochs, so whatever it committed is never read.
FAULT_BENIGN: list[Planted] = [
    _p("commit-after-give-up/oneshot-ll-3r-any", Config(algorithm="oneshot", protocol="ll", nranks=3,
                                                        calls=(2, 1, 1), faults=(absent(1, 0),), reset_at=2,
                                                        timeouts="any")
       .with_mutation(Mutation.COMMIT_AFTER_GIVE_UP), (),
       "refusal, not the missing commit, keeps a faulted rank's epochs from being used"),
    _p("commit-after-give-up/twoshot-sentinel-any", Config(protocol="sentinel", timeouts="any", **_T)
       .with_mutation(Mutation.COMMIT_AFTER_GIVE_UP), (),
       "refusal, not the missing commit, keeps a faulted rank's epochs from being used"),
]


def fault_sweep(seed: int = 0, scale: float = 1.0, *, exhaustive_configs: bool = True,
                skip: float = 0.0) -> SweepResult:
    """Every FAULT_EXHAUSTIVE configuration completely (unless ``exhaustive_configs`` is False),
    ``scale`` x the FAULT_RANDOM run counts, leaving out the first ``skip`` x of each (those a
    smaller scale ran)."""
    t0 = time.perf_counter()
    reports = [exhaustive(c) for c in FAULT_EXHAUSTIVE] if exhaustive_configs else []
    for i, (c, n) in enumerate(FAULT_RANDOM):
        first = max(1, int(n * skip)) if skip else 0
        reports.append(random_runs(c, max(1, int(n * scale)) - first, seed * 1009 + i, first=first))
    return SweepResult(reports, time.perf_counter() - t0)


def find_fault_config(name: str) -> Config:
    return config_named(name, FAULT_EXHAUSTIVE + FAULT_EXHAUSTIVE_LARGE, FAULT_RANDOM, FAULT_PLANTED + FAULT_BENIGN)
