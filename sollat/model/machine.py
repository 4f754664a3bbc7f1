"""The executable model: ranks running thread programs against scratch memory, one step at a time.

This module is the *strong* model (``Config(memory="strong")``) and what both models share: the
programs, the ghost checks, the fault path. The PTX model (the default, what CI checks) is
:class:`sollat.model.ptx.PtxMachine`, which ``Machine(cfg)`` returns for ``memory="ptx"``.

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

Checks on every step (the ghost state is in :mod:`sollat.model.scratch`): a store never lands on
a line holding unconsumed data, nor on a line whose reset/zeroing is still pending; a poll only
accepts the data it waits for (call, message line and epoch, from the right sender); an LL128
counter of R implies every lane holds all R contributions; every output equals the exact sum;
every run ends with every thread finished.

Fault path (``Config.faults``, ``timeouts``, ``reset_at``; ``docs/protocol-model.md``): a thread
at a poll may *give up* (a timeout, or its rank's fault record is set), raising the record on
its rank and, as delayed stores, on every peer; it writes NaN into the outputs it has not written
and commits nothing. A kernel that starts with its rank's record set refuses. Every call must end
with each output exact or NaN, every rank's record must hold the fault, and ``reset()``
re-initialises scratch, epochs and records before healthy calls.
"""

from __future__ import annotations

from typing import Any, ClassVar

from sollat import layout

from . import protocols
from .algorithms import (
    ADD,
    ADDC,
    COMBINE,
    COUNTER_LANE,
    END,
    FENCE,
    ISSUE_ADD,
    OP_NAMES,
    OUT,
    POLL,
    POLL128,
    RESET,
    SEND,
    ZERO,
    Epochs,
    Instr,
    Programs,
    ThreadProgram,
    build,
)
from .config import Config, Mutation
from .messages import fmt_flag, fmt_tag, line_status, ranks_text
from .scratch import CONSUMED, FREE, FULL, RESET_PENDING, Ghost
from .state import (
    FAULT_NAMES,
    GIVE_UP,
    P_LANE,
    P_REC,
    P_RESET,
    P_ZERO,
    REJOIN,
    RESET_ALL,
    Action,
    FaultState,
    Pending,
    State,
    Violation,
)


