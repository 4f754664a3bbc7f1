"""``python -m sollat model``: the protocol model checker (CPU only).

  --demo             short run: a few exhaustive searches, a few thousand adversarial random
                     schedules and one planted bug's counterexample (the default)
  --sweep            the bounded CI sweep: every exhaustive config and ~10^5 random schedules
  --soak SECONDS     random schedules on every random config with fresh seeds until the deadline
  --planted          every planted bug: each must be caught with a counterexample
  --mutation NAME    print the counterexample for one planted bug (see --list)
  --config NAME      check only these configurations (repeatable; see --list)
  --list             list configurations and planted bugs
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from .explore import Report, exhaustive, random_runs
from .sweep import BENIGN, EXHAUSTIVE, PLANTED, RANDOM, default_workers, find_config, soak, sweep


def _progress(verbose: bool) -> Callable[[Report], None]:
    def show(rep: Report) -> None:
        if verbose or not rep.ok:
            print(rep.summary(), flush=True)
        if rep.counterexample is not None:
            print(rep.counterexample.format(), flush=True)
    return show


def _list() -> int:
    print("exhaustive configurations:")
    for c in EXHAUSTIVE:
        print(f"  {c.name:36s} {c.label()}")
    print("random-schedule configurations (runs in the CI sweep):")
    for c, n in RANDOM:
        print(f"  {c.name:36s} {n:>6d}  {c.label()}")
    print("planted bugs (must be caught):")
    for p in PLANTED:
        print(f"  {p.name:36s} breaks: {p.rule}")
    print("mutations proved harmless where they are listed:")
    for p in BENIGN:
        print(f"  {p.name:36s} because: {p.rule}")
    return 0


def _planted(seed: int, show: str | None = None) -> int:
    bad = 0
    for p in PLANTED:
        if show is not None and p.name != show:
            continue
        ex = exhaustive(p.config)
        rnd = random_runs(p.config, 3000, seed)
        caught = [r for r in (ex, rnd) if r.counterexample is not None and r.counterexample.violation.kind in p.kinds]
        ok = len(caught) == 2
        bad += not ok
        rk = f"after {rnd.interleavings} random schedule(s)" if rnd.counterexample else "NOT by random schedules"
        print(f"{'caught' if ok else 'MISSED'}  {p.name:40s} exhaustive: "
              f"{ex.counterexample.violation.kind if ex.counterexample else 'NOT caught'}; {rk}")
        if show is not None and ex.counterexample is not None:
            print(ex.counterexample.format())
    if show is None:
        for p in BENIGN:
            ex = exhaustive(p.config)
            ok = ex.ok and ex.complete
            bad += not ok
            print(f"{'proved' if ok else 'FAILED'}  {p.name:40s} harmless: {p.rule} "
                  f"({ex.states:,} states, every schedule)")
    elif not any(p.name == show for p in PLANTED):
        print(f"unknown planted bug {show!r}; see --list")
        return 2
    return 1 if bad else 0


def _demo(seed: int, workers: int) -> int:
    t0 = time.perf_counter()
    print("sollat protocol model: every write/read of LL, sentinel, double buffering and LL128 atomic,")
    print("checked under adversarial schedules (no GPU needed). Short demo; `--sweep` is the CI run.\n")
    fails = 0
    names = ["oneshot-ll-2r1t", "oneshot-sentinel-3r1t", "twoshot-sentinel-2r2t", "ll128-3r1t"]
    for c in EXHAUSTIVE:
        if c.name in names:
            rep = exhaustive(c)
            fails += not (rep.ok and rep.complete)
            print(rep.summary())
    for c, n in RANDOM[:9]:
        rep = random_runs(c, max(100, n // 40), seed)
        fails += not rep.ok
        print(rep.summary())
        if rep.counterexample is not None:
            print(rep.counterexample.format())
    print("\nA planted bug (the sentinel reset not fenced before the next send), as the checker reports it:")
    p = next(p for p in PLANTED if p.name == "reset-after-send/oneshot-sentinel")
    rep = exhaustive(p.config)
    if rep.counterexample is None:
        print("MISSED: the planted bug was not caught")
        fails += 1
    else:
        print(rep.counterexample.format())
    print(f"\ndemo done in {time.perf_counter() - t0:.1f} s: {'all clean, planted bug caught' if not fails else 'FAILED'}")
    return 1 if fails else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="sollat model", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--demo", action="store_true", help="short demo (default)")
    ap.add_argument("--sweep", action="store_true", help="bounded CI sweep")
    ap.add_argument("--scale", type=float, default=1.0, help="sweep: multiply the random run counts")
    ap.add_argument("--soak", type=float, metavar="SECONDS", help="long random soak")
    ap.add_argument("--planted", action="store_true", help="check that every planted bug is caught")
    ap.add_argument("--mutation", metavar="NAME", help="counterexample of one planted bug")
    ap.add_argument("--config", action="append", metavar="NAME", help="check these configurations only")
    ap.add_argument("--runs", type=int, default=2000, help="--config: random schedules per configuration")
    ap.add_argument("--exhaustive", action="store_true", help="--config: exhaustive search instead of random")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=default_workers())
    ap.add_argument("-v", "--verbose", action="store_true", help="print every configuration's report")
    ap.add_argument("--list", action="store_true", help="list configurations and planted bugs")
    a = ap.parse_args(argv)

    if a.list:
        return _list()
    if a.mutation:
        return _planted(a.seed, a.mutation)
    if a.planted:
        return _planted(a.seed)
    if a.config:
        fails = 0
        for name in a.config:
            try:
                cfg = find_config(name)
            except KeyError:
                print(f"unknown configuration {name!r}; see --list")
                return 2
            rep = exhaustive(cfg) if a.exhaustive else random_runs(cfg, a.runs, a.seed)
            print(rep.summary())
            if rep.counterexample is not None:
                print(rep.counterexample.format())
            fails += not rep.ok
        return 1 if fails else 0
    if a.sweep:
        res = sweep(a.scale, a.seed, workers=a.workers, progress=_progress(a.verbose))
        print(res.summary())
        return 0 if res.ok else 1
    if a.soak is not None:
        print(f"soak: random schedules on {len(RANDOM)} configurations for {a.soak:.0f} s on {a.workers} worker(s)")
        res = soak(a.soak, a.seed or int(time.time()), workers=a.workers, progress=_progress(a.verbose))
        print(res.summary())
        return 0 if res.ok else 1
    return _demo(a.seed, a.workers)


if __name__ == "__main__":
    sys.exit(main())
