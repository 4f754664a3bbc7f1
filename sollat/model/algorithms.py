"""Algorithms as straight-line thread programs of memory operations, mirroring the kernels.

Each modelled thread (one per (rank, call, block, thread) of the call's geometry) runs a fixed
list of instructions; the only control flow of the device kernels that depends on timing is the
poll loop, which the machine models as a *blocking* instruction (enabled once the line holds what
the poll waits for). Everything else is a pure function of the call, exactly as on the device,
where the cut of a call is ``layout.plan`` and the epoch of every line-channel is a counter in
device memory that advances once per iteration in which the channel carries data.

The generators below follow the kernels statement by statement (``allreduce_oneshot.cu``,
``allreduce_twoshot.cu``, ``allreduce_ll128.cu``, the exchange of ``allreduce_rmsnorm.cu``'s two-shot) and the ``LLBuffer`` primitives they call
(``impl/ll_buffer__funcs.h``): ``bcast``/``send`` (a fence at the peer scope first when a receive
of the buffer completed since its last send: ``beforeSend``; two-shot: one fence for both buffers
at the top of every pass after the first, ``releaseReceivesWith``; LL128: one before the adds of
every iteration after the first), ``recvReduce``/``recvGather`` (``pollAll``: every line polled;
a sentinel line reset once read; thread 0's channel 0 also polls each peer's signature word with
its line-0 lines), ``advanceEpoch`` (channels used since the last advance) and ``commit`` (kernel
end).

=====================  =======================================================================
shared instructions    ``SEND`` (one LL/sentinel line store to a peer), ``POLL`` (accept one
                       line of own scratch), ``ADD`` (a line-atomic LL128 add), ``POLL128``
local instructions     ``RESET``/``ZERO`` (issue a store to own scratch that may be performed
                       later), ``FENCE``, ``ADDC`` (own contribution), ``COMBINE`` (LL128
                       restore), ``ISSUE_ADD`` (one lane of a non-atomic LL128 add), ``OUT``,
                       ``END`` (kernel end: waits for the thread's stores to be performed)
=====================  =======================================================================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sollat.layout import Geometry

from . import protocols, rules
from .config import Config, Mutation
from .scratch import LineInfo, Scratch

SEND, POLL, ADD, POLL128 = 0, 1, 2, 3
RESET, ZERO, FENCE, OUT, ADDC, COMBINE, ISSUE_ADD, END = 10, 11, 12, 13, 14, 15, 16, 17
SHARED_OPS = frozenset({SEND, POLL, ADD, POLL128})
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


def input_value(rank: int, call: int, line: int, elem: int = 0) -> int:
    """Deterministic, call-dependent inputs: a stale or lost contribution changes the sum."""
    return 1 + ((rank + 1) * 7919 + (call + 1) * 104729 + (line + 1) * 1299709 + elem * 15485863) % 997


class _Builder:
    """Appends instructions for one thread.

    Fences (``LLBuffer::beforeSend``, ``releaseReceivesWith``): ``received[buffer]`` is set when a
    receive of that buffer completes; the next send of the buffer issues ``fence<peer_scope()>``
    (``fence.acq_rel.sys`` on real ranks, ``.gpu`` on virtual ones) first: PTX orders a poll's load
    before a later store to another line, and a reset before a later send, by nothing but a fence
    (no order from the poll loop's control dependency). ``dirty`` is the rule before session 10
    (``resetPending``: a fence only after sentinel resets), which ``Mutation.NO_REUSE_FENCE``
    restores.
    """

    def __init__(self, cfg: Config, label: str) -> None:
        self.cfg = cfg
        self.prog = ThreadProgram(label)
        self.dirty: dict[str, bool] = {}
        self.received: dict[str, bool] = {}
        self.scope = rules.fence_scope(cfg)
        self.where = label
        self.it = 0
        #: Signature words (sentinel buffers, channel 0's thread of a block): the block, and
        #: (``SIGNATURE_ONCE``) per buffer the peers this thread has sent its word to / polled
        #: theirs from in this call.
        self.sig_block: int | None = None
        self.sig_sent: dict[str, set[int]] = {}
        self.sig_polled: dict[str, set[int]] = {}

    def at(self, it: int, slot: int) -> None:
        self.it = it
        self.where = f"{self.prog.label} it{it} slot{slot}"

    def reg(self) -> int:
        self.prog.nregs += 1
        return self.prog.nregs - 1

    def emit(self, op: int, **kw: Any) -> None:
        self.prog.code.append(Instr(op, self.where, **kw))

    def fence(self) -> None:
        """``fence<peer_scope()>()`` (``GPU_FENCE``: ``.gpu``): acq_rel; ``value`` is its scope."""
        self.emit(FENCE, value=self.scope)

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
        (two-shot: at the top of every pass; LL128: before the adds of every iteration). Not in the
        code before session 10 (``NO_REUSE_FENCE``)."""
        if self.cfg.has(Mutation.NO_REUSE_FENCE):
            return
        if any(self._owes(b) for b in buffers):
            self.fence()
        for b in buffers:
            self.dirty[b] = self.received[b] = False

    def received_from(self, buffer: str) -> None:
        self.received[buffer] = True

    def reset(self, buffer: str, line: int) -> None:
        """``ProtoSentinel::reset`` of a consumed line (``pollAll``); ``dirty`` is the rule before
        session 10 (``resetPending``), which ``Mutation.NO_REUSE_FENCE`` fences by."""
        if self.cfg.has(Mutation.SKIP_SENTINEL_RESET):
            return
        self.emit(RESET, line=line)
        self.dirty[buffer] = True

    def advance(self, epochs: Epochs, key: EpochKey) -> None:
        """``advanceEpoch`` of one channel (the value reaches memory only at ``commit``)."""
        epochs[key] = epochs.get(key, 0) + 1
        self.prog.advances.append((len(self.prog.code), key, epochs[key]))

    def end(self) -> ThreadProgram:
        self.emit(END)
        return self.prog


@dataclass
class Programs:
    """All thread programs of a configuration: ``calls[rank][call]`` is the list of threads, each
    call built from the epochs ``starts[rank][call]`` that every earlier call committed in full."""

    cfg: Config
    scratch: Scratch
    calls: list[list[list[ThreadProgram]]]
    shared_steps: int  # shared instructions over all threads (a bound on a run's length)
    starts: list[list[Epochs]]
    gen: _Gen

    def variant(self, rank: int, call: int, epochs: Epochs) -> list[ThreadProgram]:
        """The threads of ``call`` on ``rank`` when it starts from ``epochs`` (fault path: a thread
        that gave up did not commit). Uses only lines the configuration already has."""
        n = len(self.scratch)
        threads = self.gen.make(rank, call, self.cfg.calls[call], dict(epochs))
        if len(self.scratch) != n:
            raise AssertionError("a program variant touches a line no healthy run touches")
        return threads


class _Gen:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.scratch = Scratch(ll128_lanes=cfg.ll128_lanes, ll128_elems=cfg.ll128_lines, ll_rest=rules.ll_rest(cfg),
                               split=lambda kind: split_line(cfg, kind))
        self.kind = cfg.proto

    def make(self, r: int, k: int, n: int, epochs: Epochs) -> list[ThreadProgram]:
        """Threads of call ``k`` (``n`` lines) on rank ``r``; advances ``epochs`` as the call would."""
        return {"oneshot": self.oneshot, "twoshot": self.twoshot, "ll128": self.ll128,
                "rmsnorm_twoshot": self.rowshot}[self.cfg.algorithm](r, k, n, epochs)

    def sig(self, r: int, k: int, n: int) -> int:
        """The call signature; the mismatch test hook flips bit 1 (``call_signature``)."""
        return rules.signature(self.cfg, n) ^ (2 if self.cfg.fault_at("mismatch", r, k) else 0)

    def both_parities(self) -> None:
        """Registers the other parity of every line, so that a call run from epochs that differ
        from the healthy ones (fault path) finds every line it can touch."""
        for info in list(self.scratch.infos):
            if info.part > 0:
                continue
            if info.kind == "ll128":
                self.acc_line(info.rank, info.parity + 1, info.slot, info.sub)
            elif info.kind == "sig":
                self.sig_line(info.rank, info.buffer, info.parity + 1, info.src, info.slot)
            else:
                self.line(info.rank, info.buffer, info.parity + 1, info.src, info.slot, info.kind)

    def line(self, rank: int, buffer: str, epoch: int, src: int, slot: int, kind: str | None = None) -> int:
        """``LLBuffer::peerLine`` / ``ownLine``: (parity, src, slot) in ``rank``'s region of ``buffer``."""
        par = rules.parity(self.cfg, epoch)
        addr = rules.line_address(self.cfg, par, src, slot)
        return self.scratch.line(LineInfo(rank, buffer, kind or self.kind, par, src, slot, 0, addr))

    # ---- signature words (sentinel buffers: ll_buffer.h, "Signature words") -----------------------
    def sig_thread(self, B: _Builder, b: int, t: int) -> None:
        """The thread of block ``b`` whose channel 0 is (b, slot 0, thread 0) carries the block's
        signature words: model thread 0 (its bundle's first real thread is thread 0)."""
        if self.cfg.signature_words and t == 0:
            B.sig_block = b

    def sig_ring(self) -> bool:
        """``SigPeers::Ring``: the word goes to rank + 1 only (and is polled from rank - 1). The
        device's built-in all-to-all kernels; the fused two-shot sends one with every line-0 send
        (``Mutation.RING_IN_FUSED_TWOSHOT`` gives it the ring too)."""
        if self.cfg.sig_peers != "ring":
            return False
        return self.cfg.algorithm != "rmsnorm_twoshot" or self.cfg.has(Mutation.RING_IN_FUSED_TWOSHOT)

    def sig_line(self, rank: int, buffer: str, epoch: int, src: int, block: int) -> int:
        """The signature word of ``block`` from ``src`` in ``rank``'s region of ``buffer``, parity
        ``epoch & 1`` (the parity of the line-0 data line it travels with)."""
        par = rules.parity(self.cfg, epoch)
        addr = rules.signature_address(self.cfg, par, src, block)
        return self.scratch.line(LineInfo(rank, buffer, "sig", par, src, block, 0, addr))

    def sig_send(self, B: _Builder, r: int, k: int, sig: int, buffer: str, p: int,
                 epochs: dict[tuple[str, int], int]) -> None:
        """With each line-0 send (or bcast) of ``buffer`` to ``p``, channel 0's thread stores the
        block's signature word ``sig << 32 | epoch`` (channel 0's epoch) into p's region, at the
        (parity, source r) part: one aligned 8-byte volatile store. ``SIGNATURE_ONCE``: with the
        call's first line-0 send to ``p`` only."""
        b = B.sig_block
        if b is None or (self.sig_ring() and p != (r + 1) % self.cfg.nranks):
            return
        if self.cfg.has(Mutation.SIGNATURE_ONCE):
            if p in B.sig_sent.setdefault(buffer, set()):
                return
            B.sig_sent[buffer].add(p)
        e = epochs.get((buffer, rules.channel(self.cfg, b, 0, 0)), 0)
        B.emit(SEND, line=self.sig_line(p, buffer, e, r, b), value=0, flag=rules.sig_word(self.cfg, sig, e),
               tag=(k, -1 - b, e), peer=p)

    def sig_items(self, B: _Builder, r: int, k: int, sig: int, buffer: str, peers: list[int],
                  epochs: dict[tuple[str, int], int]) -> None:
        """With each line-0 receive of ``buffer`` from a peer in ``peers``, channel 0's thread polls
        that peer's signature word in the same wait (one 8-byte volatile load per poll). The word is
        never cleared: it only ever holds epochs e, e-2, ... of its parity (written with the line-0
        data of the same channel, pass and parity), so its reuse rests on that line's credit and
        fence. ``SIGNATURE_ONCE``: with the call's first line-0 receive from the peer only."""
        b = B.sig_block
        if b is None:
            return
        e = epochs.get((buffer, rules.channel(self.cfg, b, 0, 0)), 0)
        for p in peers:
            if self.sig_ring() and p != (r - 1) % self.cfg.nranks:
                continue
            if self.cfg.has(Mutation.SIGNATURE_ONCE):
                if p in B.sig_polled.setdefault(buffer, set()):
                    continue
                B.sig_polled[buffer].add(p)
            B.emit(POLL, line=self.sig_line(r, buffer, e, p, b), reg=B.reg(), flag=rules.sig_word(self.cfg, sig, e),
                   tag=(k, -1 - b, e), peer=p)

    def acc_line(self, rank: int, epoch: int, slot: int, sub: int) -> int:
        par = rules.parity(self.cfg, epoch)
        addr = rules.acc_line_address(self.cfg, par, slot, sub)
        return self.scratch.line(LineInfo(rank, "acc", "ll128", par, -1, slot, sub, addr))

    def flag(self, sig: int, epoch: int) -> Any:
        return rules.ll_flag(self.cfg, sig, epoch) if self.kind == "ll" else None

    def _poll_all(self, B: _Builder, r: int, buffer: str, items: list[tuple[int, int, int, int, Any]],
                  sig: int, epochs: dict[tuple[str, int], int]) -> None:
        """``LLBuffer::pollAll``: poll every (peer, slot) line until complete; a sentinel line is
        reset as soon as it is read (``checkPolls``).

        ``items``: (peer, slot i, channel s, register, ghost tag) in the device's (peer, slot) order.
        """
        for p, i, s, reg, tag in items:
            B.at(B.it, i)
            e = epochs.get((buffer, s), 0)
            ln = self.line(r, buffer, e, p, s)
            B.emit(POLL, line=ln, reg=reg, flag=self.flag(sig, e), tag=tag, peer=p)
            if self.kind == "sentinel":
                B.reset(buffer, ln)
        if items:
            B.at(B.it, 0)
            self.sig_items(B, r, items[0][4][0], sig, buffer,
                           [p for p, i, *_ in items if i == 0], epochs)
            B.received_from(buffer)

    def _active(self, geo: Geometry, it: int, b: int, t: int, lines: int) -> list[tuple[int, int, int]]:
        """(slot, message line, channel) of every slot of thread (b, t) with data in iteration it."""
        chans = [(i, rules.message_line(geo, it, b, i, t), rules.channel(self.cfg, b, i, t))
                 for i in range(geo.slots)]
        return [c for c in chans if c[1] < lines]

    def _threads(self, r: int, k: int, geo: Geometry, lines: int,
                 iteration: Callable[[_Builder, int, list[tuple[int, int, int]]], None],
                 epochs: dict[tuple[str, int], int]) -> list[ThreadProgram]:
        """One program per (block, thread) of call ``k`` on rank ``r``: ``iteration(B, it, chans)``
        for every iteration in which the thread has data (``_active``), then the kernel end
        (``commit``)."""
        threads = []
        for b in range(geo.blocks):
            for t in range(geo.threads):
                B = _Builder(self.cfg, f"r{r} call{k} b{b}.t{t}")
                self.sig_thread(B, b, t)
                for it in range(geo.iterations):
                    B.at(it, 0)
                    chans = self._active(geo, it, b, t, lines)
                    if not chans:
                        break
                    iteration(B, it, chans)
                threads.append(B.end())  # buf.commit, kernel end
        return threads

    # ---- one-shot: allreduce_oneshot.cu ---------------------------------------------------------
    def oneshot(self, r: int, k: int, n: int, epochs: dict[tuple[str, int], int]) -> list[ThreadProgram]:
        cfg, R = self.cfg, self.cfg.nranks
        geo = rules.model_geometry(cfg, n)
        sig = self.sig(r, k, n)

        def iteration(B: _Builder, it: int, chans: list[tuple[int, int, int]]) -> None:
            for i, x, s in chans:  # buf.bcast(i, own[i])
                B.at(it, i)
                e = epochs.get(("oneshot", s), 0)
                B.before_send("oneshot")
                for p in range(R):
                    if p != r:
                        B.emit(SEND, line=self.line(p, "oneshot", e, r, s), value=input_value(r, k, x),
                               flag=self.flag(sig, e), tag=(k, x, e), peer=p)
                        if i == 0:
                            self.sig_send(B, r, k, sig, "oneshot", p, epochs)
            acc = {i: B.reg() for i, _, _ in chans}
            items = [(p, i, s, acc[i], (k, x, epochs.get(("oneshot", s), 0)))
                     for p in range(R) if p != r for i, x, s in chans]
            self._poll_all(B, r, "oneshot", items, sig, epochs)  # buf.recvReduce
            for i, x, s in chans:  # own value in rank order (sum: exact either way)
                B.at(it, i)
                B.emit(ADDC, reg=acc[i], value=input_value(r, k, x))
                B.emit(OUT, reg=acc[i], expect=sum(input_value(q, k, x) for q in range(R)), value=x)
                B.advance(epochs, ("oneshot", s))  # buf.advanceEpoch

        return self._threads(r, k, geo, n, iteration, epochs)

    # ---- two-shot: allreduce_twoshot.cu ---------------------------------------------------------
    def twoshot(self, r: int, k: int, n: int, epochs: dict[tuple[str, int], int]) -> list[ThreadProgram]:
        cfg, R = self.cfg, self.cfg.nranks
        cl = rules.chunk_lines(cfg, n)
        geo = rules.model_geometry(cfg, cl)
        sig = self.sig(r, k, n)
        unpadded = cfg.has(Mutation.UNPADDED_CHUNKS)

        def inp(q: int, m: int) -> int:
            return input_value(q, k, m) if m < n else 0  # load_pack pads past n with zeros

        def exists(c: int, x: int) -> bool:
            return not unpadded or c * cl + x < n

        def iteration(B: _Builder, it: int, chans: list[tuple[int, int, int]]) -> None:
            B.release("rs", "ag")  # rs.releaseReceivesWith(ag): the previous pass's receives, one fence
            # reduce-scatter: rs.send(c, i, line x of chunk c) for every c != self
            for c in range(R):
                if c == r:
                    continue
                for i, x, s in chans:
                    if not exists(c, x):
                        continue
                    B.at(it, i)
                    e = epochs.get(("rs", s), 0)
                    B.before_send("rs")
                    B.emit(SEND, line=self.line(c, "rs", e, r, s), value=inp(r, c * cl + x),
                           flag=self.flag(sig, e), tag=(k, c * cl + x, e), peer=c)
                    if i == 0:
                        self.sig_send(B, r, k, sig, "rs", c, epochs)
            mine = [ch for ch in chans if exists(r, ch[1])]
            acc = {i: B.reg() for i, _, _ in mine}
            items = [(p, i, s, acc[i], (k, r * cl + x, epochs.get(("rs", s), 0)))
                     for p in range(R) if p != r for i, x, s in mine]
            self._poll_all(B, r, "rs", items, sig, epochs)  # rs.recvReduce
            for i, x, _s in mine:
                B.emit(ADDC, reg=acc[i], value=inp(r, r * cl + x))
            # all-gather: ag.bcast(i, reduced), write own chunk's line
            for i, x, s in mine:
                B.at(it, i)
                e = epochs.get(("ag", s), 0)
                m = r * cl + x
                B.before_send("ag")
                for p in range(R):
                    if p != r:
                        B.emit(SEND, line=self.line(p, "ag", e, r, s), reg=acc[i],
                               flag=self.flag(sig, e), tag=(k, m, e), peer=p)
                        if i == 0:
                            self.sig_send(B, r, k, sig, "ag", p, epochs)
                if m < n:
                    B.emit(OUT, reg=acc[i], expect=sum(inp(q, m) for q in range(R)), value=m)
            got = {(c, i): B.reg() for c in range(R) for i, x, _ in chans if c != r and exists(c, x)}
            items = [(c, i, s, got[(c, i)], (k, c * cl + x, epochs.get(("ag", s), 0)))
                     for c in range(R) if c != r for i, x, s in chans if exists(c, x)]
            self._poll_all(B, r, "ag", items, sig, epochs)  # ag.recvGather
            for c in range(R):
                for i, x, _s in chans:
                    m = c * cl + x
                    if c != r and m < n:
                        B.at(it, i)
                        B.emit(OUT, reg=got[(c, i)], expect=sum(inp(q, m) for q in range(R)), value=m)
            for _i, _x, s in chans:  # rs.advanceEpoch(); ag.advanceEpoch()
                B.advance(epochs, ("rs", s))
                B.advance(epochs, ("ag", s))

        return self._threads(r, k, geo, cl, iteration, epochs)

    # ---- fused RMSNorm two-shot's exchange: allreduce_rmsnorm.cu, SOLLAT_RMSNORM_TWOSHOT ------------
    def rowshot(self, r: int, k: int, n: int, epochs: dict[tuple[str, int], int]) -> list[ThreadProgram]:
        """``twoshot_pass``: a model line of a call is one row (of one line), owned by rank
        ``row % R`` (``rmsnorm.row_owner``); cut as the one-shot's message. Per iteration: every slot
        whose row another rank owns sends its line to that owner only (buffer "rs", after
        ``ag.releaseResets``); then per slot the owner ``recvReduce``s the others' lines and
        ``bcast``s the sum (buffer "ag", after ``buf.releaseResets``), a non-owner receives the
        owner's sum; both buffers advance on every active channel. Only the exchange is modelled
        (the norm is local arithmetic)."""
        cfg, R = self.cfg, self.cfg.nranks
        geo = rules.model_geometry(cfg, n)
        sig = self.sig(r, k, n)

        def iteration(B: _Builder, it: int, chans: list[tuple[int, int, int]]) -> None:
            for i, x, s in chans:  # non-owner: buf.send(owner, i, own[i])
                if x % R != r:
                    B.at(it, i)
                    e = epochs.get(("rs", s), 0)
                    B.before_send("ag")  # ag.releaseReceives() (the fence beforeSend would issue)
                    B.before_send("rs")
                    B.emit(SEND, line=self.line(x % R, "rs", e, r, s), value=input_value(r, k, x),
                           flag=self.flag(sig, e), tag=(k, x, e), peer=x % R)
                    if i == 0:
                        self.sig_send(B, r, k, sig, "rs", x % R, epochs)
            for i, x, s in chans:
                B.at(it, i)
                want = sum(input_value(q, k, x) for q in range(R))
                got = B.reg()
                if x % R == r:  # owner: recvReduce, then bcast the sum
                    e_rs, e_ag = epochs.get(("rs", s), 0), epochs.get(("ag", s), 0)
                    items = [(p, i, s, got, (k, x, e_rs)) for p in range(R) if p != r]
                    self._poll_all(B, r, "rs", items, sig, epochs)
                    B.emit(ADDC, reg=got, value=input_value(r, k, x))
                    B.before_send("rs")  # buf.releaseReceives()
                    B.before_send("ag")
                    for p in range(R):
                        if p != r:
                            B.emit(SEND, line=self.line(p, "ag", e_ag, r, s), reg=got,
                                   flag=self.flag(sig, e_ag), tag=(k, x, e_ag), peer=p)
                            if i == 0:
                                self.sig_send(B, r, k, sig, "ag", p, epochs)
                else:  # ag.recvUnrolled from the owner
                    item = (x % R, i, s, got, (k, x, epochs.get(("ag", s), 0)))
                    self._poll_all(B, r, "ag", [item], sig, epochs)
                B.emit(OUT, reg=got, expect=want, value=x)
            for _i, _x, s in chans:  # buf.advanceEpoch(); ag.advanceEpoch()
                B.advance(epochs, ("rs", s))
                B.advance(epochs, ("ag", s))

        return self._threads(r, k, geo, n, iteration, epochs)

    # ---- two-shot LL128 atomic: allreduce_ll128.cu ------------------------------------------------
    def ll128(self, r: int, k: int, n: int, epochs: dict[tuple[str, int], int]) -> list[ThreadProgram]:
        """One model thread = one warp (a bundle of warps); a model line of a call = one warp-unit."""
        cfg, R = self.cfg, self.cfg.nranks
        cl = rules.chunk_lines(cfg, n)
        geo = rules.model_geometry(cfg, cl)
        sig = self.sig(r, k, n)
        W, L = cfg.ll128_lines, cfg.ll128_lanes
        P = protocols.ll128_payload(W, L)
        g = rules.bundle(cfg)
        split = cfg.ll128_split
        atomic = cfg.line_atomic and not split

        def inp(q: int, m: int) -> tuple[int, ...]:
            return tuple(input_value(q, k, m, j) if m < n else 0 for j in range(P))

        def total(m: int) -> tuple[int, ...]:
            return tuple(sum(v) for v in zip(*(inp(q, m) for q in range(R)), strict=True))

        threads = []
        for b in range(geo.blocks):
            for t in range(geo.threads):
                B = _Builder(cfg, f"r{r} call{k} b{b}.w{t}")
                slot = rules.acc_slot(b, t * g)  # lane 0 of the representative warp
                ch = rules.channel(cfg, b, 0, t)  # the all-gather LLBuffer's channel
                for it in range(geo.iterations):
                    x = rules.message_line(geo, it, b, 0, t)  # unit j of every chunk
                    if x >= cl:
                        break
                    B.at(it, 0)
                    e = epochs.get(("acc", slot), 0)
                    B.release("ag")  # ag.releaseReceives(): the previous all-gather receive before these adds
                    # reduce-scatter: every lane adds into every owner's line (own chunk included)
                    packed = {c: protocols.ll128_pack(inp(r, c * cl + x), W, L, counter=0 if split else 1)
                              for c in range(R)}
                    for c in range(R):
                        tag = (k, c * cl + x, e)
                        for sub in range(W):
                            ln = self.acc_line(c, e, slot, sub)
                            if atomic:
                                B.emit(ADD, line=ln, value=packed[c][sub], tag=tag, peer=c)
                            else:
                                for lane in range(L):
                                    B.emit(ISSUE_ADD, line=ln, lane=lane, value=packed[c][sub][lane], tag=tag, peer=c)
                    if split:  # __syncwarp(); fence<peer_scope()> (acq_rel); counter adds
                        if not cfg.has(Mutation.SPLIT_NO_FENCE):
                            B.fence()
                        for c in range(R):
                            for sub in range(W):
                                B.emit(ISSUE_ADD, line=self.acc_line(c, e, slot, sub), lane=COUNTER_LANE,
                                       value=(1,) + (0,) * (W - 1), tag=(k, c * cl + x, e), peer=c)
                    # owner: poll the W counters until R, read, restore, zero, fence
                    m = r * cl + x
                    snaps = []
                    for sub in range(W):
                        snap = B.reg()
                        snaps.append(snap)
                        B.emit(POLL128, line=self.acc_line(r, e, slot, sub), reg=snap, expect=R, tag=(k, m, e))
                    if split:  # the acquire side of the counter, before the data is read (fence<peer_scope()>)
                        B.fence()
                    red = B.reg()
                    B.emit(COMBINE, reg=red, srcs=tuple(snaps))
                    if not cfg.has(Mutation.SKIP_LL128_ZERO):
                        for sub in range(W):
                            B.emit(ZERO, line=self.acc_line(r, e, slot, sub))
                        if not cfg.has(Mutation.RESET_AFTER_SEND):
                            B.fence()  # fence<peer_scope()>: the read and the zeroing before the all-gather sends
                    B.advance(epochs, ("acc", slot))
                    # all-gather (LLBuffer<ProtoLL>): bcast own unit, write it, collect the others
                    ea = epochs.get(("ag", ch), 0)
                    B.before_send("ag")
                    for p in range(R):
                        if p != r:
                            B.emit(SEND, line=self.line(p, "ag", ea, r, ch), reg=red, flag=self.flag(sig, ea),
                                   tag=(k, m, ea), peer=p)
                    if m < n:
                        B.emit(OUT, reg=red, expect=total(m), value=m)
                    for c in range(R):
                        if c == r:
                            continue
                        mc = c * cl + x
                        gr = B.reg()
                        B.emit(POLL, line=self.line(r, "ag", ea, c, ch), reg=gr, flag=self.flag(sig, ea),
                               tag=(k, mc, ea), peer=c)
                        if mc < n:
                            B.emit(OUT, reg=gr, expect=total(mc), value=mc)
                    B.received_from("ag")
                    B.advance(epochs, ("ag", ch))
                threads.append(B.end())
        return threads


def build(cfg: Config) -> Programs:
    """Programs of every thread of every call on every rank.

    Each rank runs its own epoch bookkeeping (a counter per (buffer, line-channel), written back at
    kernel end and read by the next call), as each device does with its own epoch array.
    """
    gen = _Gen(cfg)
    calls: list[list[list[ThreadProgram]]] = []
    starts: list[list[Epochs]] = []
    for r in range(cfg.nranks):
        epochs: Epochs = {}
        per_rank = []
        starts.append([])
        for k, n in enumerate(cfg.calls):
            start = dict(epochs)
            starts[r].append(start)
            per_rank.append(gen.make(r, k, n, epochs))
            if cfg.has(Mutation.SKIP_COMMIT):
                epochs = dict(start)  # the kernel's advances never reach device memory
        calls.append(per_rank)
    _check_outputs(cfg, calls)
    if cfg.fault_path:
        gen.both_parities()
    shared = sum(1 for rank in calls for call in rank for th in call for ins in th.code if ins.op in SHARED_OPS)
    return Programs(cfg, gen.scratch, calls, shared, starts, gen)


def _check_outputs(cfg: Config, calls: list[list[list[ThreadProgram]]]) -> None:
    """Static coverage: every output line of every rank and call is written exactly once."""
    for r, per_rank in enumerate(calls):
        for k, threads in enumerate(per_rank):
            written = sorted(ins.value for th in threads for ins in th.code if ins.op == OUT)
            if written != list(range(cfg.calls[k])):
                raise AssertionError(f"rank {r} call {k}: outputs written {written}, want 0..{cfg.calls[k] - 1}")
