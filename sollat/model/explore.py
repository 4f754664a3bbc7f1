"""Drive the model under many schedules: adversarial random interleavings and exhaustive search.

* :func:`random_runs` executes complete schedules chosen at random under an *adversary*: a rank
  far ahead, a rank far behind, delayed or eager reset/zeroing stores, bursts of one rank, or a
  frozen thread. Each run is one interleaving, executed and checked step by step.
* :func:`exhaustive` explores every interleaving of a tiny configuration by depth-first search
  over the state graph with state hashing. The graph is acyclic (every step advances a program
  counter or performs a delayed store), so the number of distinct complete schedules is counted
  exactly by summing over successors; every transition on every one of them is checked.
"""

from __future__ import annotations

import gc
import random
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .config import Config
from .machine import Machine
from .state import Action, State, Violation
from .trace import Counterexample, counterexample

ADVERSARIES = ("uniform", "ahead", "behind", "ahead+behind", "lazy-stores", "eager-stores", "bursty", "frozen")


@dataclass
class Report:
    config: str
    method: str  # "random" | "exhaustive"
    interleavings: int = 0  # complete schedules checked
    steps: int = 0  # steps executed (random) / transitions explored (exhaustive)
    states: int = 0  # distinct states (exhaustive)
    complete: bool = True  # exhaustive search finished within its state bound
    seconds: float = 0.0
    counterexample: Counterexample | None = None
    adversaries: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.counterexample is None

    def summary(self) -> str:
        n = self.interleavings
        count = f"{n:>10,d}" if n < 10**10 else f"{n:>10.3e}"
        what = "interleavings (all)" if self.method == "exhaustive" else "interleavings (run)"
        s = f"{self.method:10s} {self.config:52s} {count} {what}"
        if self.method == "exhaustive":
            s += f" {self.states:>8,d} states {self.steps:>9,d} transitions"
            if not self.complete and self.ok:
                s += " (INCOMPLETE)"
        else:
            s += f" {self.steps:>9,d} steps" + " " * 16
        s += f" {self.seconds:6.2f}s  {'ok' if self.ok else 'VIOLATION'}"
        return s


class _Adversary:
    def __init__(self, machine: Machine, rng: random.Random, mode: str) -> None:
        R = machine.R
        self.rng = rng
        self.mode = mode
        self.speed = [rng.lognormvariate(0.0, 0.5) for _ in range(R)]
        self.flush_w = 1.0
        self.focus = -1
        self.burst = 0
        self.frozen: tuple[int, int] | None = None
        self.frozen_left = 0
        a, b = rng.sample(range(R), 2)
        if mode in ("ahead", "ahead+behind"):
            self.speed[a] *= 200.0
        if mode in ("behind", "ahead+behind"):
            self.speed[b] *= 0.005
        if mode == "lazy-stores":
            self.flush_w = 0.01
        elif mode == "eager-stores":
            self.flush_w = 100.0
        elif mode == "frozen":
            self.frozen = (rng.randrange(R), rng.randrange(4))
            self.frozen_left = rng.randrange(5, 200)
        # Fault path: how eagerly a waiting thread gives up (a spurious timeout, or its record check).
        self.give_up_w = rng.choice((0.003, 0.05, 1.0)) if machine.fault else 1.0

    def choose(self, acts: list[Action]) -> Action:
        rng = self.rng
        if self.mode == "bursty":
            if self.burst <= 0:
                self.focus = rng.randrange(len(self.speed))
                self.burst = rng.randrange(1, 40)
            self.burst -= 1
            mine = [a for a in acts if a[1] == self.focus]
            if mine:
                acts = mine
        if self.frozen is not None and self.frozen_left > 0:
            self.frozen_left -= 1
            fr, fj = self.frozen
            # a thread's own steps: (0, r, j) in the strong model; (0 | 5, r, j | op << 8) in PTX mode
            rest = [a for a in acts if not (a[0] in (0, 5) and a[1] == fr and a[2] & 0xFF == fj)]
            if rest:
                acts = rest
        if len(acts) == 1:
            return acts[0]
        # kinds: 0 step / PTX load, 1 delayed store, 2 give-up, 3 rejoin, 4 reset, 5 PTX store
        speed, w = self.speed, (1.0, self.flush_w, self.give_up_w, 1.0, 1.0, self.flush_w)
        weights = [speed[a[1]] * w[a[0]] for a in acts]
        return rng.choices(acts, weights)[0]


def run_schedule(machine: Machine, choose: Callable[[list[Action]], Action]) -> tuple[list[Action], Violation | None]:
    """One complete run; returns the schedule and the first violation (or None)."""
    st = machine.initial()
    path: list[Action] = []
    limit = machine.max_steps
    while True:
        acts = machine.enabled(st)
        if not acts:
            break
        a = choose(acts)
        path.append(a)
        v = machine.apply(st, a)
        if v is not None:
            return path, v
        if len(path) > limit:
            return path, Violation("no-progress", f"run exceeded {limit} steps")
    if not machine.finished(st):
        return path, machine.deadlock(st)
    return path, None


