"""Algorithms as straight-line thread programs of memory operations, mirroring the kernels.

(The instructions and the thread builder are in ``program.py``; what every algorithm's generator
shares, lines, signature words and the thread loop, in ``generator.py``.)

Each modelled thread (one per (rank, call, block, thread) of the call's geometry) runs a fixed
list of instructions; the only control flow of the device kernels that depends on timing is the
poll loop, which the machine models as a *blocking* instruction (enabled once the line holds what
the poll waits for). Everything else is a pure function of the call, exactly as on the device,
where the cut of a call is ``layout.plan`` and the epoch of every line-channel is a counter in
device memory that advances once per iteration in which the channel carries data.

The generators below follow the kernels statement by statement (``allreduce_oneshot.cu``,
``allreduce_twoshot.cu``, ``allreduce_ll128.cu``, the exchange of ``allreduce_rmsnorm.cu``'s two-shot;
``allreduce_oneshot_wide.cu`` in ``wide.py``) and the ``LLBuffer`` primitives they call
(``impl/ll_buffer__funcs.h``): ``bcast``/``send`` (a fence at the peer scope first when a receive
of the buffer completed since its last send: ``beforeSend``; two-shot: one fence for both buffers
at the top of every pass after the first, ``releaseReceivesWith``; LL128: one before the adds of
every iteration after the first), ``recvReduce``/``recvGather`` (``pollAll``: every line polled;
a sentinel line reset once read; each thread also polls each peer's signature word with its
lines), ``advanceEpoch`` (channels used since the last advance) and ``commit`` (kernel
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

from dataclasses import dataclass

from sollat.device import layout
from sollat.device.layout import Geometry

from . import protocols, rules
from .config import Config, Mutation
from .program import (
    ADD,
    ADDC,
    COMBINE,
    COUNTER_LANE,
    ISSUE_ADD,
    OUT,
    POLL,
    POLL128,
    SEND,
    SHARED_OPS,
    ZERO,
    Builder,
    Epochs,
    ThreadProgram,
    input_value,
)
from .scratch import Scratch
from .wide import WideOneshot

__all__ = ["Programs", "build"]


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


class _Gen(WideOneshot):
    """The thread programs of each algorithm, statement by statement after its kernel (the wide
    one-shot's in ``wide.py``)."""

    def make(self, r: int, k: int, n: int, epochs: Epochs) -> list[ThreadProgram]:
        """Threads of call ``k`` (``n`` lines) on rank ``r``; advances ``epochs`` as the call would."""
        return {"oneshot": self.oneshot, "twoshot": self.twoshot, "ll128": self.ll128,
                "rmsnorm_twoshot": self.rowshot, "oneshot_wide": self.oneshot_wide}[self.cfg.algorithm](r, k, n, epochs)
    # ---- one-shot: allreduce_oneshot.cu ---------------------------------------------------------
    def oneshot(self, r: int, k: int, n: int, epochs: Epochs) -> list[ThreadProgram]:
        cfg, R = self.cfg, self.cfg.nranks
        geo = rules.model_geometry(cfg, n)
        sig = self.sig(r, k, n)

        def iteration(B: Builder, it: int, chans: list[tuple[int, int, int]]) -> None:
            for i, x, s in chans:  # buf.bcast(i, own[i])
                B.at(it, i)
                e = epochs.get(("oneshot", s), 0)
                B.before_send("oneshot")
                for p in range(R):
                    if p != r:
                        if i == 0:  # the signature word first, then the line
                            self.sig_send(B, r, k, sig, "oneshot", p, epochs)
                        B.emit(SEND, line=self.line(p, "oneshot", e, r, s), value=self.inp(r, k, x),
                               flag=self.flag(sig, e), tag=(k, x, e), peer=p)
            acc = {i: B.reg() for i, _, _ in chans}
            items = [(p, i, s, acc[i], (k, x, epochs.get(("oneshot", s), 0)))
                     for p in range(R) if p != r for i, x, s in chans]
            self._poll_all(B, r, "oneshot", items, sig, epochs)  # buf.recvReduce
            for i, x, s in chans:  # own value in rank order (sum: exact either way)
                B.at(it, i)
                B.emit(ADDC, reg=acc[i], value=self.inp(r, k, x))
                B.emit(OUT, reg=acc[i], expect=sum(input_value(q, k, x) for q in range(R)), value=x)
                B.advance(epochs, ("oneshot", s))  # buf.advanceEpoch

        return self._threads(r, k, geo, n, iteration, epochs)

    def _chunked(self, r: int, k: int, n: int) -> tuple[int, Geometry, int]:
        """A call cut in one chunk per rank (two-shot, LL128): the lines of a chunk, the geometry
        of one chunk, the call's signature."""
        cl = rules.chunk_lines(self.cfg, n)
        return cl, rules.model_geometry(self.cfg, cl), self.sig(r, k, n)

    # ---- two-shot: allreduce_twoshot.cu ---------------------------------------------------------
    def twoshot(self, r: int, k: int, n: int, epochs: Epochs) -> list[ThreadProgram]:
        cfg, R = self.cfg, self.cfg.nranks
        cl, geo, sig = self._chunked(r, k, n)
        unpadded = cfg.has(Mutation.UNPADDED_CHUNKS)

        def inp(q: int, m: int) -> int:
            return self.inp(q, k, m) if m < n else 0  # load_pack pads past n with zeros

        def want(m: int) -> int:  # the exact sum of the agreeing call
            return sum(input_value(q, k, m) for q in range(R)) if m < n else 0

        def exists(c: int, x: int) -> bool:
            return not unpadded or c * cl + x < n

        def iteration(B: Builder, it: int, chans: list[tuple[int, int, int]]) -> None:
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
                    if i == 0:
                        self.sig_send(B, r, k, sig, "rs", c, epochs)
                    B.emit(SEND, line=self.line(c, "rs", e, r, s), value=inp(r, c * cl + x),
                           flag=self.flag(sig, e), tag=(k, c * cl + x, e), peer=c)
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
                        if i == 0:
                            self.sig_send(B, r, k, sig, "ag", p, epochs)
                        B.emit(SEND, line=self.line(p, "ag", e, r, s), reg=acc[i],
                               flag=self.flag(sig, e), tag=(k, m, e), peer=p)
                if m < n:
                    B.emit(OUT, reg=acc[i], expect=want(m), value=m)
            got = {(c, i): B.reg() for c in range(R) for i, x, _ in chans if c != r and exists(c, x)}
            items = [(c, i, s, got[(c, i)], (k, c * cl + x, epochs.get(("ag", s), 0)))
                     for c in range(R) if c != r for i, x, s in chans if exists(c, x)]
            self._poll_all(B, r, "ag", items, sig, epochs)  # ag.recvGather
            for c in range(R):
                for i, x, _s in chans:
                    m = c * cl + x
                    if c != r and m < n:
                        B.at(it, i)
                        B.emit(OUT, reg=got[(c, i)], expect=want(m), value=m)
            for _i, _x, s in chans:  # rs.advanceEpoch(); ag.advanceEpoch()
                B.advance(epochs, ("rs", s))
                B.advance(epochs, ("ag", s))

        return self._threads(r, k, geo, cl, iteration, epochs)

    # ---- fused RMSNorm two-shot's exchange: allreduce_rmsnorm.cu, SOLLAT_RMSNORM_TWOSHOT ------------
    def rowshot(self, r: int, k: int, n: int, epochs: Epochs) -> list[ThreadProgram]:
        """``twoshot_pass``: a model line is one line of a row; the lines a thread handles in one
        pass (its slots) belong to one row, as a pass of the device's row cluster does, numbered by
        its slot-0 line and owned by rank ``row % R`` (``rmsnorm.row_owner``); cut as the one-shot's
        message. Per pass: a non-owner sends its lines to the owner only (buffer "rs", after
        ``ag.releaseReceives``); the owner ``recvReduce``s the others' lines, adds its own and
        ``bcast``s the sums (buffer "ag", after ``buf.releaseReceives``); a non-owner receives the
        owner's sums (``recvUnrolled``); both buffers advance on every active channel. Only the
        exchange is modelled (the norm is local arithmetic)."""
        cfg, R = self.cfg, self.cfg.nranks
        geo = rules.model_geometry(cfg, n)
        sig = self.sig(r, k, n)

        def iteration(B: Builder, it: int, chans: list[tuple[int, int, int]]) -> None:
            owner = chans[0][1] % R  # the pass's row: its slot-0 line
            got = {i: B.reg() for i, _, _ in chans}
            if owner != r:  # buf.send(owner, i, own[i]) for every active slot
                B.before_send("ag")  # ag.releaseReceives() (the fence beforeSend would issue)
                for i, x, s in chans:
                    B.at(it, i)
                    e = epochs.get(("rs", s), 0)
                    B.before_send("rs")
                    if i == 0:
                        self.sig_send(B, r, k, sig, "rs", owner, epochs)
                    B.emit(SEND, line=self.line(owner, "rs", e, r, s), value=self.inp(r, k, x),
                           flag=self.flag(sig, e), tag=(k, x, e), peer=owner)
                items = [(owner, i, s, got[i], (k, x, epochs.get(("ag", s), 0))) for i, x, s in chans]
                self._poll_all(B, r, "ag", items, sig, epochs)  # ag.recvUnrolled from the owner
            else:  # owner: recvReduce, then bcast the sums
                items = [(p, i, s, got[i], (k, x, epochs.get(("rs", s), 0))) for p in range(R) if p != r
                         for i, x, s in chans]
                self._poll_all(B, r, "rs", items, sig, epochs)
                B.before_send("rs")  # buf.releaseReceives()
                for i, x, s in chans:
                    B.at(it, i)
                    B.emit(ADDC, reg=got[i], value=self.inp(r, k, x))
                    e = epochs.get(("ag", s), 0)
                    B.before_send("ag")
                    for p in range(R):
                        if p != r:
                            if i == 0:
                                self.sig_send(B, r, k, sig, "ag", p, epochs)
                            B.emit(SEND, line=self.line(p, "ag", e, r, s), reg=got[i],
                                   flag=self.flag(sig, e), tag=(k, x, e), peer=p)
            for i, x, _s in chans:
                B.at(it, i)
                B.emit(OUT, reg=got[i], expect=sum(input_value(q, k, x) for q in range(R)), value=x)
            for _i, _x, s in chans:  # buf.advanceEpoch(); ag.advanceEpoch()
                B.advance(epochs, ("rs", s))
                B.advance(epochs, ("ag", s))

        return self._threads(r, k, geo, n, iteration, epochs)

    # ---- two-shot LL128 atomic: allreduce_ll128.cu ------------------------------------------------
    def ll128(self, r: int, k: int, n: int, epochs: Epochs) -> list[ThreadProgram]:
        """One model thread = one warp (a bundle of warps); a model line of a call = one warp-unit."""
        cfg, R = self.cfg, self.cfg.nranks
        cl, geo, sig = self._chunked(r, k, n)
        W, L = cfg.ll128_lines, cfg.ll128_lanes
        P = protocols.ll128_payload(W, L)
        g = rules.bundle(cfg)
        split = cfg.ll128_split
        atomic = cfg.line_atomic and not split
        words = cfg.ll128_signature_words

        def inp(q: int, m: int) -> tuple[int, ...]:
            return tuple(self.inp(q, k, m, j) if m < n else 0 for j in range(P))

        def total(m: int) -> tuple[int, ...]:  # the exact sum of the agreeing call
            return tuple(sum(input_value(q, k, m, j) for q in range(R)) if m < n else 0 for j in range(P))

        threads = []
        for b in range(geo.blocks):
            for t in range(geo.threads):
                B = Builder(cfg, f"r{r} call{k} b{b}.w{t}")
                slot = rules.acc_slot(b, t * g)  # lane 0 of the representative warp
                ch = rules.channel(cfg, b, 0, t)  # the all-gather LLBuffer's channel

                def word(src: int, b: int = b, t: int = t) -> int:  # the in-part word of (src, this warp)
                    return rules.ll128_signature_slot(cfg, b, t * g // layout.WARP, src)

                for it in range(geo.iterations):
                    x = rules.message_line(geo, it, b, 0, t)  # unit j of every chunk
                    if x >= cl:
                        break
                    B.at(it, 0)
                    e = epochs.get(("acc", slot), 0)
                    B.release("ag")  # ag.releaseReceives(): the previous all-gather receive before these adds
                    if words:  # the warp's signature word into every other owner, before its adds
                        for c in range(R):
                            if c != r:
                                B.emit(SEND, line=self.word(c, "acc", e, r, slot, word(r)), value=0,
                                       flag=rules.ll128_sig_word(cfg, sig, e), tag=(k, -1 - slot, e), peer=c)
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
                    if words:  # and every other source's word for this warp (same wait; __syncwarp after)
                        for q in range(R):
                            if q != r:
                                B.emit(POLL, line=self.word(r, "acc", e, q, slot, word(q)), reg=B.reg(),
                                       flag=rules.ll128_sig_word(cfg, sig, e), tag=(k, -1 - slot, e), peer=q)
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
                                   tag=(k, m, ea), peer=p)  # LL: every line carries the signature
                    if m < n:
                        B.emit(OUT, reg=red, expect=total(m), value=m)
                    for c in range(R):
                        if c == r:
                            continue
                        mc = c * cl + x
                        gr = B.reg()
                        B.emit(POLL, line=self.line(r, "ag", ea, c, ch), reg=gr, flag=self.want(sig, ea),
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
            want = rules.out_lines(cfg, cfg.calls[k])
            if written != list(range(want)):
                raise AssertionError(f"rank {r} call {k}: outputs written {written}, want 0..{want - 1}")
