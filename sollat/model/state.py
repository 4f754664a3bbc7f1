"""What changes during a run of the model: the state of every rank, its delayed stores, the
actions a scheduler picks from, and the violations a step shows.

(The machines that step a state are in ``machine.py``, strong, and ``ptx.py``, PTX.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sollat.device import layout

from .program import Instr
from .scratch import Ghost

# delayed store kinds (P_REC: a fault record written into a peer's scratch; its "line" is -1 - peer)
P_RESET, P_ZERO, P_LANE, P_REC = 0, 1, 2, 3
#: (owner thread index or -1, kind, line, payload, ghost tag, writer rank, issuing instruction)
Pending = tuple[int, int, int, Any, Any, int, Instr]
#: (0, rank, thread): step; (1, rank, i): perform delayed store i. Fault path: (2, rank, thread): the
#: thread gives up at its poll; (3, rank, 0): the rank starts its next call after an absent one;
#: (4, 0, 0): the collective reset().
Action = tuple[int, int, int]
GIVE_UP, REJOIN, RESET_ALL = 2, 3, 4
FAULT_NAMES = {layout.FAULT_TIMEOUT: "timeout", layout.FAULT_MISMATCH: "call mismatch"}


@dataclass(frozen=True)
class Violation:
    #: overwrite reset-race stale torn overshoot wrong-sum mismatch deadlock duplicate no-progress;
    #: fault path: unwritten unnoticed refused-after-reset accepted
    kind: str
    message: str
    line: int = -1  # dense scratch line involved, if any

    def __str__(self) -> str:
        return f"VIOLATION [{self.kind}] {self.message}"


class FaultState:
    """What the fault path adds to a state, per rank (absent in healthy configurations)."""

    __slots__ = ("rec", "ep", "outs", "abort", "early", "phase")

    def __init__(self, nranks: int) -> None:
        self.rec = [layout.FAULT_OK] * nranks  # code word of the rank's fault record
        self.ep = [0] * nranks  # committed epochs (interned table), read by the rank's next call
        self.outs = [0] * nranks  # output lines of the current call written (exact or NaN), a bit mask
        self.abort = [0] * nranks  # threads of the current call that gave up or refused, a bit mask
        self.early = [0] * nranks  # Mutation.EARLY_PRIOR: the record when the current call started
        self.phase = 0  # reset() calls performed

    def copy(self) -> FaultState:
        c = FaultState.__new__(FaultState)
        c.rec, c.ep, c.outs, c.abort, c.early = self.rec[:], self.ep[:], self.outs[:], self.abort[:], self.early[:]
        c.phase = self.phase
        return c

    def key(self) -> tuple[Any, ...]:
        return (tuple(self.rec), tuple(self.ep), tuple(self.outs), tuple(self.abort), tuple(self.early), self.phase)


class State:
    """Everything that changes during a run. ``key()`` identifies it for exhaustive search."""

    __slots__ = ("call", "pc", "regs", "pend", "mem", "ghost", "var", "fx", "done", "front", "acts")

    def __init__(self, call: list[int], pc: list[list[int]], regs: list[list[tuple[Any, ...]]],
                 pend: list[tuple[Pending, ...]], mem: list[Any], ghost: list[Ghost], var: list[int],
                 fx: FaultState | None = None, done: list[list[int]] | None = None) -> None:
        self.call = call
        self.pc = pc
        self.regs = regs
        self.pend = pend
        self.mem = mem
        self.ghost = ghost
        self.var = var  # per rank: the program variant of its current call (-1: waiting to start it)
        self.fx = fx
        #: PTX mode (ptx.PtxMachine): per thread, the operations of its current window already
        #: performed (a bit mask from the window's start, ``pc``); the strong model leaves it empty.
        self.done = done if done is not None else [[] for _ in call]
        #: PTX mode, derived from pc and done (not part of the key): per thread, the operations of
        #: its window whose turn has come (None: to be computed)
        self.front: list[list[Any]] = [[None] * len(d) for d in self.done]
        #: PTX mode, derived (not part of the key): per rank, its enabled steps (None: to be computed;
        #: they change only when the rank steps or a store lands in its scratch)
        self.acts: list[tuple[Action, ...] | None] = [None] * len(call)

    def copy(self) -> State:
        c = State(self.call[:], [p[:] for p in self.pc], [r[:] for r in self.regs], self.pend[:],
                  self.mem[:], self.ghost[:], self.var[:], None if self.fx is None else self.fx.copy(),
                  [d[:] for d in self.done])
        c.front = [f[:] for f in self.front]
        c.acts = self.acts[:]
        return c

    def key(self) -> tuple[Any, ...]:
        return (tuple(self.call), tuple(map(tuple, self.pc)), tuple(map(tuple, self.regs)),
                tuple(tuple(e[:6] for e in p) for p in self.pend), tuple(self.mem), tuple(self.ghost),
                tuple(self.var), None if self.fx is None else self.fx.key(), tuple(map(tuple, self.done)))