class Machine:
    """Static part of the model (programs, scratch layout) plus the step semantics.

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

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.programs: Programs = build(cfg)
        self.R = cfg.nranks
        self.ncalls = len(cfg.calls)
        self.code: list[list[list[tuple[Instr, ...]]]] = [
            [[tuple(th.code) for th in call] for call in rank] for rank in self.programs.calls]
        # Program variants: variant r * ncalls + k is call k of rank r as built (every earlier call
        # committed); on the fault path further variants are built when a call starts from other
        # epochs. vcode[v] is the same list object as code[r][k] for the built ones.
        self.vcode: list[list[tuple[Instr, ...]]] = [c for rank in self.code for c in rank]
        self.vrank: list[int] = [r for r, rank in enumerate(self.code) for _ in rank]  # each variant's rank
        self.vnregs: list[list[int]] = []
        self.vadv: list[list[tuple[tuple[int, tuple[str, int], int], ...]]] = []
        self.vouts: list[list[tuple[tuple[int, int], ...]]] = []
        for rank in self.programs.calls:
            for call in rank:
                self._describe(call)
        self.scratch = self.programs.scratch
        self.names = [info.name() for info in self.scratch.infos]
        self.kinds = [info.kind for info in self.scratch.infos]
        self.full_mask = (1 << self.R) - 1
        self.lanes = cfg.ll128_lanes
        self.zero_line = protocols.ll128_zero(cfg.ll128_lanes, cfg.ll128_lines)
        self.boundary_orders = not cfg.has(Mutation.NO_BOUNDARY_ORDER)
        #: upper bound on the steps of any run (shared steps + delayed stores)
        self.max_steps = self.programs.shared_steps + sum(
            1 for rank in self.code for call in rank for th in call for ins in th
            if ins.op in (RESET, ZERO, ISSUE_ADD)) + 1
        self.fault = cfg.fault_path
        self._initial: State | None = None
        self._tables: dict[tuple[tuple[tuple[str, int], int], ...], int] = {(): 0}
        self._table_list: list[tuple[tuple[tuple[str, int], int], ...]] = [()]
        self._variants: dict[tuple[int, int, int], int] = {}
        if self.fault:  # give-ups, record writes to peers, rejoins, the reset
            self.max_steps += sum(len(call) * self.R for rank in self.code for call in rank) + self.R * self.ncalls + 1
            for r, starts in enumerate(self.programs.starts):
                for k, start in enumerate(starts):
                    self._variants[(r, k, self._intern(start))] = r * self.ncalls + k

    def _describe(self, threads: list[ThreadProgram]) -> None:
        self.vnregs.append([th.nregs for th in threads])
        self.vadv.append([tuple(th.advances) for th in threads])
        self.vouts.append([tuple((i, ins.value) for i, ins in enumerate(th.code) if ins.op == OUT) for th in threads])

    def _intern(self, epochs: Epochs) -> int:
        key = tuple(sorted(epochs.items()))
        tid = self._tables.get(key)
        if tid is None:
            tid = self._tables[key] = len(self._table_list)
            self._table_list.append(key)
        return tid

    def _variant(self, st: State, r: int, k: int) -> int:
        """Program variant of call k on rank r, from the epochs its threads committed so far."""
        if st.fx is None:
            return r * self.ncalls + k
        key = (r, k, st.fx.ep[r])
        v = self._variants.get(key)
        if v is None:
            threads = self.programs.variant(r, k, dict(self._table_list[st.fx.ep[r]]))
            v = self._variants[key] = len(self.vcode)
            self.vcode.append([tuple(th.code) for th in threads])
            self.vrank.append(r)
            self._describe(threads)
        return v

    # ---- state ---------------------------------------------------------------------------------
    def initial(self) -> State:
        """The state every run starts from (built once; each call returns a copy)."""
        if self._initial is None:
            self._initial = self._build_initial()
        return self._initial.copy()

    def _build_initial(self) -> State:
        st = State([0] * self.R, [[] for _ in range(self.R)], [[] for _ in range(self.R)],
                   [() for _ in range(self.R)], self.scratch.initial_memory(), self.scratch.initial_ghost(),
                   [-1] * self.R, FaultState(self.R) if self.fault else None)
        for r in range(self.R):
            v = self._start_call(st, r, None)
            if v is not None:
                raise AssertionError(f"initial state violates: {v}")
        return st

    def finished(self, st: State) -> bool:
        return all(k >= self.ncalls for k in st.call) and not any(st.pend)

    def _start_call(self, st: State, r: int, log: list[str] | None) -> Violation | None:
        while st.call[r] < self.ncalls:
            k = st.call[r]
            if st.fx is not None and self._gate(st, r, k):
                st.var[r], st.pc[r], st.regs[r], st.done[r] = -1, [], [], []
                if log is not None:
                    log.append(f"    r{r} waits before call {k} ({self._gate(st, r, k)})")
                return None
            var = st.var[r] = self._variant(st, r, k)
            n = len(self.vcode[var])
            self._begin_threads(st, r, var)
            st.regs[r] = [(0,) * m for m in self.vnregs[var]]
            if log is not None:
                log.append(f"    r{r} starts call {k} ({n} thread{'s' if n != 1 else ''})")
            if st.fx is not None:
                v = self._kernel_start(st, r, k, log)
                if v is not None:
                    return v
            for j in range(n):
                v = self._settle(st, r, j, log, advance=False)
                if v is not None:
                    return v
            if not self._all_finished(st, r):
                return None
            if st.fx is not None:
                v = self._end_call(st, r, k)
                if v is not None:
                    return v
            st.call[r] += 1  # every thread of the call already finished (no data for this rank)
            if log is not None:
                log.append(f"    r{r} ends call {k} (kernel boundary)")
        st.var[r], st.pc[r], st.regs[r], st.done[r] = -1, [], [], []
        return None

    def _begin_threads(self, st: State, r: int, var: int) -> None:
        st.pc[r] = [0] * len(self.vcode[var])

    def _all_finished(self, st: State, r: int) -> bool:
        return all(pc == len(c) for pc, c in zip(st.pc[r], self.vcode[st.var[r]], strict=True))

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
                        if flag is not None:
                            if protocols.ll_check_flag(content[1], flag):
                                acts.append((0, r, j))
                        elif content is not None and not (pend and self._forwarded_reset(pend, j, ins.line)):
                            acts.append((0, r, j))
                    elif op in (SEND, ADD):
                        if pend and self._own_pending_line(st, r, j, ins.line):
                            continue
                        acts.append((0, r, j))
                    elif op == POLL128 and protocols.ll128_counter(mem[ins.line]) >= ins.expect:
                        acts.append((0, r, j))  # > R: the device reports an overshoot (a mismatch)
            for i, e in enumerate(pend):
                if i and self._ordered_after(pend, i, e):
                    continue
                acts.append((1, r, i))
        if st.fx is not None:
            self._fault_actions(st, acts)
        return acts

    @staticmethod
    def _ordered_after(pend: tuple[Pending, ...], i: int, e: Pending) -> bool:
        """Same-address order: a delayed store waits for the same thread's earlier delayed store to
        the same line when either is a whole-line store (reset/zeroing); lane adds commute."""
        return any(p[0] == e[0] and p[2] == e[2] and (p[1] != P_LANE or e[1] != P_LANE) for p in pend[:i])

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
            pend = st.pend[r]
            entry = pend[j]
            st.pend[r] = pend[:j] + pend[j + 1:]
            v = self._perform(st, r, entry, log)
            if v is not None:
                return v
            owner = entry[0]
            if owner >= 0 and st.call[r] < self.ncalls:
                return self._settle(st, r, owner, log)
            return None
        ins = self.vcode[st.var[r]][j][st.pc[r][j]]
        v = self._shared(st, r, j, ins, log)
        if v is not None:
            return v
        st.pc[r][j] += 1
        return self._settle(st, r, j, log)

    def _register_step(self, st: State, r: int, j: int, ins: Instr, log: list[str] | None) -> Violation | None:
        """A step on thread (r, j)'s registers: ADDC, COMBINE, or OUT (checks the output line)."""
        if ins.op == ADDC:
            self._set_reg(st, r, j, ins.reg, protocols.vadd(st.regs[r][j][ins.reg], ins.value))
        elif ins.op == COMBINE:
            snaps = [st.regs[r][j][s] for s in ins.srcs]
            self._set_reg(st, r, j, ins.reg, protocols.ll128_restore(snaps, self.cfg.ll128_lines, self.lanes))
        else:  # OUT
            got = st.regs[r][j][ins.reg]
            if log is not None:
                log.append(f"    {ins.where}: OUT line {ins.value} = {got}")
            if st.fx is not None:
                st.fx.outs[r] |= 1 << ins.value
            if got != ins.expect:
                return Violation("wrong-sum", f"r{r} ({ins.where}) writes output line {ins.value} = {got}, "
                                 f"the exact sum is {ins.expect}")
        return None

    def _set_reg(self, st: State, r: int, j: int, reg: int, value: Any) -> None:
        regs = list(st.regs[r][j])
        regs[reg] = value
        st.regs[r][j] = tuple(regs)

    def _shared(self, st: State, r: int, j: int, ins: Instr, log: list[str] | None) -> Violation | None:
        op = ins.op
        ln = ins.line
        g = st.ghost[ln]
        if op == SEND:
            val = ins.value if ins.reg < 0 else st.regs[r][j][ins.reg]
            if log is not None:
                fl = f" {fmt_flag(ins.flag)}" if ins.flag is not None else ""
                log.append(f"{ins.where}: SEND {val}{fl} -> {self.names[ln]}  [{fmt_tag(ins.tag)}]")
            if g[0] == FULL:
                return Violation("overwrite", f"r{r} ({ins.where}) stores {fmt_tag(ins.tag)} into {self.names[ln]} "
                                 f"which still holds unconsumed {fmt_tag(g[1])}", ln)
            if g[0] == RESET_PENDING:
                return Violation("reset-race", f"r{r} ({ins.where}) stores {fmt_tag(ins.tag)} into {self.names[ln]} "
                                 f"before the receiver's reset of {fmt_tag(g[1])} is performed: the reset will "
                                 "erase the new data", ln)
            st.mem[ln] = (val, ins.flag) if ins.flag is not None else val
            st.ghost[ln] = (FULL, (ins.tag, r), ())
            return None
        if op == POLL:
            content = st.mem[ln]
            if ins.flag is not None:
                if protocols.ll_try_load(content, ins.flag) < 0:
                    if log is not None:
                        log.append(f"{ins.where}: POLL {self.names[ln]} sees {fmt_flag(content[1])}")
                    return Violation("mismatch", f"r{r} ({ins.where}) polls {self.names[ln]} for "
                                     f"{fmt_flag(ins.flag)} and finds {fmt_flag(content[1])}: reported as a call "
                                     f"mismatch although every rank made the same calls (line holds {fmt_tag(g[1])})",
                                     ln)
                val = content[0]
            else:
                val = content
            if log is not None:
                fl = f" {fmt_flag(content[1])}" if ins.flag is not None else ""
                log.append(f"{ins.where}: POLL {self.names[ln]} accepts {val}{fl}  "
                           f"[holds {fmt_tag(g[1])}, {line_status(g)}]")
            want = (ins.tag, ins.peer)
            if g[0] != FULL or g[1] != want:
                return Violation("stale", f"r{r} ({ins.where}) accepts {self.names[ln]} as {fmt_tag(want)}, "
                                 f"but the line holds {fmt_tag(g[1])} ({line_status(g)})", ln)
            self._set_reg(st, r, j, ins.reg, protocols.vadd(st.regs[r][j][ins.reg], val))
            st.ghost[ln] = (FREE if ins.flag is not None else CONSUMED, g[1], ())
            return None
        if op == ADD:
            if log is not None:
                log.append(f"{ins.where}: ADD128 {ins.value} -> {self.names[ln]} (line-atomic)  "
                           f"[{fmt_tag(ins.tag)}]")
            v = self._acc_check(g, ins, r, range(self.lanes), ln)
            if v is not None:
                return v
            st.mem[ln] = protocols.line_add(st.mem[ln], ins.value)
            bit = 1 << r
            masks = g[2] if g[0] == FULL else (0,) * self.lanes
            st.ghost[ln] = (FULL, ins.tag, tuple(m | bit for m in masks))
            return None
        if op == POLL128:
            snap = st.mem[ln]
            if log is not None:
                log.append(f"{ins.where}: POLL128 {self.names[ln]} counter={protocols.ll128_counter(snap)} "
                           f"reads {snap}")
            if protocols.ll128_counter(snap) > ins.expect:
                return Violation("overshoot", f"r{r} ({ins.where}) polls {self.names[ln]}: the counter reads "
                                 f"{protocols.ll128_counter(snap)} > {ins.expect} ranks (line holds {fmt_tag(g[1])}, "
                                 f"{line_status(g)})", ln)
            if g[0] != FULL or g[1] != ins.tag:
                return Violation("stale", f"r{r} ({ins.where}) accepts {self.names[ln]} as {fmt_tag(ins.tag)}, but "
                                 f"the line holds {fmt_tag(g[1])} ({line_status(g)})", ln)
            torn = [(lane, m) for lane, m in enumerate(g[2]) if m != self.full_mask]
            if torn:
                what = "; ".join(f"lane {lane} has contributions from "
                                 f"{ranks_text(m, self.R)}" for lane, m in torn)
                return Violation("torn", f"r{r} ({ins.where}) reads {self.names[ln]}: the counter says all "
                                 f"{self.R} ranks added, but {what} (torn line)", ln)
            self._set_reg(st, r, j, ins.reg, snap)
            st.ghost[ln] = (CONSUMED, g[1], g[2])
            return None
        raise AssertionError(f"not a shared op: {ins}")

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

    def _perform(self, st: State, r: int, e: Pending, log: list[str] | None) -> Violation | None:
        owner, kind, ln, payload, tag, writer, ins = e
        if kind == P_REC:
            self._perform_record(st, e, log)
            return None
        g = st.ghost[ln]
        if kind == P_LANE:
            lane, vals = payload
            counter = lane == COUNTER_LANE
            if log is not None:
                part = "the counter" if counter else f"lane {lane}"
                log.append(f"    performed: {part} of the add by r{writer} ({ins.where}) -> {self.names[ln]} "
                           f"+= {vals}  [{fmt_tag(tag)}]")
            v = self._acc_check(g, ins, writer, () if counter else (lane,), ln)
            if v is not None:
                return v
            st.mem[ln] = protocols.lane_add(st.mem[ln], 0 if counter else lane, vals)
            masks = list(g[2]) if g[0] == FULL else [0] * self.lanes
            if not counter:
                masks[lane] |= 1 << writer
            st.ghost[ln] = (FULL, tag, tuple(masks))
            return None
        what = "reset" if kind == P_RESET else "zeroing"
        if log is not None:
            log.append(f"    performed: {what} of {self.names[ln]} issued by {ins.where}")
        if g[0] == FULL:
            return Violation("reset-race", f"the {what} of {self.names[ln]} issued by {ins.where} is performed after "
                             f"new data {fmt_tag(g[1])} arrived: that data is lost", ln)
        st.mem[ln] = self.scratch.rest(ln) if kind == P_RESET else self.zero_line
        st.ghost[ln] = (FREE, None, ())
        return None

    def _settle(self, st: State, r: int, j: int, log: list[str] | None, advance: bool = True) -> Violation | None:
        """Run thread (r, j)'s local instructions up to its next shared one (or a blocking fence/end)."""
        k = st.call[r]
        var = st.var[r]
        code = self.vcode[var][j]
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
                    st.pend[r] = tuple((-1, *e[1:]) if e[0] == j else e for e in st.pend[r])
                st.regs[r][j] = ()
                if st.fx is not None and not st.fx.abort[r] >> j & 1:
                    self._commit(st, r, j)  # buf.commit()
                if log is not None:
                    log.append(f"    {ins.where}: END")
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
            elif op in (ADDC, COMBINE, OUT):
                v = self._register_step(st, r, j, ins, log)
                if v is not None:
                    return v
            pc += 1
        st.pc[r][j] = pc
        if advance and pc == n and all(p == len(c) for p, c in zip(st.pc[r], self.vcode[var], strict=True)):
            if st.fx is not None:
                v = self._end_call(st, r, k)
                if v is not None:
                    return v
            if log is not None:
                log.append(f"    r{r} ends call {k} (kernel boundary: all its threads finished)")
            st.call[r] = k + 1
            return self._start_call(st, r, log)
        return None

    # ---- the fault path (fault.h, refused(), poison_from; Config.faults) ------------------------
    def _gate(self, st: State, r: int, k: int) -> str:
        """Why rank r may not start call k yet ("" if it may)."""
        assert st.fx is not None
        if k == self.cfg.reset_at and st.fx.phase == 0:
            return "reset(): waits until every rank is idle"
        f = self.cfg.fault_at("absent", r, k - 1) if k else None
        if f is not None and f.rejoin == "launch" and min(st.call) < k:
            return f"absent in call {k - 1}: its next launch follows every rank's call {k - 1}"
        return ""

    def _kernel_start(self, st: State, r: int, k: int, log: list[str] | None) -> Violation | None:
        """Kernel entry: the absent hook (``prologue``), then the record code (``prior``, ``refused()``)."""
        fx = st.fx
        assert fx is not None
        cfg = self.cfg
        prior = fx.early[r] if cfg.has(Mutation.EARLY_PRIOR) else fx.rec[r]
        fx.early[r] = fx.rec[r]
        fx.outs[r] = fx.abort[r] = 0
        code = self.vcode[st.var[r]]
        absent = cfg.fault_at("absent", r, k) is not None
        if not absent and (not prior or cfg.has(Mutation.NO_REFUSAL)):
            return None
        if not absent and fx.phase:
            return Violation("refused-after-reset", f"r{r} refuses call {k} after reset(): its record holds "
                             f"{FAULT_NAMES.get(prior, prior)}")
        if not absent and not cfg.has(Mutation.NO_POISON):
            fx.outs[r] = (1 << cfg.calls[k]) - 1
        self._finish_threads(st, r)
        fx.abort[r] = (1 << len(code)) - 1
        if log is not None:
            log.append(f"    r{r} is absent in call {k}: its blocks return at once (test hook)" if absent else
                       f"    r{r} REFUSES call {k}: its record holds {FAULT_NAMES.get(prior, prior)}; NaN into "
                       "every output it owns, nothing sent, nothing committed")
        return None

    def _finish_threads(self, st: State, r: int) -> None:
        """Every thread of rank r's current call ends at once (refusal, the absent hook)."""
        st.pc[r] = [len(c) for c in self.vcode[st.var[r]]]

    def _end_call(self, st: State, r: int, k: int) -> Violation | None:
        """Kernel end: every output line of the call holds the exact sum or NaN (absent: untouched)."""
        assert st.fx is not None
        n = self.cfg.calls[k]
        missing = [x for x in range(n) if not st.fx.outs[r] >> x & 1]
        if missing and self.cfg.fault_at("absent", r, k) is None:
            return Violation("unwritten", f"r{r} ends call {k} without writing output line(s) {missing}: neither "
                             "the exact sum nor NaN, the caller reads whatever the buffer held")
        return None

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
            for j, c in enumerate(self.vcode[st.var[r]]):
                pc = st.pc[r][j]
                if pc < len(c) and c[pc].op in (POLL, POLL128):
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
        kind, r, j = act
        if kind == GIVE_UP:
            v = self._give_up(st, r, j, layout.FAULT_TIMEOUT, log)
        elif kind == REJOIN:
            if log is not None:
                log.append(f"r{r}: the launch of call {st.call[r] - 1} ended on every rank")
            v = self._start_call(st, r, log)
        elif kind == RESET_ALL:
            v = self._reset(st, log)
        elif kind == 0 and self._foreign_flag(st, r, j):
            v = self._give_up(st, r, j, layout.FAULT_MISMATCH, log)
        else:
            v = self._step(st, act, log)
        if v is None and self.finished(st):
            v = self._record_check(st, "the end of the run")
        return v

    def _foreign_flag(self, st: State, r: int, j: int) -> bool:
        """An LL poll sees its epoch with another signature, and an injected mismatch explains it
        (``checkPolls`` raises kMismatch). Unexplained ones stay violations (``_shared``)."""
        ins = self.vcode[st.var[r]][j][st.pc[r][j]]
        if ins.op != POLL or ins.flag is None or protocols.ll_try_load(st.mem[ins.line], ins.flag) >= 0:
            return False
        held = st.ghost[ins.line][1]
        return (self.cfg.fault_at("mismatch", r, st.call[r]) is not None
                or (held is not None and self.cfg.fault_at("mismatch", held[1], held[0][0]) is not None))

    def _give_up(self, st: State, r: int, j: int, code: int, log: list[str] | None) -> Violation | None:
        """The thread stops waiting: ``FaultSink::raise`` if its record is still clear (own record at
        once, every peer's as a delayed store), NaN into the outputs it has not written
        (``poison_from``), no further send, no commit; then it ends."""
        fx = st.fx
        assert fx is not None
        var = st.var[r]
        c = self.vcode[var][j]
        pc = st.pc[r][j]
        ins = c[pc]
        raised = not fx.rec[r]
        if raised:
            fx.rec[r] = code
            if not self.cfg.has(Mutation.NO_PROPAGATION):
                st.pend[r] = (*st.pend[r], *((j, P_REC, -1 - q, code, None, r, ins) for q in range(self.R) if q != r))
        nan = [x for i, x in self.vouts[var][j] if i >= pc]
        if not self.cfg.has(Mutation.NO_POISON):
            for x in nan:
                fx.outs[r] |= 1 << x
        if self.cfg.has(Mutation.COMMIT_AFTER_GIVE_UP):
            self._commit(st, r, j, upto=pc)
        fx.abort[r] |= 1 << j
        if log is not None:
            why = f"records a {FAULT_NAMES[code]} in r{r}'s record and every peer's" if raised else \
                f"its record holds a {FAULT_NAMES.get(fx.rec[r], fx.rec[r])}"
            log.append(f"{ins.where}: GIVES UP at {OP_NAMES[ins.op]} {self.names[ins.line]} ({why}); "
                       f"NaN into output line(s) {nan}")
        st.pc[r][j] = len(c) - 1  # END: its delayed stores (record writes too) land before the kernel ends
        return self._settle(st, r, j, log)

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

    def _commit(self, st: State, r: int, j: int, upto: int | None = None) -> None:
        """``LLBuffer::commit`` of thread j: its channels' advanced epochs (those before ``upto``)."""
        assert st.fx is not None
        if self.cfg.has(Mutation.SKIP_COMMIT):
            return
        items = [(key, e) for i, key, e in self.vadv[st.var[r]][j] if upto is None or i <= upto]
        if items:
            table = dict(self._table_list[st.fx.ep[r]])
            table.update(items)
            st.fx.ep[r] = self._intern(table)

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

    # ---- diagnostics ---------------------------------------------------------------------------
    def deadlock(self, st: State) -> Violation:
        lines = []
        for r in range(self.R):
            k = st.call[r]
            if k >= self.ncalls:
                continue
            if st.var[r] < 0:
                lines.append(f"r{r} waits before call {k} ({self._gate(st, r, k)})")
                continue
            for j, c in enumerate(self.vcode[st.var[r]]):
                pc = st.pc[r][j]
                if pc >= len(c):
                    continue
                ins = c[pc]
                if ins.op in (POLL, POLL128):
                    g = st.ghost[ins.line]
                    if ins.flag is not None:
                        want = fmt_flag(ins.flag)
                    else:
                        want = f"counter == {ins.expect}" if ins.op == POLL128 else "data"
                    lines.append(f"{ins.where} waits on {self.names[ins.line]} for {want} ({fmt_tag(ins.tag)}); "
                                 f"it holds {st.mem[ins.line]!r}, {fmt_tag(g[1])} ({line_status(g)})")
                else:
                    lines.append(f"{ins.where} blocked at {OP_NAMES[ins.op]}")
        return Violation("deadlock", "no step is enabled but threads are unfinished: " + " | ".join(lines))
