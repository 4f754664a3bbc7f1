"""What the program generator of every algorithm (``algorithms._Gen``) shares: the scratch lines
(``LLBuffer::peerLine``/``ownLine``, LL128 accumulator lines), the signature words, ``pollAll``
and the loop over a call's (block, thread) programs and iterations."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sollat.device.layout import Geometry

from . import rules
from .config import Config, Mutation
from .program import POLL, SEND, Builder, ThreadProgram, split_line
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
    def sig_thread(self, B: Builder, b: int, t: int) -> None:
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

    def sig_send(self, B: Builder, r: int, k: int, sig: int, buffer: str, p: int,
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

    def sig_items(self, B: Builder, r: int, k: int, sig: int, buffer: str, peers: list[int],
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

    def _poll_all(self, B: Builder, r: int, buffer: str, items: list[tuple[int, int, int, int, Any]],
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
                 iteration: Callable[[Builder, int, list[tuple[int, int, int]]], None],
                 epochs: dict[tuple[str, int], int]) -> list[ThreadProgram]:
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
