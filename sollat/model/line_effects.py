"""What one memory operation does to a scratch line and its ghost, with the checks on it, the same
in both machines: a line store landing, a reset or zeroing performed, an LL128 add (line-atomic or
one lane), an accepted poll; and the delayed stores (``State.pend``) that perform some of them.

Checks: a store never lands on a line holding unconsumed data, nor on a line whose reset/zeroing is
still pending; a poll only accepts the data it waits for (call, message line and epoch, from the
right sender); an LL128 counter of R implies every lane holds all R contributions.
"""

from __future__ import annotations

from typing import Any

from . import protocols
from .fault_path import FaultPathMachine
from .messages import fmt_flag, fmt_tag, line_status, ranks_text
from .program import COUNTER_LANE, RESET, Instr
from .scratch import CONSUMED, FREE, FULL, RESET_PENDING, Ghost
from .state import P_LANE, P_REC, Action, Pending, State, Violation


class LineEffects(FaultPathMachine):
    """The effects of stores, adds and polls on lines; delayed stores performed."""

    # ---- delayed stores ------------------------------------------------------------------------------
    @staticmethod
    def _ordered_after(pend: tuple[Pending, ...], i: int, e: Pending) -> bool:
        """Same-address order: a delayed store waits for the same thread's earlier delayed store to
        the same line when either is a whole-line store (reset/zeroing); lane adds commute."""
        return any(p[0] == e[0] and p[2] == e[2] and (p[1] != P_LANE or e[1] != P_LANE) for p in pend[:i])

    def _pending_actions(self, r: int, pend: tuple[Pending, ...], acts: list[Action]) -> None:
        """Rank r's delayed stores that may be performed now, as actions ``(1, r, i)``."""
        for i, e in enumerate(pend):
            if i and self._ordered_after(pend, i, e):
                continue
            acts.append((1, r, i))

    def _perform_pending(self, st: State, r: int, i: int, log: list[str] | None) -> Violation | None:
        """Rank r's delayed store i is performed; the thread that issued it may then go on."""
        pend = st.pend[r]
        entry = pend[i]
        st.pend[r] = pend[:i] + pend[i + 1:]
        v = self._perform(st, r, entry, log)
        if v is not None:
            return v
        owner = entry[0]
        if owner >= 0 and st.call[r] < self.ncalls:
            return self._settle(st, r, owner, log)
        return None

    def _perform(self, st: State, r: int, e: Pending, log: list[str] | None) -> Violation | None:
        """One delayed store: a fault record, one lane of an LL128 add, a reset or a zeroing."""
        _owner, kind, ln, payload, tag, writer, ins = e
        if kind == P_REC:
            self._perform_record(st, e, log)
            return None
        if kind == P_LANE:
            if log is not None:
                lane, vals = payload
                part = "the counter" if lane == COUNTER_LANE else f"lane {lane}"
                log.append(f"    performed: {part} of the add by r{writer} ({ins.where}) -> {self.names[ln]} "
                           f"+= {vals}  [{fmt_tag(tag)}]")
            return self._lane_add(st, writer, ins)
        return self._reset_lands(st, ins, ln, "", log)

    # ---- stores --------------------------------------------------------------------------------------
    def _land(self, st: State, r: int, ins: Instr, ln: int, content: Any, part: str = "") -> Violation | None:
        """Rank r's store of ``content`` into line ``ln`` lands (``part``: which part of the line, in words)."""
        g = st.ghost[ln]
        name = self.names[ln]
        if g[0] == FULL:
            return Violation("overwrite", f"r{r} ({ins.where}) stores {fmt_tag(ins.tag)}{part} into {name} "
                             f"which still holds unconsumed {fmt_tag(g[1])}", ln)
        if g[0] == RESET_PENDING:
            return Violation("reset-race", f"r{r} ({ins.where}) stores {fmt_tag(ins.tag)}{part} into "
                             f"{name} before the receiver's reset of {fmt_tag(g[1])} is performed: the reset "
                             "will erase the new data", ln)
        st.mem[ln] = content
        st.ghost[ln] = (FULL, (ins.tag, r), ())
        return None

    def _reset_lands(self, st: State, ins: Instr, ln: int, part: str, log: list[str] | None) -> Violation | None:
        """The reset (sentinel) or zeroing (LL128) ``ins`` of line ``ln`` is performed."""
        what = "reset" if ins.op == RESET else "zeroing"
        name = self.names[ln]
        if log is not None:
            log.append(f"    performed: {what}{part} of {name} issued by {ins.where}")
        g = st.ghost[ln]
        if g[0] == FULL:
            return Violation("reset-race", f"the {what} of {name} issued by {ins.where} is performed after "
                             f"new data {fmt_tag(g[1])} arrived: that data is lost", ln)
        st.mem[ln] = self.scratch.rest(ln) if ins.op == RESET else self.zero_line
        st.ghost[ln] = (FREE, None, ())
        return None

    def _line_add(self, st: State, r: int, ins: Instr, log: list[str] | None) -> Violation | None:
        """Rank r's line-atomic LL128 add lands (every lane at once)."""
        ln = ins.line
        g = st.ghost[ln]
        if log is not None:
            log.append(f"{ins.where}: ADD128 {ins.value} -> {self.names[ln]} (line-atomic)  [{fmt_tag(ins.tag)}]")
        v = self._acc_check(g, ins, r, range(self.lanes), ln)
        if v is not None:
            return v
        st.mem[ln] = protocols.line_add(st.mem[ln], ins.value)
        bit = 1 << r
        masks = g[2] if g[0] == FULL else (0,) * self.lanes
        st.ghost[ln] = (FULL, ins.tag, tuple(m | bit for m in masks))
        return None

    def _lane_add(self, st: State, w: int, ins: Instr) -> Violation | None:
        """One lane of rank w's non-atomic LL128 add lands (or, split mode, its counter add)."""
        ln = ins.line
        g = st.ghost[ln]
        lane = ins.lane
        counter = lane == COUNTER_LANE
        v = self._acc_check(g, ins, w, () if counter else (lane,), ln)
        if v is not None:
            return v
        st.mem[ln] = protocols.lane_add(st.mem[ln], 0 if counter else lane, ins.value)
        masks = list(g[2]) if g[0] == FULL else [0] * self.lanes
        if not counter:
            masks[lane] |= 1 << w
        st.ghost[ln] = (FULL, ins.tag, tuple(masks))
        return None

    def _acc_check(self, g: Ghost, ins: Instr, r: int, lanes: Any, ln: int) -> Violation | None:
        what = f"r{r} ({ins.where}) adds {fmt_tag(ins.tag)} into {self.names[ln]}"
        if g[0] == RESET_PENDING:
            return Violation("reset-race", f"{what} before the owner's zeroing after {fmt_tag(g[1])} is performed: "
                             "the zeroing will erase the contribution", ln)
        if g[0] == CONSUMED:
            return Violation("overwrite", f"{what}, which still holds the consumed sum of {fmt_tag(g[1])} "
                             "(never zeroed)", ln)
        if g[0] == FULL:
            if g[1] != ins.tag:
                return Violation("overwrite", f"{what}, which still holds unconsumed contributions of "
                                 f"{fmt_tag(g[1])}", ln)
            bit = 1 << r
            if any(g[2][lane] & bit for lane in lanes):
                return Violation("duplicate", f"{what} twice", ln)
        return None

    # ---- polls ---------------------------------------------------------------------------------------
    def _foreign_line(self, st: State, r: int, ins: Instr, ln: int, seen: str, log: list[str] | None) -> Violation:
        """An LL poll of rank r finds its epoch with another signature (``seen``) in line ``ln``."""
        name = self.names[ln]
        if log is not None:
            log.append(f"{ins.where}: POLL {name} sees {seen}")
        return Violation("mismatch", f"r{r} ({ins.where}) polls {name} for {fmt_flag(ins.flag)} and finds "
                         f"{seen}: reported as a call mismatch although every rank made the same calls (line "
                         f"holds {fmt_tag(st.ghost[ln][1])})", ln)

    def _accept(self, st: State, r: int, j: int, ins: Instr, cells: tuple[int, ...], val: Any, what: str,
                log: list[str] | None) -> Violation | None:
        """Thread (r, j)'s poll accepts ``val`` from the line ``cells`` (its parts; ``what``: the
        trace's words for it): it must be the data the poll waits for."""
        if log is not None:
            g = st.ghost[cells[0]]
            log.append(f"{ins.where}: POLL {self.names[cells[0]]} accepts {what}  "
                       f"[holds {fmt_tag(g[1])}, {line_status(g)}]")
        want = (ins.tag, ins.peer)
        for c in cells:
            g = st.ghost[c]
            if g[0] != FULL or g[1] != want:
                return Violation("stale", f"r{r} ({ins.where}) accepts {self.names[c]} as {fmt_tag(want)}, "
                                 f"but the line holds {fmt_tag(g[1])} ({line_status(g)})", c)
        self._set_reg(st, r, j, ins.reg, protocols.vadd(st.regs[r][j][ins.reg], val))
        for c in cells:  # free again; a line or word its reader resets: consumed until the reset lands
            g = st.ghost[c]
            st.ghost[c] = (CONSUMED if self.resets[c] else FREE, g[1], ())
        return None

    def _poll128(self, st: State, r: int, j: int, ins: Instr, log: list[str] | None) -> Violation | None:
        """Thread (r, j)'s LL128 counter poll is satisfied: it reads the whole line."""
        ln = ins.line
        g = st.ghost[ln]
        snap = st.mem[ln]
        name = self.names[ln]
        if log is not None:
            log.append(f"{ins.where}: POLL128 {name} counter={protocols.ll128_counter(snap)} reads {snap}")
        if protocols.ll128_counter(snap) > ins.expect:
            return Violation("overshoot", f"r{r} ({ins.where}) polls {name}: the counter reads "
                             f"{protocols.ll128_counter(snap)} > {ins.expect} ranks (line holds {fmt_tag(g[1])}, "
                             f"{line_status(g)})", ln)
        if g[0] != FULL or g[1] != ins.tag:
            return Violation("stale", f"r{r} ({ins.where}) accepts {name} as {fmt_tag(ins.tag)}, but "
                             f"the line holds {fmt_tag(g[1])} ({line_status(g)})", ln)
        torn = [(lane, m) for lane, m in enumerate(g[2]) if m != self.full_mask]
        if torn:
            what = "; ".join(f"lane {lane} has contributions from {ranks_text(m, self.R)}" for lane, m in torn)
            return Violation("torn", f"r{r} ({ins.where}) reads {name}: the counter says all "
                             f"{self.R} ranks added, but {what} (torn line)", ln)
        self._set_reg(st, r, j, ins.reg, snap)
        st.ghost[ln] = (CONSUMED, g[1], g[2])
        return None
