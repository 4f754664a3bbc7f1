"""Readable counterexamples: replay a schedule and print which rank wrote what, when."""

from __future__ import annotations

from dataclasses import dataclass

from .machine import Machine
from .state import Action, Violation


@dataclass
class Counterexample:
    config: str
    violation: Violation
    schedule: list[Action]
    trace: list[str]  # one entry per step, numbered
    how: str  # "exhaustive" | "random seed=... mode=..."

    def format(self, max_steps: int = 400) -> str:
        head = [f"counterexample for {self.config} (found by {self.how}; {len(self.schedule)} steps)",
                str(self.violation)]
        body = self.trace
        if len(body) > max_steps:
            body = body[:20] + [f"... {len(body) - max_steps} steps omitted ..."] + body[-(max_steps - 20):]
        return "\n".join(head + ["trace (* = step touching the violating line):"] + body + [str(self.violation)])

    def __str__(self) -> str:
        return self.format()


def replay(machine: Machine, schedule: list[Action]) -> tuple[list[str], Violation | None]:
    """Re-run ``schedule`` from the initial state, logging every step; returns (trace, violation)."""
    st = machine.initial()
    trace: list[str] = []
    for n, act in enumerate(schedule, 1):
        log: list[str] = []
        v = machine.apply(st, act, log)
        trace.append(_step_text(machine, n, log, v))
        if v is not None:
            return trace, v
    if not machine.finished(st) and not machine.enabled(st):
        return trace, machine.deadlock(st)
    return trace, None


def _step_text(machine: Machine, n: int, log: list[str], v: Violation | None) -> str:
    name = machine.names[v.line] if v is not None and v.line >= 0 else None
    first = log[0] if log else "(no-op)"
    mark = "*" if name is not None and any(name in x for x in log) else " "
    lines = [f"{mark}#{n:<4d} {first.strip()}"] + [f"        {x.strip()}" for x in log[1:]]
    return "\n".join(lines)


def counterexample(machine: Machine, schedule: list[Action], how: str) -> Counterexample:
    trace, v = replay(machine, schedule)
    if v is None:
        raise AssertionError("replayed schedule shows no violation")
    if v.line >= 0:
        name = machine.names[v.line]
        trace = [("*" + t[1:]) if name in t else t for t in trace]
    return Counterexample(machine.cfg.label(), v, list(schedule), trace, how)
