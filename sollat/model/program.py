"""Thread programs: the model's instructions (:class:`Instr`, the opcodes), one thread's program
(:class:`ThreadProgram`) and the :class:`Builder` that appends a thread's instructions with the
fences the kernels' ``LLBuffer`` issues. The instruction set is in ``algorithms.py``'s docstring."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from . import rules
from .config import Config, Mutation

SEND, POLL, ADD, POLL128 = 0, 1, 2, 3
RESET, ZERO, FENCE, OUT, ADDC, COMBINE, ISSUE_ADD, END = 10, 11, 12, 13, 14, 15, 16, 17
SHARED_OPS = frozenset({SEND, POLL, ADD, POLL128})
#: local instructions that work on a thread's registers only (``MachineBase._register_step``)
REGISTER_OPS = (ADDC, COMBINE, OUT)
OP_NAMES = {SEND: "SEND", POLL: "POLL", ADD: "ADD128", POLL128: "POLL128", RESET: "RESET", ZERO: "ZERO",
            FENCE: "FENCE", OUT: "OUT", ADDC: "ADDC", COMBINE: "COMBINE", ISSUE_ADD: "ISSUE_ADD", END: "END"}
COUNTER_LANE = -1  # ISSUE_ADD of the split-mode counter (element 0 of lane 0 only)


class Instr(NamedTuple):
    op: int
    where: str  # "r1 call2 b0.t1 it0 slot0"
    line: int = -1  # dense scratch line
    value: Any = None  # constant payload (SEND/ADD/ISSUE_ADD/ADDC); OUT: the output line
    reg: int = -1  # register read (SEND of a reduced value) or written (POLL/ADDC/OUT/COMBINE)
    flag: Any = None  # LL flag written / waited for; None: sentinel
    tag: Any = None  # ghost identity of the data: (call, message line, epoch)
    lane: int = -1  # ISSUE_ADD: the lane (COUNTER_LANE: the split-mode counter)
    peer: int = -1  # SEND: destination rank; POLL: source rank
    expect: Any = None  # OUT: the exact sum; POLL128: the counter value (nranks)
    srcs: tuple[int, ...] = ()  # COMBINE: snapshot registers


EpochKey = tuple[str, int]  # (buffer, line-channel)
Epochs = dict[EpochKey, int]


@dataclass
class ThreadProgram:
    label: str  # "r1 call2 b0.t1"
    code: list[Instr] = field(default_factory=list)
    nregs: int = 0
    #: ``advanceEpoch``: (number of instructions before it, channel, new epoch); ``commit`` stores them
    advances: list[tuple[int, EpochKey, int]] = field(default_factory=list)


def split_line(cfg: Config, kind: str) -> bool:
    """PTX mode: whether a line of ``kind`` is modelled as its two 8-byte parts (``Config.tear``).
    An LL128 line is added whole (``Config.ll128_line_atomic``) or lane by lane; a signature word is
    one aligned 8-byte access, single-copy atomic."""
    if not cfg.ptx or kind in ("ll128", "sig"):
        return False
    if cfg.tear == "all":
        return True
    return kind == "ll" and cfg.has(Mutation.SINGLE_FLAG_LINE)


#: Added to every input of a call that differs from the other ranks' (``Fault("mismatch")``): its
#: values lie above every value of an agreeing call, so data of the two calls never coincide.
DIFFERING = 1000


def input_value(rank: int, call: int, line: int, elem: int = 0, differs: bool = False) -> int:
    """Deterministic, call-dependent inputs: a stale or lost contribution changes the sum.
    ``differs``: the rank's call differs from the others' (the mismatch hook), and so do its data."""
    value = 1 + ((rank + 1) * 7919 + (call + 1) * 104729 + (line + 1) * 1299709 + elem * 15485863) % 997
    return value + DIFFERING if differs else value


class Builder:
    """Appends instructions for one thread.

    Fences (``LLBuffer::beforeSend``, ``releaseReceivesWith``): ``received[buffer]`` is set when a
    receive of that buffer completes; the next send of the buffer issues ``fence<peer_scope()>``
    (``fence.acq_rel.sys`` on real ranks, ``.gpu`` on virtual ones) first: PTX orders a poll's load
    before a later store to another line, and a reset before a later send, by nothing but a fence
    (no order from the poll loop's control dependency). ``dirty`` is set by sentinel resets (of
    lines and signature words) only: ``Mutation.NO_REUSE_FENCE`` fences by it (a fence only after
    resets).
    """

    def __init__(self, cfg: Config, label: str) -> None:
        self.cfg = cfg
        self.prog = ThreadProgram(label)
        self.dirty: dict[str, bool] = {}
        self.received: dict[str, bool] = {}
        self.scope = rules.fence_scope(cfg)
        self.where = label
        self.it = 0
        #: Signature words (sentinel buffers): the (block, real thread) whose word this thread
        #: stores, polls and resets, None if it carries none.
        self.sig_owner: tuple[int, int] | None = None
        #: ``Mutation.SIG_RESET_LATE``: signature-word resets held back until after the next fence
        self.late: list[tuple[str, int]] = []

    def at(self, it: int, slot: int) -> None:
        self.it = it
        self.where = f"{self.prog.label} it{it} slot{slot}"

    def reg(self) -> int:
        self.prog.nregs += 1
        return self.prog.nregs - 1

    def emit(self, op: int, **kw: Any) -> None:
        self.prog.code.append(Instr(op, self.where, **kw))

    def fence(self) -> None:
        """``fence<peer_scope()>()`` (``GPU_FENCE``: ``.gpu``): acq_rel; ``value`` is its scope.
        (``SIG_RESET_LATE``: the word resets held back are issued after it.)"""
        self.emit(FENCE, value=self.scope)
        self._issue_late()

    def _issue_late(self) -> None:
        for buffer, line in self.late:
            self.emit(RESET, line=line)
            self.dirty[buffer] = True
        self.late = []

    def _owes(self, buffer: str) -> bool:
        if self.cfg.has(Mutation.RESET_AFTER_SEND):
            return False
        if self.cfg.has(Mutation.NO_REUSE_FENCE):
            return self.dirty.get(buffer, False)
        return self.received.get(buffer, False)

    def before_send(self, buffer: str) -> None:
        """``LLBuffer::beforeSend``: a receive (and its resets) since this buffer's last fence is
        fenced before its next send."""
        if self._owes(buffer):
            self.fence()
        self.dirty[buffer] = self.received[buffer] = False

    def release(self, *buffers: str) -> None:
        """``releaseReceives`` / ``releaseReceivesWith``: one fence for every buffer that owes one
        (two-shot: at the top of every pass; LL128: before the adds of every iteration).
        ``NO_REUSE_FENCE``: none."""
        if self.cfg.has(Mutation.NO_REUSE_FENCE):
            return
        if any(self._owes(b) for b in buffers):
            self.fence()
        for b in buffers:
            self.dirty[b] = self.received[b] = False

    def received_from(self, buffer: str) -> None:
        self.received[buffer] = True

    def reset(self, buffer: str, line: int) -> None:
        """``ProtoSentinel::reset`` of a consumed line (``pollAll``); it sets ``dirty``, which
        ``Mutation.NO_REUSE_FENCE`` fences by."""
        if self.cfg.has(Mutation.SKIP_SENTINEL_RESET):
            return
        self.emit(RESET, line=line)
        self.dirty[buffer] = True

    def reset_word(self, buffer: str, line: int) -> None:
        """``LLBuffer::resetSignature`` of a signature word its poll accepted: 0 stored back, like
        a line's reset (``SKIP_SIG_RESET``: none; ``SIG_RESET_LATE``: after the next fence)."""
        if self.cfg.has(Mutation.SKIP_SIG_RESET):
            return
        if self.cfg.has(Mutation.SIG_RESET_LATE):
            self.late.append((buffer, line))
            return
        self.emit(RESET, line=line)
        self.dirty[buffer] = True

    def advance(self, epochs: Epochs, key: EpochKey) -> None:
        """``advanceEpoch`` of one channel (the value reaches memory only at ``commit``)."""
        epochs[key] = epochs.get(key, 0) + 1
        self.prog.advances.append((len(self.prog.code), key, epochs[key]))

    def end(self) -> ThreadProgram:
        self._issue_late()
        self.emit(END)
        return self.prog
