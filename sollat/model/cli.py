"""python -m sollat model: the protocol model checker (CPU only).

  --demo             short run: a few exhaustive searches, a few thousand adversarial random
                     schedules and one planted bug's counterexample (the default)
  --sweep            the bounded CI sweep: every exhaustive config and ~10^5 random schedules,
                     then the bulk protocol's area model (bulk.py)
  --soak SECONDS     random schedules on every random config with fresh seeds until the deadline
  --planted          every planted bug: each must be caught with a counterexample
  --mutation NAME    print the counterexample for one planted bug (see --list)
  --config NAME      check only these configurations (repeatable; see --list)
  --list             list configurations and planted bugs
  --memory MODEL     ptx (the default: PTX's memory consistency model, what CI checks) or strong
                     (stronger than PTX: untorn 16-byte lines, stores in program order)

--sweep and --soak print a progress line on stderr every 10 seconds.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from ..cli_args import PROG, Parser, nonneg_int, positive_float, positive_int
from . import bulk
from .config import MEMORY
from .explore import Report, exhaustive, random_runs
from .fault_sweep import FAULT_BENIGN, FAULT_PLANTED
from .sweep import (
    BENIGN,
    EXHAUSTIVE,
    PLANTED,
    RANDOM,
    Planted,
    default_workers,
    find_config,
    soak,
    sweep,
    sweep_tasks,
    with_memory,
)

TICK_SECONDS = 10.0
#: Exhaustive configurations the demo runs.
DEMO_CONFIGS = ("oneshot-ll-2r1t", "oneshot-sentinel-2r1t", "twoshot-ll-2r1t", "ll128-split-torn-2r1t")


def _progress(verbose: bool) -> Callable[[Report], None]:
    def show(rep: Report) -> None:
        if verbose or not rep.ok:
            print(rep.summary(), flush=True)
        if rep.counterexample is not None:
            print(rep.counterexample.format(), flush=True)
    return show


class Ticker:
    """Progress of long work: prints each report as ``show`` wants, and a line on stderr at most
    every ``every`` seconds and when the last of ``total`` tasks is done."""

    def __init__(self, what: str, show: Callable[[Report], None], *, total: int | None = None,
                 deadline: float | None = None, every: float) -> None:
        self.what, self.show, self.total, self.deadline, self.every = what, show, total, deadline, every
        self.t0 = self.last = time.perf_counter()
        self.done = self.states = self.schedules = 0

    def __call__(self, rep: Report) -> None:
        self.show(rep)
        self.done += 1
        self.states += rep.states
        self.schedules += rep.interleavings if rep.method == "random" else 0
        now = time.perf_counter()
        if now - self.last >= self.every or self.done == self.total:
            self.last = now
            print(self.line(now - self.t0), file=sys.stderr, flush=True)

    def line(self, elapsed: float) -> str:
        done = f"{self.done}/{self.total}" if self.total else f"{self.done}"
        of = f" of {self.deadline:.0f} s" if self.deadline else ""
        return (f"{self.what}: {done} tasks done, {self.states:,} exhaustive states, "
                f"{self.schedules:,} random schedules, {elapsed:.0f} s{of}")


def _bulk() -> int:
    """The bulk protocol's area model (bulk.py): its configurations clean, its planted bugs caught."""
    bad = 0
    for name, nranks, calls, variant in bulk.BENIGN:
        res = bulk.explore(nranks, calls, variant)
        bad += not res.ok
        print(f"{'proved' if res.ok else 'FAILED'}  {name:40s} every schedule, {res.states:,} states"
              + ("" if res.ok else f": {res.violation}"), flush=True)
    for name, nranks, calls, last, variant in bulk.MISMATCH:
        res = bulk.explore(nranks, calls, variant, last_rank_calls=last)
        bad += not res.ok
        print(f"{'proved' if res.ok else 'FAILED'}  {name:40s} every schedule records the mismatch, {res.states:,} states"
              + ("" if res.ok else f": {res.violation}"), flush=True)
    planted = [(name, bulk.explore(nranks, calls, variant)) for name, nranks, calls, variant in bulk.PLANTED]
    planted += [(name, bulk.explore(nranks, calls, variant, last_rank_calls=last))
                for name, nranks, calls, last, variant in bulk.MISMATCH_PLANTED]
    for name, res in planted:
        bad += res.ok
        print(f"{'caught' if not res.ok else 'MISSED'}  {name:40s} {res.violation or 'no violation found'}", flush=True)
    return bad


