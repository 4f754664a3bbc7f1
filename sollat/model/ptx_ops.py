"""A thread program as the PTX mode's operations (``ptx.py``'s docstring gives the rules).

A program is cut into windows at its effective fences and its end; an operation is a local step,
a load (a poll), a store or one 8-byte part of one, the issue of a reset/zeroing, or the window's
boundary. Each operation knows the operations of its window it waits for (same location, a value
dependency; on the fault path every earlier load: control dependencies). Also here: which
operations' turn has come, and what a poll reads from and a store part writes into its line.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from . import protocols, rules
from .config import Config
from .messages import fmt_flag
from .program import ADD, ADDC, COMBINE, END, FENCE, ISSUE_ADD, OUT, POLL, POLL128, RESET, SEND, ZERO, Instr
from .scratch import Scratch
from .state import Action

#: Operation classes: a local step, a load (poll), a store (or one part of it), the issue of a
#: reset/zeroing (local: marks the line), a window boundary (an effective fence, the kernel end).
O_LOCAL, O_LOAD, O_STORE, O_ISSUE, O_BOUND = 0, 1, 2, 3, 4
#: Action kind: perform a store operation ``(STORE_STEP, rank, thread | op << 8)``; a load is
#: ``(0, rank, thread | op << 8)``.
STORE_STEP = 5
ADDS = (ADD, ISSUE_ADD)
#: an operation before its window is cut: (instruction, class, instruction index, cells, part)
_Raw = tuple[Instr, int, int, tuple[int, ...], int]


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
    chk: int  # how enabled() tests a load: 0 one sentinel line, 1 one LL line, 2 read()
    shared: tuple[int, ...]  # the window's loads and stores (what frontier looks at)
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


def thread_ops(code: tuple[Instr, ...], rank: int, j: int, scratch: Scratch, cfg: Config,
               ctrl: bool) -> tuple[Op, ...]:
    """Thread j of ``rank`` as windows of operations (``ctrl``: keep control dependencies)."""
    raw: list[_Raw] = []
    for idx, ins in enumerate(code):
        op = ins.op
        if op in (SEND, RESET, ZERO):
            n = scratch.parts(ins.line)
            cells = tuple(range(ins.line, ins.line + n))
            if op != SEND:
                raw.append((ins, O_ISSUE, idx, cells, -1))
            raw += [(ins, O_STORE, idx, (c,), h if n > 1 else -1) for h, c in enumerate(cells)]
        elif op in ADDS:
            raw.append((ins, O_STORE, idx, (ins.line,), -1))
        elif op in (POLL, POLL128):
            raw.append((ins, O_LOAD, idx, tuple(range(ins.line, ins.line + scratch.parts(ins.line))), -1))
        elif op == END or (op == FENCE and rules.fence_orders_peers(cfg, ins.value)):
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
        deps = [_deps(raw, start, w, ctrl) for w in range(start, i + 1)]
        for w in range(start, i + 1):
            wi, wc, widx, wcells, wpart = raw[w]
            chk = 2 if wi.op != POLL or len(wcells) > 1 else (0 if wi.flag is None else 1)
            act = (STORE_STEP if wc == O_STORE else 0, rank, j | w << 8)
            succ = tuple(y for y in range(start, i) if deps[y - start] >> (w - start) & 1)
            out.append(Op(wi, wc, widx, wcells, wpart, deps[w - start], start, i, locs, chk, shared, act, w, succ))
        start = i + 1
    return tuple(out)


def _deps(raw: list[_Raw], start: int, w: int, ctrl: bool) -> int:
    """What operation ``w`` of the window from ``start`` waits for (``ptx.py``'s docstring)."""
    ins, cls, _, cells, _ = raw[w]
    if cls == O_BOUND:
        return 0
    reads = _reads(ins)
    mask = 0
    for v in range(start, w):
        vi, vc, _, vcells, _ = raw[v]
        same = bool(set(cells) & set(vcells)) and not (cls == vc == O_LOAD) and not (
            ins.op in ADDS and vi.op in ADDS)
        if same or (reads & _writes(vi)) or (ctrl and vc == O_LOAD):
            mask |= 1 << (v - start)
    return mask


# ---- a thread's window at run time (pc: the window's start; done: a bit mask from it) -------------
def frontier(ops: tuple[Op, ...], pc: int, done: int) -> tuple[Op, ...]:
    """The thread's loads and stores whose turn has come: in its window, not done, every
    operation they wait for done."""
    if pc >= len(ops) or ops[pc].start != pc:  # finished, or sitting at its END after a give-up
        return ()
    return tuple(ops[i] for i in ops[pc].shared if not done >> (i - pc) & 1 and not ops[i].deps & ~done)


def waiting_loads(ops: tuple[Op, ...], pc: int, done: int) -> list[int]:
    """The polls of the thread's window that wait (not done, every operation before them done)."""
    return [i for i in range(pc, ops[pc].bound)
            if ops[i].cls == O_LOAD and not done >> (i - pc) & 1 and not ops[i].deps & ~done]


# ---- what a poll reads, what a store part writes -------------------------------------------------
def read(mem: list[Any], o: Op) -> tuple[int, Any]:
    """A poll's view of its line: (1 complete / 0 not yet / -1 another call, the payload)."""
    ins = o.ins
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


def seen(mem: list[Any], o: Op) -> str:
    """The flags a poll finds in its line, in words."""
    contents = [mem[c] for c in o.cells]
    flags = [c[1] for c in contents if c[1] is not None]
    if len(contents) == 2 and len(flags) == 2:
        return fmt_flag(tuple(flags))
    return fmt_flag(flags[-1])


def content(ins: Instr, part: int, val: Any) -> Any:
    """What a store of ``val`` puts into the line (or part ``part`` of it)."""
    if ins.flag is None:
        return val
    if part < 0:
        return (val, ins.flag)
    if isinstance(ins.flag[0], tuple):  # two-flag line: word h carries flag h
        return (val, ins.flag[part])
    return (val, None) if part == 0 else (None, ins.flag)  # single-flag line: payload word, flag word
