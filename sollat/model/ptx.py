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

from typing import Any, NamedTuple

from sollat import layout

from . import protocols, rules
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
    Instr,
)
from .config import Config, Mutation
from .machine import Machine
from .messages import fmt_flag, fmt_tag, line_status
from .scratch import CONSUMED, FREE, FULL, RESET_PENDING
from .state import FAULT_NAMES, GIVE_UP, P_REC, REJOIN, RESET_ALL, Action, Pending, State, Violation

#: Operation classes: a local step, a load (poll), a store (or one part of it), the issue of a
#: reset/zeroing (local: marks the line), a window boundary (an effective fence, the kernel end).
O_LOCAL, O_LOAD, O_STORE, O_ISSUE, O_BOUND = 0, 1, 2, 3, 4
#: A pending entry (``State.pend``) holding a store operation that outlives its window: issued
#: before a thread gave up, or carried over a kernel boundary (``NO_BOUNDARY_ORDER``).
P_OP = 4
#: Action kind: perform a store operation ``(STORE_STEP, rank, thread | op << 8)``; a load is
#: ``(0, rank, thread | op << 8)``.
STORE_STEP = 5
_ADDS = (ADD, ISSUE_ADD)


class Op(NamedTuple):
    ins: Instr
    cls: int
    index: int  # the instruction's index in the thread program
    cells: tuple[int, ...]  # scratch lines (parts) it touches
    part: int  # a store to one part of a split line: which (-1: the whole line)
    deps: int  # bit mask, from the window's start, of the operations that go first
    start: int  # the window's first operation
    bound: int  # the window's boundary operation (a boundary's own index)
    locs: tuple[int, ...]  # the window's local steps and issues (taken by _settle)
    chk: int  # how enabled() tests a load: 0 one sentinel line, 1 one LL line, 2 _read
    shared: tuple[int, ...]  # the window's loads and stores (what _frontier looks at)
    act: Action  # a load or store: the action that performs it
    pos: int  # its index in the thread's operations
    succ: tuple[int, ...]  # the operations of the window that wait for it


def _reads(ins: Instr) -> set[int]:
    if ins.op == SEND and ins.reg >= 0:
        return {ins.reg}
    if ins.op == OUT:
        return {ins.reg}
    if ins.op == COMBINE:
        return set(ins.srcs)
    return set()


def _writes(ins: Instr) -> set[int]:
    if ins.op in (POLL, POLL128, ADDC, COMBINE) and ins.reg >= 0:
        return {ins.reg}
    return set()