def random_runs(cfg: Config, runs: int, seed: int = 0, *, seconds: float | None = None,
                machine: Machine | None = None, first: int = 0) -> Report:
    """``runs`` random schedules (or as many as fit in ``seconds``), cycling through the adversaries;
    ``first``: the index of the first one (schedule i is the same for every ``runs``)."""
    m = machine or Machine(cfg)
    rep = Report(cfg.label(), "random")
    t0 = time.perf_counter()
    i = first
    while (i < first + runs) if seconds is None else (time.perf_counter() - t0 < seconds):
        mode = ADVERSARIES[i % len(ADVERSARIES)]
        rng = random.Random(f"{seed}/{i}")
        adv = _Adversary(m, rng, mode)
        path, v = run_schedule(m, adv.choose)
        rep.interleavings += 1
        rep.steps += len(path)
        rep.adversaries[mode] = rep.adversaries.get(mode, 0) + 1
        if v is not None:
            rep.counterexample = counterexample(m, path, f"random schedule seed={seed}/{i} adversary={mode}")
            break
        i += 1
    rep.seconds = time.perf_counter() - t0
    return rep


class _Found(Exception):
    def __init__(self, path: list[Action], v: Violation) -> None:
        super().__init__(str(v))
        self.path = path
        self.v = v


def exhaustive(cfg: Config, max_states: int = 2_000_000, machine: Machine | None = None, *,
               shortest: bool = True) -> Report:
    """Every interleaving of ``cfg`` (DFS with state hashing); stops at the first violation, and
    reports a shortest violating schedule (breadth-first) or, ``shortest=False``, the one found."""
    m = machine or Machine(cfg)
    rep = Report(cfg.label(), "exhaustive")
    memo: dict[tuple[object, ...], int] = {}
    path: list[Action] = []
    counters = [0]  # transitions
    incomplete = [False]

    def dfs(st: State) -> int:
        key = st.key()
        got = memo.get(key)
        if got is not None:
            return got
        acts = m.enabled(st)
        if not acts:
            if not m.finished(st):
                raise _Found(list(path), m.deadlock(st))
            memo[key] = 1
            return 1
        if len(memo) >= max_states:
            incomplete[0] = True
            return 0
        total = 0
        for a in acts:
            child = st.copy()
            counters[0] += 1
            path.append(a)
            v = m.apply(child, a)
            if v is not None:
                raise _Found(list(path), v)
            total += dfs(child)
            path.pop()
        memo[key] = total
        return total

    t0 = time.perf_counter()
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 4 * m.max_steps + 1000))
    gc_was = gc.isenabled()
    gc.disable()  # the memo holds only acyclic tuples; collecting it over and over is pure cost
    try:
        rep.interleavings = dfs(m.initial())
    except _Found as f:
        short = shortest_counterexample(m, max_states=min(max_states, 300_000)) if shortest else None
        if short is not None:
            rep.counterexample = counterexample(m, short, "exhaustive search (shortest schedule, breadth-first)")
        else:
            rep.counterexample = counterexample(m, f.path, "exhaustive search (depth-first)")
    finally:
        sys.setrecursionlimit(old)
        if gc_was:
            gc.enable()
    rep.states = len(memo)
    rep.steps = counters[0]
    rep.complete = not incomplete[0] and rep.counterexample is None
    rep.seconds = time.perf_counter() - t0
    return rep


def shortest_counterexample(m: Machine, max_states: int = 300_000) -> list[Action] | None:
    """Breadth-first search for a shortest violating schedule (None if none within ``max_states``)."""
    init = m.initial()
    k0 = init.key()
    parent: dict[tuple[object, ...], tuple[tuple[object, ...], Action] | None] = {k0: None}
    queue: deque[tuple[State, tuple[object, ...]]] = deque([(init, k0)])

    def path_to(key: tuple[object, ...]) -> list[Action]:
        out: list[Action] = []
        link = parent[key]
        while link is not None:
            key, a = link
            out.append(a)
            link = parent[key]
        return out[::-1]

    while queue:
        st, key = queue.popleft()
        acts = m.enabled(st)
        if not acts and not m.finished(st):
            return path_to(key)
        for a in acts:
            child = st.copy()
            if m.apply(child, a) is not None:
                return [*path_to(key), a]
            ck = child.key()
            if ck not in parent:
                if len(parent) >= max_states:
                    return None
                parent[ck] = (key, a)
                queue.append((child, ck))
    return None
