"""The bounded sweep and the long soak over the named configurations of ``catalog.py``.

The CI sweep (:func:`sweep`) runs every :data:`EXHAUSTIVE` configuration to completion and a fixed
number of adversarial random schedules on every :data:`RANDOM` configuration (seeded, so every CI
run checks the same schedules); :func:`soak` keeps drawing new random schedules until a deadline.
Work is spread over worker processes (``workers``, default: up to 2).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from typing import TypeVar

from .catalog import BENIGN, EXHAUSTIVE, PLANTED, RANDOM, Planted, planted
from .config import Config
from .explore import Report, exhaustive, random_runs

__all__ = ["BENIGN", "EXHAUSTIVE", "PLANTED", "RANDOM", "Planted", "SweepResult", "check_planted", "config_named",
           "default_workers", "find_config", "planted", "soak", "sweep", "sweep_tasks", "with_memory"]

T = TypeVar("T")


# ---- running work, serially or on worker processes --------------------------------------------
_Task = tuple[str, Config, int, int]  # (method, config, runs or max_states, seed)


def _run_task(task: _Task) -> Report:
    method, cfg, n, seed = task
    if method == "exhaustive":
        return exhaustive(cfg, max_states=n)
    return random_runs(cfg, n, seed)


def _soak_task(task: tuple[Config, float, int]) -> Report:
    cfg, seconds, seed = task
    return random_runs(cfg, 1 << 62, seed, seconds=seconds)


def default_workers() -> int:
    return max(1, min(2, os.cpu_count() or 1))


def _map(fn: Callable[[T], Report], tasks: Sequence[T], workers: int,
         progress: Callable[[Report], None] | None) -> list[Report]:
    out: list[Report] = []
    if workers <= 1 or len(tasks) <= 1:
        for t in tasks:
            rep = fn(t)
            out.append(rep)
            if progress:
                progress(rep)
        return out
    ctx = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as ex:
        futs: list[Future[Report]] = [ex.submit(fn, t) for t in tasks]
        for f in as_completed(futs):  # progress as tasks finish; the result keeps the task order
            if progress:
                progress(f.result())
        return [f.result() for f in futs]


@dataclass
class SweepResult:
    reports: list[Report] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def random_interleavings(self) -> int:
        return sum(r.interleavings for r in self.reports if r.method == "random")

    @property
    def exhaustive_interleavings(self) -> int:
        return sum(r.interleavings for r in self.reports if r.method == "exhaustive")

    @property
    def states(self) -> int:
        return sum(r.states for r in self.reports if r.method == "exhaustive")

    @property
    def steps(self) -> int:
        return sum(r.steps for r in self.reports)

    @property
    def failures(self) -> list[Report]:
        return [r for r in self.reports if not r.ok or (r.method == "exhaustive" and not r.complete)]

    @property
    def ok(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        n_ex = sum(1 for r in self.reports if r.method == "exhaustive")
        n_rd = sum(1 for r in self.reports if r.method == "random")
        lines = [
            f"random schedules executed and checked: {self.random_interleavings:,} "
            f"on {n_rd} configurations ({sum(r.steps for r in self.reports if r.method == 'random'):,} steps)",
        ]
        if n_ex:
            lines.append(f"exhaustive: {n_ex} configurations, {self.states:,} states, "
                         f"{sum(r.steps for r in self.reports if r.method == 'exhaustive'):,} transitions, "
                         f"covering {self.exhaustive_interleavings:.3e} interleavings (every schedule)")
        lines.append(f"interleavings explored in total: {self.random_interleavings + self.exhaustive_interleavings:.3e}"
                     f" in {self.seconds:.1f} s; {'all clean' if self.ok else f'{len(self.failures)} FAILED'}")
        return "\n".join(lines)


def _merge_random(reports: list[Report]) -> list[Report]:
    """One report per random configuration (tasks may split a configuration's runs)."""
    merged: dict[str, Report] = {}
    out: list[Report] = []
    for r in reports:
        if r.method != "random":
            out.append(r)
            continue
        m = merged.get(r.config)
        if m is None:
            m = Report(r.config, "random")
            merged[r.config] = m
            out.append(m)
        m.interleavings += r.interleavings
        m.steps += r.steps
        m.seconds += r.seconds
        for k, v in r.adversaries.items():
            m.adversaries[k] = m.adversaries.get(k, 0) + v
        if r.counterexample is not None and m.counterexample is None:
            m.counterexample = r.counterexample
    return out


def with_memory(cfg: Config, memory: str | None) -> Config:
    """``cfg`` under another memory model (None: as it is)."""
    return cfg if memory is None or memory == cfg.memory else replace(cfg, memory=memory)


def sweep_tasks(scale: float = 1.0, seed: int = 0, *, exhaustive_configs: bool = True, max_states: int = 500_000,
                chunk: int = 2000, memory: str | None = None) -> list[_Task]:
    """The work of :func:`sweep`: one task per exhaustive config, random runs in chunks of ``chunk``."""
    tasks: list[_Task] = []
    if exhaustive_configs:
        tasks += [("exhaustive", with_memory(c, memory), max_states, seed) for c in EXHAUSTIVE]
    for i, (cfg, runs) in enumerate(RANDOM):
        n = max(1, int(runs * scale))
        for part, start in enumerate(range(0, n, chunk)):
            tasks.append(("random", with_memory(cfg, memory), min(chunk, n - start), seed * 1_000_003 + i * 1009 + part))
    return tasks


def sweep(scale: float = 1.0, seed: int = 0, *, workers: int | None = None, exhaustive_configs: bool = True,
          max_states: int = 500_000, progress: Callable[[Report], None] | None = None,
          chunk: int = 2000, memory: str | None = None) -> SweepResult:
    """The bounded sweep: every EXHAUSTIVE config completely, ``scale`` x the RANDOM run counts
    (``memory``: every configuration under that memory model; None: as configured, PTX).
    ``progress`` gets each task's report as the task finishes (len(sweep_tasks(...)) of them)."""
    t0 = time.perf_counter()
    tasks = sweep_tasks(scale, seed, exhaustive_configs=exhaustive_configs, max_states=max_states, chunk=chunk,
                        memory=memory)
    reports = _map(_run_task, tasks, workers if workers is not None else default_workers(), progress)
    return SweepResult(_merge_random(reports), time.perf_counter() - t0)


def soak(seconds: float, seed: int = 1, *, workers: int | None = None,
         progress: Callable[[Report], None] | None = None, slice_seconds: float = 30.0,
         memory: str | None = None) -> SweepResult:
    """Random schedules on every RANDOM config, fresh seeds, until ``seconds`` have passed."""
    t0 = time.perf_counter()
    w = workers if workers is not None else default_workers()
    reports: list[Report] = []
    round_ = 0
    while True:
        left = seconds - (time.perf_counter() - t0)
        if left <= 0.5:
            break
        per = max(0.5, min(slice_seconds, left) * w / len(RANDOM))
        tasks = [(with_memory(cfg, memory), per, (seed << 20) + round_ * 1000 + i) for i, (cfg, _) in enumerate(RANDOM)]
        reports += _map(_soak_task, tasks, w, progress)
        round_ += 1
        if any(not r.ok for r in reports):
            break
    return SweepResult(_merge_random(reports), time.perf_counter() - t0)


def check_planted(planted: Planted, *, random_runs_budget: int = 3000, seed: int = 0) -> tuple[Report, Report]:
    """Exhaustive and random search on a planted bug; both reports should hold a counterexample."""
    return exhaustive(planted.config), random_runs(planted.config, random_runs_budget, seed)


def config_named(name: str, exhaustive_configs: Sequence[Config], random_configs: Sequence[tuple[Config, int]],
                 planted: Sequence[Planted]) -> Config:
    """The configuration called ``name`` among a sweep's exhaustive, random and planted ones."""
    for c in [*exhaustive_configs, *(c for c, _ in random_configs), *(p.config for p in planted)]:
        if c.name == name:
            return c
    raise KeyError(name)


def find_config(name: str) -> Config:
    return config_named(name, EXHAUSTIVE, RANDOM, PLANTED + BENIGN)