class PtxMachine(Machine, memory="ptx"):
    """The model under PTX's memory consistency model (module docstring)."""

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        self._vops: dict[int, list[tuple[Op, ...]]] = {}
        #: control dependencies kept (the fault path; module docstring)
        self.ctrl = cfg.fault_path
        self.owner = [info.rank for info in self.scratch.infos]
        # a run's steps: every load and store (part) of every thread (_thread_ops; the programs'
        # windows are built on first use)
        steps = sum(self.scratch.parts(ins.line) if ins.op in (SEND, RESET, ZERO) else ins.op in (POLL, POLL128, *_ADDS)
                    for code in self.vcode for th in code for ins in th)
        self.max_steps = steps + 1
        if self.fault:
            self.max_steps += sum(len(call) * self.R for rank in self.code for call in rank) + self.R * self.ncalls + 1

    # ---- programs as windows of operations --------------------------------------------------------
    def vops(self, var: int) -> list[tuple[Op, ...]]:
        """Program variant ``var`` as windows of operations, one tuple per thread (built on first use)."""
        ops = self._vops.get(var)
        if ops is None:
            ops = self._vops[var] = [self._thread_ops(code, self.vrank[var], j) for j, code in enumerate(self.vcode[var])]
        return ops

    def _thread_ops(self, code: tuple[Instr, ...], rank: int, j: int) -> tuple[Op, ...]:
        raw: list[tuple[Instr, int, int, tuple[int, ...], int]] = []
        for idx, ins in enumerate(code):
            op = ins.op
            if op in (SEND, RESET, ZERO):
                n = self.scratch.parts(ins.line)
                cells = tuple(range(ins.line, ins.line + n))
                if op != SEND:
                    raw.append((ins, O_ISSUE, idx, cells, -1))
                raw += [(ins, O_STORE, idx, (c,), h if n > 1 else -1) for h, c in enumerate(cells)]
            elif op in _ADDS:
                raw.append((ins, O_STORE, idx, (ins.line,), -1))
            elif op in (POLL, POLL128):
                raw.append((ins, O_LOAD, idx, tuple(range(ins.line, ins.line + self.scratch.parts(ins.line))), -1))
            elif op == END or (op == FENCE and rules.fence_orders_peers(self.cfg, ins.value)):
                raw.append((ins, O_BOUND, idx, (), -1))
            else:
                raw.append((ins, O_LOCAL, idx, (), -1))
        out: list[Op] = []
        start = 0
        for i, (_ins, cls, _idx, _cells, _part) in enumerate(raw):
            if cls != O_BOUND:
                continue
            locs = tuple(w for w in range(start, i) if raw[w][1] in (O_LOCAL, O_ISSUE))
            shared = tuple(w for w in range(start, i) if raw[w][1] in (O_LOAD, O_STORE))
            deps = [self._deps(raw, start, w) for w in range(start, i + 1)]
            for w in range(start, i + 1):
                wi, wc, widx, wcells, wpart = raw[w]
                chk = 2 if wi.op != POLL or len(wcells) > 1 else (0 if wi.flag is None else 1)
                act = (STORE_STEP if wc == O_STORE else 0, rank, j | w << 8)
                succ = tuple(y for y in range(start, i) if deps[y - start] >> (w - start) & 1)
                out.append(Op(wi, wc, widx, wcells, wpart, deps[w - start], start, i, locs, chk, shared, act, w, succ))
            start = i + 1
        return tuple(out)

    def _deps(self, raw: list[tuple[Instr, int, int, tuple[int, ...], int]], start: int, w: int) -> int:
        """What operation ``w`` of the window from ``start`` waits for (module docstring)."""
        ins, cls, _, cells, _ = raw[w]
        if cls == O_BOUND:
            return 0
        reads = _reads(ins)
        mask = 0
        for v in range(start, w):
            vi, vc, _, vcells, _ = raw[v]
            same = bool(set(cells) & set(vcells)) and not (cls == vc == O_LOAD) and not (
                ins.op in _ADDS and vi.op in _ADDS)
            if same or (reads & _writes(vi)) or (self.ctrl and vc == O_LOAD):
                mask |= 1 << (v - start)
        return mask

    # ---- thread state ------------------------------------------------------------------------------
    def _begin_threads(self, st: State, r: int, var: int) -> None:
        n = len(self.vcode[var])
        st.pc[r] = [0] * n
        st.done[r] = [0] * n
        st.front[r] = [None] * n

    def _all_finished(self, st: State, r: int) -> bool:
        return all(pc == len(ops) for pc, ops in zip(st.pc[r], self.vops(st.var[r]), strict=True))

    def _finish_threads(self, st: State, r: int) -> None:
        st.pc[r] = [len(ops) for ops in self.vops(st.var[r])]
        st.done[r] = [0] * len(st.pc[r])
        st.front[r] = [None] * len(st.pc[r])

    @staticmethod
    def _frontier(ops: tuple[Op, ...], pc: int, done: int) -> tuple[Op, ...]:
        """The thread's loads and stores whose turn has come: in its window, not done, every
        operation they wait for done."""
        if pc >= len(ops) or ops[pc].start != pc:  # finished, or sitting at its END after a give-up
            return ()
        return tuple(ops[i] for i in ops[pc].shared if not done >> (i - pc) & 1 and not ops[i].deps & ~done)

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
                    front = fronts[j] = self._frontier(allops[j], st.pc[r][j], st.done[r][j])
                for o in front:
                    if o.cls == O_STORE:
                        acts.append(o.act)
                    elif o.chk == 0:
                        if mem[o.cells[0]] is not empty:
                            acts.append(o.act)
                    elif o.chk == 1:
                        if check(mem[o.cells[0]][1], o.ins.flag):
                            acts.append(o.act)
                    elif self._read(st, o)[0]:
                        acts.append(o.act)
        pend = st.pend[r]
        for i, e in enumerate(pend):
            if i and self._ordered_after(pend, i, e):
                continue
            acts.append((1, r, i))
        return tuple(acts)

    def _read(self, st: State, o: Op) -> tuple[int, Any]:
        """A poll's view of its line: (1 complete / 0 not yet / -1 another call, the payload)."""
        ins, mem = o.ins, st.mem
        cells = o.cells
        if ins.op == POLL128:
            return (1 if protocols.ll128_counter(mem[cells[0]]) >= ins.expect else 0), mem[cells[0]]
        if ins.flag is None:  # sentinel: complete when no part is empty
            return (0 if any(mem[c] is protocols.EMPTY for c in cells) else 1), mem[cells[0]]
        if len(cells) == 1:
            content = mem[cells[0]]
            return protocols.ll_try_load(content, ins.flag), content[0]
        c0, c1 = mem[cells[0]], mem[cells[1]]
        if c0[1] is None:  # the single-flag line's parts: the payload word, the flag word
            return protocols.ll_check_flag(c1[1], ins.flag), c0[0]
        return protocols.ll_check_flag((c0[1], c1[1]), ins.flag), c0[0]

    def _loadable(self, st: State, o: Op) -> bool:
        return self._read(st, o)[0] != 0

    # ---- steps -------------------------------------------------------------------------------------
    def _step(self, st: State, act: Action, log: list[str] | None) -> Violation | None:
        kind, r, x = act
        st.acts[r] = None  # its own state changes (a store into a peer's scratch: _store)
        if kind == 1:
            pend = st.pend[r]
            entry = pend[x]
            st.pend[r] = pend[:x] + pend[x + 1:]
            v = self._perform(st, r, entry, log)
            if v is not None:
                return v
            owner = entry[0]
            if owner >= 0 and st.call[r] < self.ncalls:
                return self._settle(st, r, owner, log)
            return None
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

    def _part(self, o: Op) -> str:
        return "" if o.part < 0 else f" (8-byte part {o.part})"

    def _store(self, st: State, r: int, o: Op, val: Any, log: list[str] | None) -> Violation | None:
        """One store (or one part of one) lands: a line to a peer, a reset/zeroing, an LL128 add."""
        ins = o.ins
        ln = o.cells[0]
        g = st.ghost[ln]
        name = self.names[ln]
        st.acts[self.owner[ln]] = None  # the line's owner may now accept it
        if ins.op == SEND:
            if log is not None:
                if self.kinds[ln] == "sig":
                    what = f"signature word {fmt_flag(ins.flag)}"
                else:
                    what = f"{val} {fmt_flag(ins.flag)}" if ins.flag is not None else f"{val}"
                log.append(f"{ins.where}: SEND{self._part(o)} {what} -> {name}  [{fmt_tag(ins.tag)}]")
            if g[0] == FULL:
                return Violation("overwrite", f"r{r} ({ins.where}) stores {fmt_tag(ins.tag)}{self._part(o)} into {name} "
                                 f"which still holds unconsumed {fmt_tag(g[1])}", ln)
            if g[0] == RESET_PENDING:
                return Violation("reset-race", f"r{r} ({ins.where}) stores {fmt_tag(ins.tag)}{self._part(o)} into "
                                 f"{name} before the receiver's reset of {fmt_tag(g[1])} is performed: the reset "
                                 "will erase the new data", ln)
            st.mem[ln] = self._content(ins, o.part, val)
            st.ghost[ln] = (FULL, (ins.tag, r), ())
            return None
        if ins.op in (RESET, ZERO):
            what = "reset" if ins.op == RESET else "zeroing"
            if log is not None:
                log.append(f"    performed: {what}{self._part(o)} of {name} issued by {ins.where}")
            if g[0] == FULL:
                return Violation("reset-race", f"the {what} of {name} issued by {ins.where} is performed after "
                                 f"new data {fmt_tag(g[1])} arrived: that data is lost", ln)
            st.mem[ln] = self.scratch.rest(ln) if ins.op == RESET else self.zero_line
            st.ghost[ln] = (FREE, None, ())
            return None
        if ins.op == ADD:
            if log is not None:
                log.append(f"{ins.where}: ADD128 {ins.value} -> {name} (line-atomic)  [{fmt_tag(ins.tag)}]")
            v = self._acc_check(g, ins, r, range(self.lanes), ln)
            if v is not None:
                return v
            st.mem[ln] = protocols.line_add(st.mem[ln], ins.value)
            masks = g[2] if g[0] == FULL else (0,) * self.lanes
            st.ghost[ln] = (FULL, ins.tag, tuple(m | 1 << r for m in masks))
            return None
        # ISSUE_ADD: one lane's 16-byte add (or the split-mode counter add)
        lane, vals = ins.lane, ins.value
        counter = lane == COUNTER_LANE
        if log is not None:
            part = "the counter" if counter else f"lane {lane}"
            log.append(f"{ins.where}: {part} add {vals} -> {name}  [{fmt_tag(ins.tag)}]")
        v = self._acc_check(g, ins, r, () if counter else (lane,), ln)
        if v is not None:
            return v
        st.mem[ln] = protocols.lane_add(st.mem[ln], 0 if counter else lane, vals)
        masks = list(g[2]) if g[0] == FULL else [0] * self.lanes
        if not counter:
            masks[lane] |= 1 << r
        st.ghost[ln] = (FULL, ins.tag, tuple(masks))
        return None

    @staticmethod
    def _content(ins: Instr, part: int, val: Any) -> Any:
        """What a store of ``val`` puts into the line (or part ``part`` of it)."""
        if ins.flag is None:
            return val
        if part < 0:
            return (val, ins.flag)
        if isinstance(ins.flag[0], tuple):  # two-flag line: word h carries flag h
            return (val, ins.flag[part])
        return (val, None) if part == 0 else (None, ins.flag)  # single-flag line: payload word, flag word

    def _load(self, st: State, r: int, j: int, o: Op, log: list[str] | None) -> Violation | None:
        """A poll is satisfied: the line (all its parts) holds what it accepts."""
        ins = o.ins
        ln = o.cells[0]
        res, val = self._read(st, o)
        if ins.op == POLL128:
            return self._shared(st, r, j, ins, log)
        name = self.names[ln]
        if res < 0:
            seen = self._seen(st, o)
            if log is not None:
                log.append(f"{ins.where}: POLL {name} sees {seen}")
            return Violation("mismatch", f"r{r} ({ins.where}) polls {name} for {fmt_flag(ins.flag)} and finds "
                             f"{seen}: reported as a call mismatch although every rank made the same calls (line "
                             f"holds {fmt_tag(st.ghost[ln][1])})", ln)
        if log is not None:
            fl = f" {self._seen(st, o)}" if ins.flag is not None else ""
            what = f"signature word{fl}" if self.kinds[ln] == "sig" else f"{val}{fl}"
            log.append(f"{ins.where}: POLL {name} accepts {what}  [holds {fmt_tag(st.ghost[ln][1])}, "
                       f"{line_status(st.ghost[ln])}]")
        want = (ins.tag, ins.peer)
        for c in o.cells:
            g = st.ghost[c]
            if g[0] != FULL or g[1] != want:
                return Violation("stale", f"r{r} ({ins.where}) accepts {self.names[c]} as {fmt_tag(want)}, "
                                 f"but the line holds {fmt_tag(g[1])} ({line_status(g)})", c)
        self._set_reg(st, r, j, ins.reg, protocols.vadd(st.regs[r][j][ins.reg], val))
        for c in o.cells:
            g = st.ghost[c]
            st.ghost[c] = (FREE if ins.flag is not None else CONSUMED, g[1], ())
        return None

    def _seen(self, st: State, o: Op) -> str:
        contents = [st.mem[c] for c in o.cells]
        flags = [c[1] for c in contents if c[1] is not None]
        if len(contents) == 2 and len(flags) == 2:
            return fmt_flag(tuple(flags))
        return fmt_flag(flags[-1])

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
        elif op in (ADDC, COMBINE, OUT):
            return self._register_step(st, r, j, ins, log)
        return None

    def _settle(self, st: State, r: int, j: int, log: list[str] | None, advance: bool = True,
                after: int = -1) -> Violation | None:
        """Takes thread (r, j)'s local steps as soon as their inputs are there, and passes every
        window boundary whose window is complete (an effective fence; the kernel end).
        ``after``: the operation just performed (the frontier is then updated, not recomputed)."""
        k = st.call[r]
        var = st.var[r]
        ops = self.vops(var)[j]
        n = len(ops)
        pc, done = st.pc[r][j], st.done[r][j]
        front = st.front[r][j]
        if after >= 0 and front is not None:
            bound = ops[pc].bound
            new = [o for o in front if o.pos != after]
            seen = {o.pos for o in new}
            work = [after]
            while work:
                for y in ops[work.pop()].succ:
                    o = ops[y]
                    bit = 1 << (y - pc)
                    if done & bit or o.deps & ~done or y in seen:
                        continue
                    if o.cls == O_LOAD or o.cls == O_STORE:
                        new.append(o)
                        seen.add(y)
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
                st.pend[r] = tuple((-1, *e[1:]) if e[0] == j else e for e in st.pend[r])
            if b.op == END:
                st.regs[r][j] = ()
                if st.fx is not None and not st.fx.abort[r] >> j & 1:
                    self._commit(st, r, j)
                if log is not None:
                    log.append(f"    {b.where}: END")
            elif log is not None:
                log.append(f"    {b.where}: FENCE .{b.value} (its earlier operations are performed)")
            pc, done = bound + 1, 0
        st.pc[r][j], st.done[r][j] = pc, done
        st.front[r][j] = None
        if advance and pc == n and self._all_finished(st, r):
            if st.fx is not None:
                v = self._end_call(st, r, k)
                if v is not None:
                    return v
            if log is not None:
                log.append(f"    r{r} ends call {k} (kernel boundary: all its threads finished)")
            st.call[r] = k + 1
            return self._start_call(st, r, log)
        return None

    # ---- the fault path -------------------------------------------------------------------------------
    def _waiting(self, st: State, r: int, j: int) -> int:
        """The poll thread (r, j) waits at (the first unsatisfied one of its window), or -1."""
        ops = self.vops(st.var[r])[j]
        pc = st.pc[r][j]
        if pc >= len(ops):
            return -1
        done = st.done[r][j]
        for i in range(pc, ops[pc].bound):
            o = ops[i]
            if o.cls == O_LOAD and not done >> (i - pc) & 1 and not o.deps & ~done:
                return i
        return -1

    def _fault_actions(self, st: State, acts: list[Action]) -> None:
        fx = st.fx
        assert fx is not None
        live = fx.phase == 0
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
                if self._waiting(st, r, j) >= 0:
                    if fx.rec[r] or anytime:
                        acts.append((GIVE_UP, r, j))
                    elif live:
                        stuck.append((GIVE_UP, r, j))
        ra = self.cfg.reset_at
        if ra is not None and fx.phase == 0 and all(c == ra for c in st.call) and not any(st.pend):
            acts.append((RESET_ALL, 0, 0))
        if not acts:
            acts.extend(stuck)

    def _apply_fault(self, st: State, act: Action, log: list[str] | None) -> Violation | None:
        kind, r, x = act
        if kind not in (0, 1, STORE_STEP):
            st.acts = [None] * self.R  # a give-up, a rejoin, the reset: every rank's steps anew
        if kind == 0 and self._foreign(st, r, x):
            st.acts[r] = None
            v = self._give_up(st, r, x & 0xFF, layout.FAULT_MISMATCH, log, at=x >> 8)
            if v is None and self.finished(st):
                v = self._record_check(st, "the end of the run")
            return v
        return super()._apply_fault(st, act, log)

    def _foreign(self, st: State, r: int, x: int) -> bool:
        """The poll of action x sees its epoch with another signature, and an injected mismatch
        explains it (``checkPolls`` raises kMismatch)."""
        o = self.vops(st.var[r])[x & 0xFF][x >> 8]
        if o.ins.op != POLL or o.ins.flag is None or self._read(st, o)[0] >= 0:
            return False
        held = st.ghost[o.cells[-1]][1]
        return (self.cfg.fault_at("mismatch", r, st.call[r]) is not None
                or (held is not None and self.cfg.fault_at("mismatch", held[1], held[0][0]) is not None))

    def _foreign_flag(self, st: State, r: int, j: int) -> bool:
        return False  # PtxMachine._apply_fault decides (the action names the poll)

    def _give_up(self, st: State, r: int, j: int, code: int, log: list[str] | None,
                 at: int = -1) -> Violation | None:
        """As ``Machine._give_up``, at the poll ``at`` (a timeout: the first one the thread waits
        at). Stores the thread issued before that wait still land (before its kernel ends)."""
        fx = st.fx
        assert fx is not None
        var = st.var[r]
        ops = self.vops(var)[j]
        p = at if at >= 0 else self._waiting(st, r, j)
        pc, done = st.pc[r][j], st.done[r][j]
        o = ops[p]
        ins = o.ins
        raised = not fx.rec[r]
        if raised:
            fx.rec[r] = code
            if not self.cfg.has(Mutation.NO_PROPAGATION):
                st.pend[r] = (*st.pend[r], *((j, P_REC, -1 - q, code, None, r, ins) for q in range(self.R) if q != r))
        undone = [i for i in range(pc, len(ops)) if i >= ops[pc].bound or not done >> (i - pc) & 1]
        nan = sorted({ops[i].ins.value for i in undone if ops[i].ins.op == OUT})
        if not self.cfg.has(Mutation.NO_POISON):
            for x in nan:
                fx.outs[r] |= 1 << x
        if self.cfg.has(Mutation.COMMIT_AFTER_GIVE_UP):
            self._commit(st, r, j, upto=o.index)
        fx.abort[r] |= 1 << j
        self._detach(st, r, j, j, ops, [i for i in undone if i < p and ops[i].cls == O_STORE])
        if log is not None:
            why = f"records a {FAULT_NAMES[code]} in r{r}'s record and every peer's" if raised else \
                f"its record holds a {FAULT_NAMES.get(fx.rec[r], fx.rec[r])}"
            log.append(f"{ins.where}: GIVES UP at {OP_NAMES[ins.op]} {self.names[ins.line]} ({why}); "
                       f"NaN into output line(s) {nan}")
        st.pc[r][j], st.done[r][j] = len(ops) - 1, 0  # END: what it issued still lands first
        return self._settle(st, r, j, log)

    # ---- diagnostics ----------------------------------------------------------------------------------
    def deadlock(self, st: State) -> Violation:
        lines = []
        for r in range(self.R):
            k = st.call[r]
            if k >= self.ncalls:
                continue
            if st.var[r] < 0:
                lines.append(f"r{r} waits before call {k} ({self._gate(st, r, k)})")
                continue
            for j, ops in enumerate(self.vops(st.var[r])):
                pc = st.pc[r][j]
                if pc >= len(ops):
                    continue
                done = st.done[r][j]
                waits = [ops[i] for i in range(pc, ops[pc].bound)
                         if ops[i].cls == O_LOAD and not done >> (i - pc) & 1 and not ops[i].deps & ~done]
                if not waits:
                    lines.append(f"{ops[pc].ins.where} blocked before {OP_NAMES[ops[ops[pc].bound].ins.op]}")
                for o in waits:
                    ins = o.ins
                    g = st.ghost[o.cells[0]]
                    want = fmt_flag(ins.flag) if ins.flag is not None else (
                        f"counter == {ins.expect}" if ins.op == POLL128 else "data")
                    lines.append(f"{ins.where} waits on {self.names[ins.line]} for {want} ({fmt_tag(ins.tag)}); "
                                 f"it holds {[st.mem[c] for c in o.cells]!r}, {fmt_tag(g[1])} ({line_status(g)})")
        return Violation("deadlock", "no step is enabled but threads are unfinished: " + " | ".join(lines))


__all__ = ["O_BOUND", "O_ISSUE", "O_LOAD", "O_LOCAL", "O_STORE", "Op", "PtxMachine", "STORE_STEP"]