def _list() -> int:
    print("exhaustive configurations:")
    for c in EXHAUSTIVE:
        print(f"  {c.name:36s} {c.label()}")
    print("random-schedule configurations (runs in the CI sweep):")
    for c, n in RANDOM:
        print(f"  {c.name:36s} {n:>6d}  {c.label()}")
    print("planted bugs (must be caught, as the violations named):")
    for p in PLANTED + FAULT_PLANTED:
        print(f"  {p.name:36s} caught as {'/'.join(sorted(p.kinds))}; breaks: {p.rule}")
    print("mutations proved harmless where they are listed:")
    for p in BENIGN + FAULT_BENIGN:
        print(f"  {p.name:36s} because: {p.rule}")
    print("the bulk protocol's area model (bulk.py; --sweep and --planted run it):")
    for name, nranks, calls, _variant in bulk.BENIGN:
        print(f"  {name:36s} {nranks} ranks, calls of {'/'.join(map(str, calls))} rounds: clean")
    for name, nranks, calls, _variant in bulk.PLANTED:
        print(f"  {name:36s} {nranks} ranks, calls of {'/'.join(map(str, calls))} rounds: caught")
    for name, nranks, calls, last, _variant in bulk.MISMATCH:
        print(f"  {name:36s} {nranks} ranks, calls (rounds, signature) {calls}, the last rank {last}: "
              "every schedule records the mismatch")
    for name, nranks, calls, last, _variant in bulk.MISMATCH_PLANTED:
        print(f"  {name:36s} {nranks} ranks, calls (rounds, signature) {calls}, the last rank {last}: "
              "caught reading the other call's data")
    return 0


def _strong_proof(p: Planted) -> int:
    """A PTX-only planted bug under the strong model: every schedule must be clean."""
    ex = exhaustive(with_memory(p.config, "strong"))
    ok = ex.ok and ex.complete
    print(f"{'proved' if ok else 'FAILED'}  {p.name:40s} harmless in the strong model, caught only by PTX mode "
          f"({ex.states:,} states, every schedule)")
    return not ok


def _planted(seed: int, show: str | None = None, memory: str = "ptx") -> int:
    bad = 0
    for p in PLANTED + FAULT_PLANTED:
        if show is not None and p.name != show:
            continue
        if memory == "strong" and p.ptx_only:
            bad += _strong_proof(p)
            continue
        cfg = with_memory(p.config, memory)
        ex = exhaustive(cfg)
        rnd = random_runs(cfg, 3000, seed)
        caught = [r for r in (ex, rnd) if r.counterexample is not None and r.counterexample.violation.kind in p.kinds]
        ok = len(caught) == 2
        bad += not ok
        rk = (f"random: {rnd.counterexample.violation.kind} after {rnd.interleavings} schedule(s)"
              if rnd.counterexample else "NOT by random schedules")
        print(f"{'caught' if ok else 'MISSED'}  {p.name:40s} exhaustive: "
              f"{ex.counterexample.violation.kind if ex.counterexample else 'NOT caught'}; {rk}")
        if show is not None and ex.counterexample is not None:
            print(ex.counterexample.format())
        if p.ptx_only:  # and the strong model proves the same configuration clean
            bad += _strong_proof(p)
    if show is None:
        bad += _bulk()
        for p in BENIGN + FAULT_BENIGN:
            ex = exhaustive(with_memory(p.config, memory))
            ok = ex.ok and ex.complete
            bad += not ok
            print(f"{'proved' if ok else 'FAILED'}  {p.name:40s} harmless: {p.rule} "
                  f"({ex.states:,} states, every schedule)")
    return 1 if bad else 0


#: Marks each line of a planted bug's counterexample in the demo: expected output, not a failure.
PLANTED_MARK = "  [planted, expected] "


def _show_planted(rep: Report) -> int:
    """Prints a planted bug's counterexample, every line marked as expected; 1 if it was missed."""
    if rep.counterexample is None:
        print("MISSED: the planted bug was not caught")
        return 1
    print("\n".join(PLANTED_MARK + line for line in rep.counterexample.format().splitlines()))
    return 0


