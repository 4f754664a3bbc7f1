"""The fault path of the model (``Config.faults``, ``timeouts``, ``reset_at``; docs/protocol-model.md).

A thread at a poll may *give up* (a timeout, or its rank's fault record is set), raising the
record on its rank and, as delayed stores, on every peer; it writes NaN into the outputs it has not
written and commits nothing. A rank absent from a call rejoins after it; ``reset()`` re-initialises
scratch, epochs and records once every rank is idle. Every rank's record must hold the fault.
(Kernel entry and end, where a rank refuses a call or its outputs are checked: ``machine_base.py``.)
"""

from __future__ import annotations

from typing import NamedTuple

from sollat.device import layout

from .config import Mutation
from .machine_base import MachineBase
from .program import OP_NAMES, Instr
from .state import FAULT_NAMES, GIVE_UP, P_REC, REJOIN, RESET_ALL, Action, Pending, State, Violation


class GiveUp(NamedTuple):
    """Where a thread gives up, as its machine sees it."""

    ins: Instr  # the poll it gives up at
    index: int  # that poll's index in the thread program (COMMIT_AFTER_GIVE_UP commits up to it)
    pos: int  # where the machine has it: the strong model's pc, the PTX mode's operation
    nan: list[int]  # the output lines it has not written


class FaultPathMachine(MachineBase):
    """The fault path's actions (give-ups, rejoins, the reset) and its checks on fault records."""

    # ---- what each machine supplies ------------------------------------------------------------------
    def _step(self, st: State, act: Action, log: list[str] | None) -> Violation | None:
        """One healthy step (a load or store, a delayed store performed). Each machine defines it."""
        raise NotImplementedError

    def _waits(self, st: State, r: int, j: int) -> bool:
        """Thread (r, j) waits at a poll (it may give up there). Each machine defines it."""
        raise NotImplementedError

    def _foreign_poll(self, st: State, r: int, x: int) -> tuple[int, int] | None:
        """The thread and poll of load action ``(0, r, x)`` if the poll sees its epoch with another
        signature and an injected mismatch explains it (``checkPolls`` raises kMismatch); None if
        not. Each machine defines it."""
        raise NotImplementedError

    def _give_up_point(self, st: State, r: int, j: int, at: int) -> GiveUp:
        """Where thread (r, j) gives up: at poll ``at`` (-1: where it waits). Each machine defines it."""
        raise NotImplementedError

    def _abandon(self, st: State, r: int, j: int, pos: int) -> None:
        """Thread (r, j), given up at ``pos``, goes to its END (what it issued before still lands
        first). Each machine defines it."""
        raise NotImplementedError

    # ---- actions ---------------------------------------------------------------------------------------
    def _fault_actions(self, st: State, acts: list[Action]) -> None:
        """Give-ups at polls, rejoins after an absent call, the reset; timeouts per ``Config.timeouts``."""
        fx = st.fx
        assert fx is not None
        live = fx.phase == 0  # calls after reset() are healthy: no timeout fires in them
        anytime = live and self.cfg.timeouts == "any"
        stuck: list[Action] = []
        for r in range(self.R):
            k = st.call[r]
            if k >= self.ncalls:
                continue
            if st.var[r] < 0:
                if not self._gate(st, r, k):
                    acts.append((REJOIN, r, 0))
                continue
            for j in range(len(self.vcode[st.var[r]])):
                if self._waits(st, r, j):
                    if fx.rec[r] or anytime:  # Spin::again: the record check, or a timeout
                        acts.append((GIVE_UP, r, j))
                    elif live:
                        stuck.append((GIVE_UP, r, j))
        ra = self.cfg.reset_at
        if ra is not None and fx.phase == 0 and all(c == ra for c in st.call) and not any(st.pend):
            acts.append((RESET_ALL, 0, 0))
        if not acts:  # "stuck": a timeout fires only when nothing else can happen
            acts.extend(stuck)

    def _apply_fault(self, st: State, act: Action, log: list[str] | None) -> Violation | None:
        kind, r, x = act
        if kind == GIVE_UP:
            v = self._give_up(st, r, x, layout.FAULT_TIMEOUT, log)
        elif kind == REJOIN:
            if log is not None:
                log.append(f"r{r}: the launch of call {st.call[r] - 1} ended on every rank")
            v = self._start_call(st, r, log)
        elif kind == RESET_ALL:
            v = self._reset(st, log)
        elif kind == 0 and (poll := self._foreign_poll(st, r, x)) is not None:
            v = self._give_up(st, r, poll[0], layout.FAULT_MISMATCH, log, at=poll[1])
        else:
            v = self._step(st, act, log)
        if v is None and self.finished(st):
            v = self._record_check(st, "the end of the run")
        return v

    def _mismatch_injected(self, st: State, r: int, line: int) -> bool:
        """An injected call mismatch explains what rank r's poll of ``line`` sees: on rank r, or on
        the rank and call of the data the line holds. (Unexplained ones stay violations.)"""
        held = st.ghost[line][1]
        return (self.cfg.fault_at("mismatch", r, st.call[r]) is not None
                or (held is not None and self.cfg.fault_at("mismatch", held[1], held[0][0]) is not None))

    def _give_up(self, st: State, r: int, j: int, code: int, log: list[str] | None,
                 at: int = -1) -> Violation | None:
        """The thread stops waiting (at poll ``at``; -1: where it waits): ``FaultSink::raise`` if its
        record is still clear (own record at once, every peer's as a delayed store), NaN into the
        outputs it has not written (``poison_from``), no further send, no commit; then it ends."""
        fx = st.fx
        assert fx is not None
        w = self._give_up_point(st, r, j, at)
        ins = w.ins
        raised = not fx.rec[r]
        if raised:
            fx.rec[r] = code
            if not self.cfg.has(Mutation.NO_PROPAGATION):
                st.pend[r] = (*st.pend[r], *((j, P_REC, -1 - q, code, None, r, ins) for q in range(self.R) if q != r))
        if not self.cfg.has(Mutation.NO_POISON):
            for x in w.nan:
                fx.outs[r] |= 1 << x
        if self.cfg.has(Mutation.COMMIT_AFTER_GIVE_UP):
            self._commit(st, r, j, upto=w.index)
        fx.abort[r] |= 1 << j
        if log is not None:
            why = f"records a {FAULT_NAMES[code]} in r{r}'s record and every peer's" if raised else \
                f"its record holds a {FAULT_NAMES.get(fx.rec[r], fx.rec[r])}"
            log.append(f"{ins.where}: GIVES UP at {OP_NAMES[ins.op]} {self.names[ins.line]} ({why}); "
                       f"NaN into output line(s) {w.nan}")
        self._abandon(st, r, j, w.pos)
        return self._settle(st, r, j, log)

    # ---- fault records and the reset -------------------------------------------------------------------
    def _perform_record(self, st: State, e: Pending, log: list[str] | None) -> None:
        """``write_fault_record`` on a peer: CAS 0 -> claimed, details, release the code (first writer wins)."""
        assert st.fx is not None
        q, code, writer, ins = -1 - e[2], e[3], e[5], e[6]
        first = not st.fx.rec[q]
        if first:
            st.fx.rec[q] = code
        if log is not None:
            log.append(f"    performed: fault record of r{q} := {FAULT_NAMES[code]} (written by r{writer} "
                       f"{ins.where}){'' if first else ': it already held one'}")

    def _reset(self, st: State, log: list[str] | None) -> Violation | None:
        """Collective ``reset()``: every rank idle; scratch, epochs and records re-initialised."""
        fx = st.fx
        assert fx is not None
        if log is not None:
            log.append(f"reset(): every rank idle, records {[FAULT_NAMES.get(c, 'clear') for c in fx.rec]}; "
                       "scratch, epochs and records re-initialised")
        v = self._record_check(st, "reset()")
        if v is not None:
            return v
        st.mem = self.scratch.initial_memory()
        st.ghost = self.scratch.initial_ghost()
        fx.rec, fx.ep, fx.early = [layout.FAULT_OK] * self.R, [0] * self.R, [0] * self.R
        fx.phase += 1
        for r in range(self.R):
            v = self._start_call(st, r, log)
            if v is not None:
                return v
        return None

    def _record_check(self, st: State, when: str) -> Violation | None:
        """Every rank sees the fault: all records hold one, or none does (and one does if a fault
        was injected since the last reset); one injected fault, timeouts only when stuck: the same code."""
        assert st.fx is not None
        rec = st.fx.rec
        injected = st.fx.phase == 0 and bool(self.cfg.faults)
        if all(rec) and len(set(rec)) > 1 and len(self.cfg.faults) == 1 and self.cfg.timeouts == "stuck":
            return Violation("unnoticed", f"at {when}, the ranks' fault records hold different faults "
                             f"{[FAULT_NAMES.get(c, c) for c in rec]} for one injected fault: their hosts "
                             "would raise different errors")
        if all(rec) or not (any(rec) or injected):
            return None
        clear = [q for q in range(self.R) if not rec[q]]
        why = "a fault was injected" if not any(rec) else \
            f"rank(s) {[q for q in range(self.R) if rec[q]]} recorded a fault"
        return Violation("unnoticed", f"at {when}, the fault record of rank(s) {clear} is clear although {why}: "
                         "those hosts would not raise")
