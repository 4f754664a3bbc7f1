"""What the program generator of every algorithm (``algorithms._Gen``) shares: the scratch lines
(``LLBuffer::peerLine``/``ownLine``, LL128 accumulator lines), the signature words, ``pollAll``,
the inputs of a call (another call's where the mismatch hook makes a rank differ) and the loop
over a call's (block, thread) programs and iterations."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sollat.device import layout
from sollat.device.layout import Geometry

from . import rules
from .config import Config, Mutation
from .program import POLL, SEND, Builder, Epochs, ThreadProgram, input_value, split_line
from .scratch import LineInfo, Scratch


class ProgramGenerator:
    """The lines, signature words and thread loop of one configuration's programs; a subclass
    generates each algorithm's iterations (``make``)."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.scratch = Scratch(ll128_lanes=cfg.ll128_lanes, ll128_elems=cfg.ll128_lines, ll_rest=rules.ll_rest(cfg),
                               split=lambda kind: split_line(cfg, kind))
        self.kind = cfg.proto

    def sig(self, r: int, k: int, n: int) -> int:
        """The call signature; the mismatch test hook flips bit 1 (``call_signature``)."""
        return rules.signature(self.cfg, n) ^ (2 if self.differs(r, k) else 0)

    def differs(self, r: int, k: int) -> bool:
        """Rank r's call k is another call than the other ranks' (the mismatch hook)."""
        return self.cfg.fault_at("mismatch", r, k) is not None

    def inp(self, r: int, k: int, x: int, elem: int = 0) -> int:
        """Rank r's input of line x (element ``elem``) in call k: another call's data if it differs."""
        return input_value(r, k, x, elem, self.differs(r, k))

    def both_parities(self) -> None:
        """Registers the other parity of every line, so that a call run from epochs that differ
        from the healthy ones (fault path) finds every line it can touch."""
        for info in list(self.scratch.infos):
            if info.part > 0:
                continue
            if info.kind == "ll128":
                self.acc_line(info.rank, info.parity + 1, info.slot, info.sub)
            elif info.kind == "sig":
                self.word(info.rank, info.buffer, info.parity + 1, info.src, info.slot, info.sub)
            else:
                self.line(info.rank, info.buffer, info.parity + 1, info.src, info.slot, info.kind)

    def line(self, rank: int, buffer: str, epoch: int, src: int, slot: int, kind: str | None = None) -> int:
        """``LLBuffer::peerLine`` / ``ownLine``: (parity, src, slot) in ``rank``'s region of ``buffer``."""
        par = rules.parity(self.cfg, epoch)
        addr = rules.line_address(self.cfg, par, src, slot)
        return self.scratch.line(LineInfo(rank, buffer, kind or self.kind, par, src, slot, 0, addr))

    def word(self, rank: int, buffer: str, epoch: int, src: int, channel: int, word: int) -> int:
        """A signature word from ``src`` in ``rank``'s region of ``buffer``, parity ``epoch & 1``:
        in-part word ``word`` of the (parity, src) part (sentinel buffers: 4-byte words) or of the
        accumulator buffer's (parity, 1) part (LL128: 8-byte words); ``channel`` names the thread it
        belongs to."""
        par = rules.parity(self.cfg, epoch)
        ll128 = buffer == "acc"
        addr = rules.signature_address(self.cfg, par, 1 if ll128 else src, word, "ll128" if ll128 else "sentinel")
        return self.scratch.line(LineInfo(rank, buffer, "sig", par, src, channel, word, addr))

    # ---- signature words (sentinel buffers: ll_buffer.h, "Signature words") -----------------------
    def sig_thread(self, B: Builder, b: int, t: int) -> None:
        """Every thread's channel 0 carries a signature word: the word of its bundle's first real
        thread (``SIG_THREAD0``: thread 0 of the block only)."""
        if self.cfg.signature_words and (t == 0 or not self.cfg.has(Mutation.SIG_THREAD0)):
            B.sig_owner = (b, t * rules.bundle(self.cfg))

    def _sig_where(self, B: Builder, buffer: str, epochs: Epochs) -> tuple[int, int, int]:
        """(channel 0 of the thread, its epoch in ``buffer``, the thread's in-part word)."""
        assert B.sig_owner is not None
        b, thread = B.sig_owner
        ch = layout.slot_index(b, 0, thread)
        return ch, epochs.get((buffer, ch), 0), rules.signature_word(b, thread)

    def sig_send(self, B: Builder, r: int, k: int, sig: int, buffer: str, p: int, epochs: Epochs) -> None:
        """Before each line-0 send (or bcast) of ``buffer`` to ``p``, the thread stores its
        signature word, the 32-bit ``sig``, into p's region at the (parity, source r) part, parity
        that of its channel 0's epoch: one aligned 4-byte volatile store. ``SIG_RING``: only to
        rank + 1."""
        if B.sig_owner is None or (self.cfg.has(Mutation.SIG_RING) and p != (r + 1) % self.cfg.nranks):
            return
        ch, e, w = self._sig_where(B, buffer, epochs)
        B.emit(SEND, line=self.word(p, buffer, e, r, ch, w), value=0, flag=rules.sig_word(sig),
               tag=(k, -1 - ch, e), peer=p)

    def sig_items(self, B: Builder, r: int, k: int, sig: int, buffer: str, peers: list[int], epochs: Epochs) -> None:
        """With each receive of ``buffer`` from a peer in ``peers`` (its lines 0..n-1), the thread
        polls that peer's signature word for this thread in the same wait (one 4-byte volatile load
        per poll); the receive is complete when its lines are and the word equals the own signature,
        and then the thread stores 0 back into the word (``resetSignature``, issued as a line's
        reset is, before the fence of its next send). The word is empty from that reset until the
        sender's next store, which (written with the line-0 data of the same thread, pass and
        parity) needs that line's credit, so its reuse rests on that credit and fence as a sentinel
        line's does. ``SIG_RING``: only from rank - 1."""
        if B.sig_owner is None:
            return
        ch, e, w = self._sig_where(B, buffer, epochs)
        for p in dict.fromkeys(peers):
            if self.cfg.has(Mutation.SIG_RING) and p != (r - 1) % self.cfg.nranks:
                continue
            ln = self.word(r, buffer, e, p, ch, w)
            B.emit(POLL, line=ln, reg=B.reg(), flag=rules.sig_word(sig), tag=(k, -1 - ch, e), peer=p)
            B.reset_word(buffer, ln)

    def acc_line(self, rank: int, epoch: int, slot: int, sub: int) -> int:
        par = rules.parity(self.cfg, epoch)
        addr = rules.acc_line_address(self.cfg, par, slot, sub)
        return self.scratch.line(LineInfo(rank, "acc", "ll128", par, -1, slot, sub, addr))

    def flag(self, sig: int, epoch: int) -> Any:
        """The flag an LL send writes (sentinel: none)."""
        return rules.ll_flag(self.cfg, sig, epoch) if self.kind == "ll" else None

    def want(self, sig: int, epoch: int) -> Any:
        """The flag an LL poll waits for (sentinel: none)."""
        return rules.ll_want(self.cfg, sig, epoch) if self.kind == "ll" else None

    def _poll_all(self, B: Builder, r: int, buffer: str, items: list[tuple[int, int, int, int, Any]],
                  sig: int, epochs: Epochs) -> None:
        """``LLBuffer::pollAll``: poll every (peer, slot) line, and each peer's signature word for
        this thread, until complete; a sentinel line, and a signature word, is reset as soon as it
        is read (``checkPolls``).

        ``items``: (peer, slot i, channel s, register, ghost tag) in the device's (peer, slot) order.
        """
        for p, i, s, reg, tag in items:
            B.at(B.it, i)
            e = epochs.get((buffer, s), 0)
            ln = self.line(r, buffer, e, p, s)
            B.emit(POLL, line=ln, reg=reg, flag=self.want(sig, e), tag=tag, peer=p)
            if self.kind == "sentinel":
                B.reset(buffer, ln)
        if items:
            B.at(B.it, 0)
            self.sig_items(B, r, items[0][4][0], sig, buffer, [p for p, *_ in items], epochs)
            B.received_from(buffer)

    def _active(self, geo: Geometry, it: int, b: int, t: int, lines: int) -> list[tuple[int, int, int]]:
        """(slot, message line, channel) of every slot of thread (b, t) with data in iteration it."""
        chans = [(i, rules.message_line(geo, it, b, i, t), rules.channel(self.cfg, b, i, t))
                 for i in range(geo.slots)]
        return [c for c in chans if c[1] < lines]

    def _threads(self, r: int, k: int, geo: Geometry, lines: int,
                 iteration: Callable[[Builder, int, list[tuple[int, int, int]]], None],
                 epochs: Epochs) -> list[ThreadProgram]:
        """One program per (block, thread) of call ``k`` on rank ``r``: ``iteration(B, it, chans)``
        for every iteration in which the thread has data (``_active``), then the kernel end
        (``commit``)."""
        threads = []
        for b in range(geo.blocks):
            for t in range(geo.threads):
                B = Builder(self.cfg, f"r{r} call{k} b{b}.t{t}")
                self.sig_thread(B, b, t)
                for it in range(geo.iterations):
                    B.at(it, 0)
                    chans = self._active(geo, it, b, t, lines)
                    if not chans:
                        break
                    iteration(B, it, chans)
                threads.append(B.end())  # buf.commit, kernel end
        return threads
