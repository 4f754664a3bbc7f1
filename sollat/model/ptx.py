"""The PTX mode of the model: the thread programs run against PTX's memory consistency model.

The strong model (``machine.Machine``, ``Config(memory="strong")``) performs a thread's stores to
peers in program order, when issued, never before an earlier poll, and 16-byte lines as one
access. PTX promises less (PTX ISA 9.x, chapter 8 "Memory Consistency Model";
docs/protocol-model.md, "The PTX mode", cites each rule), and this machine gives the scheduler
every freedom PTX gives these programs, as an operational model:

* **Windows.** A thread's program is cut at its *effective* fences and at its end. A fence orders
  the thread's earlier memory operations before its later ones only if its scope includes the
  peer it talks to (§8.5 "Scope", §8.7 "Morally strong operations", §8.9.4 "Memory
  synchronization"): a ``.gpu`` fence on a rank whose peers are other GPUs orders nothing for
  them and is no cut. The kernel end (a kernel boundary, ``griddepcontrol.wait``) orders
  everything. Inside a window the operations are performed **in any order**: stores to different
  lines (relaxed and volatile accesses to different locations are ordered by nothing but
  synchronization, §8.9.5 "Causality order"), loads, a load before an earlier store, and a store
  before an earlier load (load buffering: no order from a control or address dependency; a poll
  loop is nothing but a control dependency). What still orders two operations of a window: the
  same location (§8.10.5 "Sequential Consistency Per Location": a reset after the poll of its
  line, a store after the thread's earlier store to the same line; LL128 lane adds commute), and a
  value dependency (a send of a reduced value after the polls it sums: §8.10.4 "No Thin Air").
* **A cut is a full fence.** The protocols' fences are ``fence.acq_rel``; PTX does not order an
  earlier store before a later load with it (that takes ``fence.sc``), the model does. Every
  ordering the protocols rely on is load-before-store or store-before-store (docs/design.md,
  "Orderings the protocols rely on"); a poll after a fence that completed before the thread's
  earlier stores landed reads a line no one rewrites before those stores land (its rewrite needs
  a credit the thread sends after a later fence), so the stronger cut hides no execution the
  checks could tell apart (docs).
* **Vector accesses** are their 8-byte parts, performed in either order (§8.2.4 "Memory
  operations on vector data-types"); an aligned 8-byte part is single-copy atomic (§8.10.3
  "Atomicity"; volatile accesses are relaxed at ``.sys`` scope, §8.4.2). A line whose every part is
  checked by its reader (two-flag LL, sentinel: the reader takes a line only when each part is
  complete) is one access: its reader cannot tell a torn store from one that landed when its last
  part did. ``Config(tear="all")`` splits every line (the ``*-tear`` configurations, and a test
  that both give the same verdicts). The single-flag LL line (``Mutation.SINGLE_FLAG_LINE``) is
  always split; a signature word is one 8-byte access.
* Local steps (register arithmetic, output checks, issuing a reset) are taken as soon as their
  inputs are there; they commute with every other step.

A step is one operation: a store part performed, or a poll satisfied (a blocking step, enabled when
the line holds what the poll accepts). The fault path (``Config.fault_path``) keeps control
dependencies (every operation after a poll of its window waits for it): a thread that gives up at
a wait executes nothing after it, and the model must not have performed it early. (So the fault
path is checked under a model stronger than PTX in that one respect.)
"""

from __future__ import annotations

from typing import Any

from . import protocols
from .config import Config
from .fault_path import GiveUp
from .machine import Machine
from .messages import fmt_flag, fmt_tag, waiting_text
from .program import (
    ADD,
    COUNTER_LANE,
    END,
    FENCE,
    OP_NAMES,
    OUT,
    POLL,
    POLL128,
    REGISTER_OPS,
    RESET,
    SEND,
    ZERO,
)
from .ptx_ops import (
    ADDS,
    O_ISSUE,
    O_LOAD,
    O_STORE,
    STORE_STEP,
    Op,
    content,
    frontier,
    read,
    seen,
    thread_ops,
    waiting_loads,
)
from .scratch import RESET_PENDING
from .state import Action, Pending, State, Violation

#: A pending entry (``State.pend``) holding a store operation that outlives its window: issued
#: before a thread gave up, or carried over a kernel boundary (``NO_BOUNDARY_ORDER``).
P_OP = 4


