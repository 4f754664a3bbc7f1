"""The executable model: ranks running thread programs against scratch memory, one step at a time.

This module is the *strong* model (``Config(memory="strong")``) and ``Machine(cfg)``, which returns
the machine of ``cfg.memory``: for ``"ptx"`` (the default, what CI checks)
:class:`sollat.model.ptx.PtxMachine`. What both machines share is in the layers below ``Machine``
(``machine_base.py``, ``fault_path.py``, ``line_effects.py``; the state in ``state.py``).

A *step* is one shared-memory operation of one thread (a line store to a peer, an accepted
poll, a line-atomic add) followed by that thread's local work up to its next shared operation,
or the *performing* of one delayed store (a sentinel reset, an LL128 zeroing, one lane of a
non-atomic LL128 add). In the strong model any interleaving of steps is an execution of a
machine stronger than PTX:

* LL and sentinel lines are 16-byte single-copy-atomic stores, never torn (PTX promises that
  only for aligned accesses of at most 8 bytes: the PTX model splits what its checks can tell).
* A thread's line stores to peers are performed in program order, when issued, never before the
  thread's earlier polls; the model delays only stores to the thread's own scratch that give a
  line back (reset, zeroing) and, when ``ll128_line_atomic`` is off, the lanes of an LL128 add.
  Delayed stores are performed in any order, and before the thread passes a ``FENCE`` (of any
  scope) or ends its kernel (``END``). Same-address order is kept (a store waits for the thread's
  delayed store to the same line), as is store-to-load forwarding for the thread's own reset.
* Kernel boundary: a rank starts call k+1 only when every thread of call k has ended (so all its
  stores are performed). Ranks are never synchronised with each other.
* A poll is a blocking step: it is enabled only when the line holds what the poll accepts, so no
  schedule spins; a state where nothing is enabled but a thread is unfinished is a deadlock.

Checks on every step (the ghost state is in :mod:`sollat.model.scratch`; the line checks in
``line_effects.py``): a store never lands on a line holding unconsumed data, nor on a line whose
reset/zeroing is still pending; a poll only accepts the data it waits for; an LL128 counter of R
implies every lane holds all R contributions; every output equals the exact sum; every run ends
with every thread finished. The fault path (give-ups, fault records, ``reset()``) is
``fault_path.py``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from . import protocols
from .config import Config
from .fault_path import GiveUp
from .line_effects import LineEffects
from .messages import fmt_flag, fmt_tag, waiting_text
from .program import (
    ADD,
    COUNTER_LANE,
    END,
    FENCE,
    ISSUE_ADD,
    OP_NAMES,
    POLL,
    POLL128,
    REGISTER_OPS,
    RESET,
    SEND,
    ZERO,
    Instr,
)
from .scratch import RESET_PENDING
from .state import P_LANE, P_RESET, P_ZERO, Action, Pending, State, Violation


class Machine(LineEffects):
    """The strong model's step semantics, over the layers both machines share.

    ``Machine(cfg)`` is the strong model for ``cfg.memory == "strong"`` and a
    :class:`sollat.model.ptx.PtxMachine` for ``"ptx"``.
    """

    #: The machine of each memory model but "strong" (``Config.memory``): a subclass names its
    #: model in its class statement (``class PtxMachine(Machine, memory="ptx")``). The package
    #: (``sollat.model``) imports every such module, so ``Machine(cfg)`` finds the subclass
    #: without this module importing the modules built on it.
    _by_memory: ClassVar[dict[str, type[Machine]]] = {}

    def __init_subclass__(cls, memory: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if memory is not None:
            Machine._by_memory[memory] = cls

    def __new__(cls, cfg: Config) -> Machine:
        if cls is Machine and cfg.memory != "strong":
            if cfg.memory not in Machine._by_memory:
                raise ValueError(f"no machine for memory model {cfg.memory!r}; known: strong, "
                                 f"{', '.join(sorted(Machine._by_memory))}")
            cls = Machine._by_memory[cfg.memory]
        return super().__new__(cls)

    # ---- enabled steps -------------------------------------------------------------------------
    def _own_pending_line(self, st: State, r: int, j: int, line: int) -> bool:
        return any(e[0] == j and e[2] == line for e in st.pend[r])

    def enabled(self, st: State) -> list[Action]:
        acts: list[Action] = []
        mem = st.mem
        ncalls = self.ncalls
        for r in range(self.R):
            k = st.call[r]
            pend = st.pend[r]
            var = st.var[r]
            if k < ncalls and var >= 0:
                code = self.vcode[var]
                pcs = st.pc[r]
                for j, c in enumerate(code):
                    pc = pcs[j]
                    if pc >= len(c):
                        continue
                    ins = c[pc]
                    op = ins.op
                    if op == POLL:
                        content = mem[ins.line]
                        flag = ins.flag
                        if flag is not None:  # (a signature word: the thread sees its own pending reset)
                            if protocols.ll_check_flag(content[1], flag) and not (
                                    pend and self.resets[ins.line] and self._forwarded_reset(pend, j, ins.line)):
                                acts.append((0, r, j))
                        elif content is not None and not (pend and self._forwarded_reset(pend, j, ins.line)):
                            acts.append((0, r, j))
                    elif op in (SEND, ADD):
                        if pend and self._own_pending_line(st, r, j, ins.line):
                            continue
                        acts.append((0, r, j))
                    elif op == POLL128 and protocols.ll128_counter(mem[ins.line]) >= ins.expect:
                        acts.append((0, r, j))  # > R: the device reports an overshoot (a mismatch)
            self._pending_actions(r, pend, acts)
        if st.fx is not None:
            self._fault_actions(st, acts)
        return acts

    @staticmethod
    def _forwarded_reset(pend: tuple[Pending, ...], j: int, line: int) -> bool:
        return any(e[0] == j and e[1] == P_RESET and e[2] == line for e in pend)

    # ---- steps ---------------------------------------------------------------------------------
    def apply(self, st: State, act: Action, log: list[str] | None = None) -> Violation | None:
        """Performs one step on ``st`` in place; returns the first violation it shows, if any."""
        if st.fx is not None:
            return self._apply_fault(st, act, log)
        return self._step(st, act, log)

    def _step(self, st: State, act: Action, log: list[str] | None) -> Violation | None:
        kind, r, j = act
        if kind == 1:
            return self._perform_pending(st, r, j, log)
        ins = self.vcode[st.var[r]][j][st.pc[r][j]]
        v = self._shared(st, r, j, ins, log)
        if v is not None:
            return v
        st.pc[r][j] += 1
        return self._settle(st, r, j, log)

    def _shared(self, st: State, r: int, j: int, ins: Instr, log: list[str] | None) -> Violation | None:
        op = ins.op
        ln = ins.line
        if op == SEND:
            val = ins.value if ins.reg < 0 else st.regs[r][j][ins.reg]
            if log is not None:
                fl = f" {fmt_flag(ins.flag)}" if ins.flag is not None else ""
                log.append(f"{ins.where}: SEND {val}{fl} -> {self.names[ln]}  [{fmt_tag(ins.tag)}]")
            return self._land(st, r, ins, ln, (val, ins.flag) if ins.flag is not None else val)
        if op == POLL:
            content = st.mem[ln]
            if ins.flag is None:
                return self._accept(st, r, j, ins, (ln,), content, f"{content}" if log is not None else "", log)
            if protocols.ll_try_load(content, ins.flag) < 0:
                return self._foreign_line(st, r, ins, ln, fmt_flag(content[1]), log)
            what = f"{content[0]} {fmt_flag(content[1])}" if log is not None else ""
            return self._accept(st, r, j, ins, (ln,), content[0], what, log)
        if op == ADD:
            return self._line_add(st, r, ins, log)
        if op == POLL128:
            return self._poll128(st, r, j, ins, log)
        raise AssertionError(f"not a shared op: {ins}")

    def _settle(self, st: State, r: int, j: int, log: list[str] | None, advance: bool = True) -> Violation | None:
        """Run thread (r, j)'s local instructions up to its next shared one (or a blocking fence/end)."""
        code = self.vcode[st.var[r]][j]
        pc = st.pc[r][j]
        n = len(code)
        while pc < n:
            ins = code[pc]
            op = ins.op
            if op < RESET:
                break
            if op == FENCE:
                if any(e[0] == j for e in st.pend[r]):
                    break
                if log is not None:
                    log.append(f"    {ins.where}: FENCE (its earlier stores are performed)")
            elif op == END:
                if any(e[0] == j for e in st.pend[r]):
                    if self.boundary_orders:
                        break
                    self._release_pending(st, r, j)
                self._end_thread(st, r, j, ins, log)
            elif op in (RESET, ZERO):
                g = st.ghost[ins.line]
                st.pend[r] = (*st.pend[r], (j, P_RESET if op == RESET else P_ZERO, ins.line, None, g[1], r, ins))
                st.ghost[ins.line] = (RESET_PENDING, g[1], g[2])
                if log is not None:
                    log.append(f"    {ins.where}: {OP_NAMES[op]} {self.names[ins.line]} issued (not yet performed)")
            elif op == ISSUE_ADD:
                st.pend[r] = (*st.pend[r], (j, P_LANE, ins.line, (ins.lane, ins.value), ins.tag, r, ins))
                if log is not None:
                    part = "counter" if ins.lane == COUNTER_LANE else f"lane {ins.lane}"
                    log.append(f"    {ins.where}: {part} add {ins.value} -> {self.names[ins.line]} issued")
            elif op in REGISTER_OPS:
                v = self._register_step(st, r, j, ins, log)
                if v is not None:
                    return v
            pc += 1
        st.pc[r][j] = pc
        if advance and pc == n and self._all_finished(st, r):
            return self._end_kernel(st, r, log)
        return None

    # ---- the fault path and diagnostics: where a thread waits --------------------------------------
    def _waits(self, st: State, r: int, j: int) -> bool:
        c = self.vcode[st.var[r]][j]
        pc = st.pc[r][j]
        return pc < len(c) and c[pc].op in (POLL, POLL128)

    def _foreign_poll(self, st: State, r: int, x: int) -> tuple[int, int] | None:
        ins = self.vcode[st.var[r]][x][st.pc[r][x]]  # x: the thread, at its next instruction
        if ins.op != POLL or ins.flag is None or protocols.ll_try_load(st.mem[ins.line], ins.flag) >= 0:
            return None
        return (x, -1) if self._mismatch_injected(st, r, ins.line) else None

    def _give_up_point(self, st: State, r: int, j: int, at: int) -> GiveUp:
        var = st.var[r]
        pc = st.pc[r][j]
        return GiveUp(self.vcode[var][j][pc], pc, pc, [x for i, x in self.vouts[var][j] if i >= pc])

    def _abandon(self, st: State, r: int, j: int, pos: int) -> None:
        st.pc[r][j] = len(self.vcode[st.var[r]][j]) - 1  # END: its delayed stores (record writes too) land first

    def _blocked(self, st: State, r: int, j: int) -> list[str]:
        c = self.vcode[st.var[r]][j]
        pc = st.pc[r][j]
        if pc >= len(c):
            return []
        ins = c[pc]
        if ins.op in (POLL, POLL128):
            return [waiting_text(ins, self.names[ins.line], st.mem[ins.line], st.ghost[ins.line])]
        return [f"{ins.where} blocked at {OP_NAMES[ins.op]}"]
