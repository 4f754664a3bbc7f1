"""What every machine of the model shares below its step semantics: the programs and their
variants, the initial state, and the life of a call on a rank (kernel entry with the fault
path's refusal, the threads' ends, kernel end, the next call).

The machines are layers, each in its own module: ``MachineBase`` (here) -> ``FaultPathMachine``
(``fault_path.py``: give-ups, fault records, the reset) -> ``LineEffects`` (``line_effects.py``:
what a store, add or poll does to a line, and the checks on it) -> ``Machine`` (``machine.py``,
the strong model) -> ``PtxMachine`` (``ptx.py``). A lower layer calls the few methods an upper
one supplies (``_settle`` here) through stubs.
"""

from __future__ import annotations

from typing import Any

from . import protocols, rules
from .algorithms import Programs, build
from .config import Config, Mutation
from .program import ADDC, COMBINE, ISSUE_ADD, OUT, RESET, ZERO, Epochs, Instr, ThreadProgram
from .state import FAULT_NAMES, FaultState, State, Violation


class MachineBase:
    """Static part of the model (programs, scratch layout) and the life of a call."""

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
        self.resets = [info.reader_resets for info in self.scratch.infos]  # LineInfo.reader_resets
        self.full_mask = (1 << self.R) - 1
        self.lanes = cfg.ll128_lanes
        self.zero_line = protocols.ll128_zero(cfg.ll128_lanes, cfg.ll128_lines)
        self.boundary_orders = not cfg.has(Mutation.NO_BOUNDARY_ORDER)
        self.fault = cfg.fault_path
        #: calls some rank makes with other arguments (its signature and data differ)
        self.mismatched = frozenset(k for k in range(self.ncalls) if cfg.mismatched(k))
        #: upper bound on the steps of any run (shared steps + delayed stores)
        self.max_steps = self.programs.shared_steps + sum(
            1 for rank in self.code for call in rank for th in call for ins in th
            if ins.op in (RESET, ZERO, ISSUE_ADD)) + 1 + self._fault_steps()
        self._initial: State | None = None
        self._tables: dict[tuple[tuple[tuple[str, int], int], ...], int] = {(): 0}
        self._table_list: list[tuple[tuple[tuple[str, int], int], ...]] = [()]
        self._variants: dict[tuple[int, int, int], int] = {}
        if self.fault:
            for r, starts in enumerate(self.programs.starts):
                for k, start in enumerate(starts):
                    self._variants[(r, k, self._intern(start))] = r * self.ncalls + k

    def _fault_steps(self) -> int:
        """What the fault path adds to a run's steps: give-ups, record writes to peers, rejoins, the reset."""
        if not self.fault:
            return 0
        return sum(len(call) * self.R for rank in self.code for call in rank) + self.R * self.ncalls + 1

    # ---- program variants and epoch tables ---------------------------------------------------------
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

    # ---- the life of a call ----------------------------------------------------------------------
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

    def _settle(self, st: State, r: int, j: int, log: list[str] | None, advance: bool = True) -> Violation | None:
        """Thread (r, j)'s local work up to its next shared step; at the kernel end with
        ``advance``, the next call (``_end_kernel``). Each machine defines it."""
        raise NotImplementedError

    def _begin_threads(self, st: State, r: int, var: int) -> None:
        st.pc[r] = [0] * len(self.vcode[var])

    def _all_finished(self, st: State, r: int) -> bool:
        return all(pc == len(c) for pc, c in zip(st.pc[r], self.vcode[st.var[r]], strict=True))

    def _finish_threads(self, st: State, r: int) -> None:
        """Every thread of rank r's current call ends at once (refusal, the absent hook)."""
        st.pc[r] = [len(c) for c in self.vcode[st.var[r]]]

    def _release_pending(self, st: State, r: int, j: int) -> None:
        """Thread j's delayed stores outlive its kernel (``NO_BOUNDARY_ORDER``): they belong to no thread."""
        st.pend[r] = tuple((-1, *e[1:]) if e[0] == j else e for e in st.pend[r])

    def _end_thread(self, st: State, r: int, j: int, ins: Instr, log: list[str] | None) -> None:
        """Thread j passes its ``END``: its registers go, its channels' epochs are committed
        (``buf.commit()``; on the fault path only if it did not give up)."""
        st.regs[r][j] = ()
        if st.fx is not None and not st.fx.abort[r] >> j & 1:
            self._commit(st, r, j)
        if log is not None:
            log.append(f"    {ins.where}: END")

    def _end_kernel(self, st: State, r: int, log: list[str] | None) -> Violation | None:
        """Every thread of rank r's call has ended: the kernel ends, the rank starts its next call."""
        k = st.call[r]
        if st.fx is not None:
            v = self._end_call(st, r, k)
            if v is not None:
                return v
        if log is not None:
            log.append(f"    r{r} ends call {k} (kernel boundary: all its threads finished)")
        st.call[r] = k + 1
        return self._start_call(st, r, log)

    # ---- kernel entry and end on the fault path (fault.h, refused(), poison_from) ------------------
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
            fx.outs[r] = (1 << rules.out_lines(cfg, cfg.calls[k])) - 1
        self._finish_threads(st, r)
        fx.abort[r] = (1 << len(code)) - 1
        if log is not None:
            log.append(f"    r{r} is absent in call {k}: its blocks return at once (test hook)" if absent else
                       f"    r{r} REFUSES call {k}: its record holds {FAULT_NAMES.get(prior, prior)}; NaN into "
                       "every output it owns, nothing sent, nothing committed")
        return None

    def _end_call(self, st: State, r: int, k: int) -> Violation | None:
        """Kernel end: every output line of the call holds the exact sum or NaN (absent: untouched);
        a call that differs between ranks ends with a fault on every rank (a thread gave up or
        refused)."""
        assert st.fx is not None
        if k in self.mismatched and not st.fx.abort[r]:
            return Violation("accepted", f"r{r} completes call {k} without a fault, although {self._differs(k)}: "
                             "its outputs are a result of calls that differ")
        n = rules.out_lines(self.cfg, self.cfg.calls[k])
        missing = [x for x in range(n) if not st.fx.outs[r] >> x & 1]
        if missing and self.cfg.fault_at("absent", r, k) is None:
            return Violation("unwritten", f"r{r} ends call {k} without writing output line(s) {missing}: neither "
                             "the exact sum nor NaN, the caller reads whatever the buffer held")
        return None

    # ---- registers -------------------------------------------------------------------------------
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
            if st.call[r] in self.mismatched:  # whatever its value: no finite result of it is right
                return Violation("accepted", f"r{r} ({ins.where}) writes output line {ins.value} = {got} of call "
                                 f"{st.call[r]}, although {self._differs(st.call[r])}: a finite result of calls "
                                 "that differ (it must raise, or write NaN)")
            if got != ins.expect:
                return Violation("wrong-sum", f"r{r} ({ins.where}) writes output line {ins.value} = {got}, "
                                 f"the exact sum is {ins.expect}")
        return None

    def _differs(self, k: int) -> str:
        ranks = [f.rank for f in self.cfg.faults if f.kind == "mismatch" and f.call == k]
        return f"rank(s) {ranks} make(s) another call {k} (other signature, other data)"

    def _set_reg(self, st: State, r: int, j: int, reg: int, value: Any) -> None:
        regs = list(st.regs[r][j])
        regs[reg] = value
        st.regs[r][j] = tuple(regs)

    # ---- diagnostics -------------------------------------------------------------------------------
    def deadlock(self, st: State) -> Violation:
        lines = []
        for r in range(self.R):
            k = st.call[r]
            if k >= self.ncalls:
                continue
            if st.var[r] < 0:
                lines.append(f"r{r} waits before call {k} ({self._gate(st, r, k)})")
                continue
            for j in range(len(self.vcode[st.var[r]])):
                lines += self._blocked(st, r, j)
        return Violation("deadlock", "no step is enabled but threads are unfinished: " + " | ".join(lines))

    def _blocked(self, st: State, r: int, j: int) -> list[str]:
        """What unfinished thread (r, j) waits for, for ``deadlock``. Each machine defines it."""
        raise NotImplementedError