class PtxMachine(Machine, memory="ptx"):
    """The model under PTX's memory consistency model (module docstring)."""

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        self._vops: dict[int, list[tuple[Op, ...]]] = {}
        #: control dependencies kept (the fault path; module docstring)
        self.ctrl = cfg.fault_path
        self.owner = [info.rank for info in self.scratch.infos]
        # a run's steps: every load and store (part) of every thread (thread_ops; the programs'
        # windows are built on first use)
        steps = sum(self.scratch.parts(ins.line) if ins.op in (SEND, RESET, ZERO) else ins.op in (POLL, POLL128, *ADDS)
                    for code in self.vcode for th in code for ins in th)
        self.max_steps = steps + 1 + self._fault_steps()

    def vops(self, var: int) -> list[tuple[Op, ...]]:
        """Program variant ``var`` as windows of operations, one tuple per thread (built on first use)."""
        ops = self._vops.get(var)
        if ops is None:
            ops = self._vops[var] = [thread_ops(code, self.vrank[var], j, self.scratch, self.cfg, self.ctrl)
                                     for j, code in enumerate(self.vcode[var])]
        return ops

    # ---- thread state ------------------------------------------------------------------------------
    def _set_threads(self, st: State, r: int, pcs: list[int]) -> None:
        st.pc[r] = pcs
        st.done[r] = [0] * len(pcs)
        st.front[r] = [None] * len(pcs)

    def _begin_threads(self, st: State, r: int, var: int) -> None:
        self._set_threads(st, r, [0] * len(self.vcode[var]))

    def _all_finished(self, st: State, r: int) -> bool:
        return all(pc == len(ops) for pc, ops in zip(st.pc[r], self.vops(st.var[r]), strict=True))

    def _finish_threads(self, st: State, r: int) -> None:
        self._set_threads(st, r, [len(ops) for ops in self.vops(st.var[r])])

    # ---- enabled steps -----------------------------------------------------------------------------
    def enabled(self, st: State) -> list[Action]:
        acts: list[Action] = []
        cache = st.acts
        for r in range(self.R):
            ra = cache[r]
            if ra is None:
                ra = cache[r] = self._rank_actions(st, r)
            acts.extend(ra)
        if st.fx is not None:
            self._fault_actions(st, acts)
        return acts

    def _rank_actions(self, st: State, r: int) -> tuple[Action, ...]:
        """Rank r's enabled loads, stores and pending stores (``State.acts`` caches them)."""
        acts: list[Action] = []
        mem = st.mem
        empty = protocols.EMPTY
        check = protocols.ll_check_flag
        var = st.var[r]
        if st.call[r] < self.ncalls and var >= 0:
            fronts = st.front[r]
            allops = None
            for j, front in enumerate(fronts):
                if front is None:
                    if allops is None:
                        allops = self.vops(var)
                    front = fronts[j] = frontier(allops[j], st.pc[r][j], st.done[r][j])
                for o in front:
                    if o.cls == O_STORE:
                        acts.append(o.act)
                    elif o.chk == 0:
                        if mem[o.cells[0]] is not empty:
                            acts.append(o.act)
                    elif o.chk == 1:
                        if check(mem[o.cells[0]][1], o.ins.flag):
                            acts.append(o.act)
                    elif read(mem, o)[0]:
                        acts.append(o.act)
        self._pending_actions(r, st.pend[r], acts)
        return tuple(acts)

    # ---- steps -------------------------------------------------------------------------------------
    def _step(self, st: State, act: Action, log: list[str] | None) -> Violation | None:
        kind, r, x = act
        st.acts[r] = None  # its own state changes (a store into a peer's scratch: _store)
        if kind == 1:
            return self._perform_pending(st, r, x, log)
        j, i = x & 0xFF, x >> 8
        o = self.vops(st.var[r])[j][i]
        v = self._store(st, r, o, self._value(st, r, j, o), log) if kind == STORE_STEP else self._load(st, r, j, o, log)
        if v is not None:
            return v
        st.done[r][j] |= 1 << (i - st.pc[r][j])
        return self._settle(st, r, j, log, after=i)

    def _perform(self, st: State, r: int, e: Pending, log: list[str] | None) -> Violation | None:
        if e[1] == P_OP:
            o, val = e[3]
            return self._store(st, e[5], o, val, log)
        return super()._perform(st, r, e, log)

    @staticmethod
    def _value(st: State, r: int, j: int, o: Op) -> Any:
        """The value a send stores (its constant, or the register it sends)."""
        ins = o.ins
        if ins.op != SEND:
            return None
        return ins.value if ins.reg < 0 else st.regs[r][j][ins.reg]

    def _detach(self, st: State, r: int, j: int, owner: int, ops: tuple[Op, ...], idx: list[int]) -> None:
        """Stores that outlive their window become pending entries (their values resolved now)."""
        st.pend[r] = (*st.pend[r], *((owner, P_OP, ops[i].cells[0], (ops[i], self._value(st, r, j, ops[i])),
                                      ops[i].ins.tag, r, ops[i].ins) for i in idx))

    @staticmethod
    def _part(o: Op) -> str:
        return "" if o.part < 0 else f" (8-byte part {o.part})"

    def _store(self, st: State, r: int, o: Op, val: Any, log: list[str] | None) -> Violation | None:
        """One store (or one part of one) lands: a line to a peer, a reset/zeroing, an LL128 add."""
        ins = o.ins
        ln = o.cells[0]
        st.acts[self.owner[ln]] = None  # the line's owner may now accept it
        if ins.op == SEND:
            if log is not None:
                if self.kinds[ln] == "sig":
                    what = f"signature word {fmt_flag(ins.flag)}"
                else:
                    what = f"{val} {fmt_flag(ins.flag)}" if ins.flag is not None else f"{val}"
                log.append(f"{ins.where}: SEND{self._part(o)} {what} -> {self.names[ln]}  [{fmt_tag(ins.tag)}]")
            return self._land(st, r, ins, ln, content(ins, o.part, val), self._part(o))
        if ins.op in (RESET, ZERO):
            return self._reset_lands(st, ins, ln, self._part(o), log)
        if ins.op == ADD:
            return self._line_add(st, r, ins, log)
        # ISSUE_ADD: one lane's 16-byte add (or the split-mode counter add)
        if log is not None:
            part = "the counter" if ins.lane == COUNTER_LANE else f"lane {ins.lane}"
            log.append(f"{ins.where}: {part} add {ins.value} -> {self.names[ln]}  [{fmt_tag(ins.tag)}]")
        return self._lane_add(st, r, ins)

    def _load(self, st: State, r: int, j: int, o: Op, log: list[str] | None) -> Violation | None:
        """A poll is satisfied: the line (all its parts) holds what it accepts."""
        ins = o.ins
        if ins.op == POLL128:
            return self._poll128(st, r, j, ins, log)
        ln = o.cells[0]
        res, val = read(st.mem, o)
        if res < 0:
            return self._foreign_line(st, r, ins, ln, seen(st.mem, o), log)
        what = ""
        if log is not None:
            fl = f" {seen(st.mem, o)}" if ins.flag is not None else ""
            what = f"signature word{fl}" if self.kinds[ln] == "sig" else f"{val}{fl}"
        return self._accept(st, r, j, ins, o.cells, val, what, log)

    # ---- local steps and windows ---------------------------------------------------------------------
    def _local(self, st: State, r: int, j: int, o: Op, log: list[str] | None) -> Violation | None:
        ins = o.ins
        op = ins.op
        if o.cls == O_ISSUE:  # a reset/zeroing is issued: the line waits for it
            for c in o.cells:
                g = st.ghost[c]
                st.ghost[c] = (RESET_PENDING, g[1], g[2])
            if log is not None:
                log.append(f"    {ins.where}: {OP_NAMES[op]} {self.names[ins.line]} issued (not yet performed)")
        elif op == FENCE:
            if log is not None:
                log.append(f"    {ins.where}: FENCE .{ins.value} (orders nothing for a peer on another GPU)")
        elif op in REGISTER_OPS:
            return self._register_step(st, r, j, ins, log)
        return None

    def _settle(self, st: State, r: int, j: int, log: list[str] | None, advance: bool = True,
                after: int = -1) -> Violation | None:
        """Takes thread (r, j)'s local steps as soon as their inputs are there, and passes every
        window boundary whose window is complete (an effective fence; the kernel end).
        ``after``: the operation just performed (the frontier is then updated, not recomputed)."""
        ops = self.vops(st.var[r])[j]
        n = len(ops)
        pc, done = st.pc[r][j], st.done[r][j]
        front = st.front[r][j]
        if after >= 0 and front is not None:
            bound = ops[pc].bound
            new = [o for o in front if o.pos != after]
            queued = {o.pos for o in new}
            work = [after]
            while work:
                for y in ops[work.pop()].succ:
                    o = ops[y]
                    bit = 1 << (y - pc)
                    if done & bit or o.deps & ~done or y in queued:
                        continue
                    if o.cls == O_LOAD or o.cls == O_STORE:
                        new.append(o)
                        queued.add(y)
                        continue
                    v = self._local(st, r, j, o, log)
                    done |= bit
                    work.append(y)
                    if v is not None:
                        st.done[r][j] = done
                        st.front[r][j] = None
                        return v
            st.done[r][j] = done
            if done != (1 << (bound - pc)) - 1 and (self.boundary_orders or ops[bound].ins.op != END):
                st.front[r][j] = tuple(new)
                return None
        while pc < n:
            first = ops[pc]
            bound = first.bound
            locs = first.locs
            changed = first.start == pc and bool(locs)  # after a give-up the thread sits at its END
            while changed:
                changed = False
                for i in locs:
                    bit = 1 << (i - pc)
                    o = ops[i]
                    if done & bit or o.deps & ~done:
                        continue
                    v = self._local(st, r, j, o, log)
                    done |= bit
                    changed = True
                    if v is not None:
                        st.pc[r][j], st.done[r][j] = pc, done
                        st.front[r][j] = None
                        return v
            full = (1 << (bound - pc)) - 1
            b = ops[bound].ins
            if done != full:
                if b.op != END or self.boundary_orders or any(
                        not done >> (i - pc) & 1 and ops[i].cls != O_STORE for i in range(pc, bound)):
                    break
                # NO_BOUNDARY_ORDER: the kernel ends with stores still in flight
                self._detach(st, r, j, -1, ops, [i for i in range(pc, bound) if not done >> (i - pc) & 1])
                done = full
            pend = st.pend[r]
            if pend and any(e[0] == j for e in pend):
                if b.op != END or self.boundary_orders:
                    break  # its detached stores (and fault-record writes) land first
                self._release_pending(st, r, j)
            if b.op == END:
                self._end_thread(st, r, j, b, log)
            elif log is not None:
                log.append(f"    {b.where}: FENCE .{b.value} (its earlier operations are performed)")
            pc, done = bound + 1, 0
        st.pc[r][j], st.done[r][j] = pc, done
        st.front[r][j] = None
        if advance and pc == n and self._all_finished(st, r):
            return self._end_kernel(st, r, log)
        return None

    # ---- the fault path and diagnostics: where a thread waits ----------------------------------------
    def _waiting(self, st: State, r: int, j: int) -> int:
        """The poll thread (r, j) waits at (the first unsatisfied one of its window), or -1."""
        ops = self.vops(st.var[r])[j]
        pc = st.pc[r][j]
        if pc >= len(ops):
            return -1
        waits = waiting_loads(ops, pc, st.done[r][j])
        return waits[0] if waits else -1

    def _waits(self, st: State, r: int, j: int) -> bool:
        return self._waiting(st, r, j) >= 0

    def _apply_fault(self, st: State, act: Action, log: list[str] | None) -> Violation | None:
        if act[0] not in (0, 1, STORE_STEP):
            st.acts = [None] * self.R  # a give-up, a rejoin, the reset: every rank's steps anew
        return super()._apply_fault(st, act, log)

    def _foreign_poll(self, st: State, r: int, x: int) -> tuple[int, int] | None:
        j, i = x & 0xFF, x >> 8
        o = self.vops(st.var[r])[j][i]
        if o.ins.op != POLL or o.ins.flag is None or read(st.mem, o)[0] >= 0:
            return None
        return (j, i) if self._mismatch_injected(st, r, o.cells[-1]) else None

    def _give_up_point(self, st: State, r: int, j: int, at: int) -> GiveUp:
        ops = self.vops(st.var[r])[j]
        p = at if at >= 0 else self._waiting(st, r, j)
        pc, done = st.pc[r][j], st.done[r][j]
        undone = [i for i in range(pc, len(ops)) if i >= ops[pc].bound or not done >> (i - pc) & 1]
        return GiveUp(ops[p].ins, ops[p].index, p, sorted({ops[i].ins.value for i in undone if ops[i].ins.op == OUT}))

    def _abandon(self, st: State, r: int, j: int, pos: int) -> None:
        """Stores the thread issued before its wait at ``pos`` still land (before its kernel ends)."""
        ops = self.vops(st.var[r])[j]
        pc, done = st.pc[r][j], st.done[r][j]
        st.acts[r] = None
        self._detach(st, r, j, j, ops, [i for i in range(pc, pos) if not done >> (i - pc) & 1 and ops[i].cls == O_STORE])
        st.pc[r][j], st.done[r][j] = len(ops) - 1, 0  # END: what it issued still lands first

    def _blocked(self, st: State, r: int, j: int) -> list[str]:
        ops = self.vops(st.var[r])[j]
        pc = st.pc[r][j]
        if pc >= len(ops):
            return []
        waits = waiting_loads(ops, pc, st.done[r][j])
        if not waits:
            return [f"{ops[pc].ins.where} blocked before {OP_NAMES[ops[ops[pc].bound].ins.op]}"]
        return [waiting_text(ops[i].ins, self.names[ops[i].ins.line], [st.mem[c] for c in ops[i].cells],
                             st.ghost[ops[i].cells[0]]) for i in waits]