def _demo(seed: int, workers: int, memory: str) -> int:
    t0 = time.perf_counter()
    print("sollat protocol model: every write/read of LL, sentinel, double buffering and LL128 atomic,")
    print(f"checked under adversarial schedules (no GPU needed), memory model: {memory}. Short demo;")
    print("`--sweep` is the CI run, `--planted` checks every planted bug.\n")
    fails = 0
    names = DEMO_CONFIGS
    for c in EXHAUSTIVE:
        if c.name in names:
            rep = exhaustive(with_memory(c, memory))
            fails += not (rep.ok and rep.complete)
            print(rep.summary())
    for c, n in RANDOM[:9]:
        rep = random_runs(with_memory(c, memory), max(60, n // 120), seed)
        fails += not rep.ok
        print(rep.summary())
        if rep.counterexample is not None:
            print(rep.counterexample.format())
    print("\nThe protocols above are clean. Next, bugs planted on purpose, to show that the checker catches")
    print(f"them: their VIOLATION lines are the expected output (each line marked {PLANTED_MARK.strip()}).")
    print("\nA planted bug (no fence between a receive, its sentinel resets and the next send), as the checker")
    print("reports it:")
    p = next(p for p in PLANTED if p.name == "reset-after-send/oneshot-sentinel")
    fails += _show_planted(exhaustive(with_memory(p.config, memory)))
    if memory == "ptx":
        print("\nA bug only PTX's memory model has (an LL line with one flag for 16 bytes, which PTX may")
        print("split into two 8-byte stores), as the checker reports it:")
        p = next(p for p in PLANTED if p.name == "single-flag-line/oneshot-ll")
        fails += _show_planted(exhaustive(p.config))
    verdict = "all clean, and every planted bug caught as expected" if not fails else "FAILED"
    print(f"\ndemo done in {time.perf_counter() - t0:.1f} s: {verdict}")
    return 1 if fails else 0


def _parser() -> Parser:
    ap = Parser(prog=f"{PROG} model", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--demo", action="store_true", help="short demo (default)")
    mode.add_argument("--sweep", action="store_true", help="bounded CI sweep")
    mode.add_argument("--soak", type=positive_float, metavar="SECONDS", help="long random soak")
    mode.add_argument("--planted", action="store_true", help="check that every planted bug is caught")
    mode.add_argument("--mutation", metavar="NAME", help="counterexample of one planted bug")
    mode.add_argument("--config", action="append", metavar="NAME", help="check these configurations only")
    mode.add_argument("--list", action="store_true", help="list configurations and planted bugs")
    ap.add_argument("--scale", type=positive_float, default=None, help="--sweep: multiply the random run counts")
    ap.add_argument("--runs", type=positive_int, default=None,
                    help="--config: random schedules per configuration (default 2000)")
    ap.add_argument("--exhaustive", action="store_true", help="--config: exhaustive search instead of random")
    ap.add_argument("--memory", choices=MEMORY, default="ptx",
                    help="memory model: ptx (default, what CI checks) or strong (stronger than PTX)")
    ap.add_argument("--seed", type=nonneg_int, default=0,
                    help="seed of the random schedules (default 0; --soak: 0 takes the clock)")
    ap.add_argument("--workers", type=positive_int, default=default_workers(),
                    help=f"processes for --sweep, --soak and the demo (default {default_workers()})")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every configuration's report")
    return ap


def _check(ap: Parser, a: argparse.Namespace) -> None:
    """Options that belong to another mode are errors, not silently ignored."""
    if (a.runs is not None or a.exhaustive) and not a.config:
        ap.error("--runs and --exhaustive go with --config NAME")
    if a.runs is not None and a.exhaustive:
        ap.error("--runs counts random schedules; --exhaustive checks every schedule: give one")
    if a.scale is not None and not a.sweep:
        ap.error("--scale goes with --sweep")
    for name in a.config or []:
        try:
            find_config(name)
        except KeyError:
            ap.error(f"unknown configuration {name!r}; --list names them")
    if a.mutation is not None and a.mutation not in {p.name for p in PLANTED + FAULT_PLANTED}:
        ap.error(f"unknown planted bug {a.mutation!r}; --list names them")


def _configs(a: argparse.Namespace) -> int:
    fails = 0
    for name in a.config:
        cfg = with_memory(find_config(name), a.memory)
        rep = exhaustive(cfg) if a.exhaustive else random_runs(cfg, a.runs or 2000, a.seed)
        print(rep.summary())
        if rep.counterexample is not None:
            print(rep.counterexample.format())
        fails += not rep.ok
    return 1 if fails else 0


def _sweep(a: argparse.Namespace) -> int:
    scale = 1.0 if a.scale is None else a.scale
    tasks = sweep_tasks(scale, a.seed)
    runs = sum(t[2] for t in tasks if t[0] == "random")
    print(f"sweep: {len(EXHAUSTIVE)} exhaustive configurations and {runs:,} random schedules on {len(RANDOM)} "
          f"configurations, {len(tasks)} tasks on {a.workers} worker(s); progress on stderr", flush=True)
    tick = Ticker("sweep", _progress(a.verbose), total=len(tasks), every=TICK_SECONDS)
    res = sweep(scale, a.seed, workers=a.workers, progress=tick, memory=a.memory)
    print(res.summary())
    bulk_bad = _bulk()
    return 0 if res.ok and not bulk_bad else 1


def _soak(a: argparse.Namespace) -> int:
    print(f"soak: random schedules on {len(RANDOM)} configurations for {a.soak:.0f} s on {a.workers} worker(s); "
          "progress on stderr", flush=True)
    tick = Ticker("soak", _progress(a.verbose), deadline=a.soak, every=TICK_SECONDS)
    res = soak(a.soak, a.seed or int(time.time()), workers=a.workers, progress=tick, memory=a.memory)
    print(res.summary())
    return 0 if res.ok else 1


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    a = ap.parse_args(argv)
    _check(ap, a)
    if a.list:
        return _list()
    if a.mutation:
        return _planted(a.seed, a.mutation, a.memory)
    if a.planted:
        return _planted(a.seed, memory=a.memory)
    if a.config:
        return _configs(a)
    if a.sweep:
        return _sweep(a)
    if a.soak is not None:
        return _soak(a)
    return _demo(a.seed, a.workers, a.memory)


if __name__ == "__main__":
    sys.exit(main())
