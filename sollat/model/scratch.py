"""Scratch memory of the model: every line any call touches, on every rank, with ghost state.

Lines are named by their *real* address (``layout.line_index`` inside a rank's region of one
buffer), so if two logical lines ever mapped to one address the model would share the line
between them, exactly as the device would, and the checker would see the collision.

Ghost state (not device state; what the checker knows about a line):

=================  =========================================================================
``FREE``           LL/sentinel: no unconsumed data; LL128: zero, no round in it
``FULL``           holds data (or LL128 contributions) not yet consumed by its receiver
``RESET_PENDING``  consumed; the receiver's reset/zeroing store is issued but not performed
``CONSUMED``       consumed and no reset issued (a sentinel/LL128 line that was never reset)
=================  =========================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from . import protocols

FREE, FULL, RESET_PENDING, CONSUMED = 0, 1, 2, 3
STATUS_NAMES = {FREE: "free", FULL: "full", RESET_PENDING: "reset pending", CONSUMED: "consumed, not reset"}

#: ghost of one line: (status, tag of the data in it, per-lane contributor bit masks (LL128))
Ghost = tuple[int, Any, tuple[int, ...]]


@dataclass(frozen=True)
class LineInfo:
    rank: int  # whose memory
    buffer: str  # "oneshot" | "rs" | "ag" | "acc"
    kind: str  # "ll" | "sentinel" | "ll128" | "sig" (a signature word: 4 bytes, LL128's 8)
    parity: int
    src: int  # sending rank (-1 for an LL128 accumulator: every rank adds)
    slot: int  # line-channel index (layout.slot_index); a signature word: its thread's channel
    sub: int  # line of the warp (LL128); a signature word: its word inside its part; else 0
    address: int  # line index inside the rank's region of this buffer (a signature word: word index)
    part: int = -1  # PTX mode, a line split into its 8-byte parts: which one (-1: the whole line)

    @property
    def reader_resets(self) -> bool:
        """Its reader stores it back to its rest value once it has read it: a sentinel line, a
        sentinel buffer's signature word (``LLBuffer::resetSignature``). An LL line and LL128's
        signature words are never cleared (an LL128 accumulator line is zeroed: ``ZERO``)."""
        return self.kind == "sentinel" or (self.kind == "sig" and self.buffer != "acc")

    def name(self) -> str:
        if self.kind == "ll128":
            return f"r{self.rank}.acc[p{self.parity} ch{self.slot} line{self.sub}]@{self.address}"
        if self.kind == "sig":
            return f"r{self.rank}.{self.buffer}.sig[p{self.parity} src{self.src} ch{self.slot}]@w{self.address}"
        w = "" if self.part < 0 else f".w{self.part}"
        return f"r{self.rank}.{self.buffer}[p{self.parity} src{self.src} ch{self.slot}]@{self.address}{w}"


#: The two 8-byte words of a split single-flag LL line at rest: the payload word (its "flag" is
#: None: it has none) and the flag word (no payload).
SINGLE_FLAG_PARTS_REST: tuple[Any, Any] = ((0, None), (None, (0, 0)))


#: LL128's signature word at rest: (value 0, word (0, 0)).
SIG_REST: tuple[int, tuple[int, int]] = (0, (0, 0))
#: A sentinel buffer's signature word at rest, and after its reader's reset: (value 0, word 0 with
#: no epoch field, ``rules.sig_word``).
SENTINEL_SIG_REST: tuple[int, tuple[int, None]] = (0, (0, None))


class Scratch:
    """Dense numbering of the lines a configuration touches, and their initial contents.

    ``split(kind)`` says whether a line of that kind is split into its two 8-byte parts (PTX
    mode, ``Config.tear``): such a line takes two consecutive indices (``LineInfo.part`` 0 and 1),
    and ``line()`` returns the first.
    """

    def __init__(self, ll128_lanes: int = 2, ll128_elems: int = 2, ll_rest: Any = protocols.LL_REST,
                 split: Any = None) -> None:
        self.infos: list[LineInfo] = []
        self.index: dict[tuple[int, str, int], int] = {}
        self.aliases: dict[int, list[LineInfo]] = {}
        self._lanes = ll128_lanes
        self._elems = ll128_elems
        self.ll_rest = ll_rest
        self._split = split or (lambda kind: False)

    def parts(self, idx: int) -> int:
        """1 for a whole line, 2 for the first part of a split one."""
        return 2 if self.infos[idx].part == 0 else 1

    def line(self, info: LineInfo) -> int:
        # a signature word is addressed in 8-byte words: its key stays apart from the 16-byte lines'
        key = (info.rank, info.buffer, -1 - info.address if info.kind == "sig" else info.address)
        idx = self.index.get(key)
        if idx is None:
            idx = len(self.infos)
            self.index[key] = idx
            if self._split(info.kind):
                self.infos += [replace(info, part=0), replace(info, part=1)]
            else:
                self.infos.append(info)
        elif replace(self.infos[idx], part=-1) != info:
            group = self.aliases.setdefault(idx, [replace(self.infos[idx], part=-1)])
            if info not in group:
                group.append(info)
        return idx

    def rest(self, idx: int) -> Any:
        """The content of line (or part) ``idx`` at rest: LL regions 0, sentinel regions all ones,
        LL128 accumulators zero, signature words 0 (``comm.state.DeviceMemory.init_scratch`` zeroes them in
        every region: a word whose signature is 0 is empty, never a mismatch). A reset puts a line
        or a sentinel signature word back to this."""
        info = self.infos[idx]
        if info.kind == "sig":
            return SIG_REST if info.buffer == "acc" else SENTINEL_SIG_REST
        if info.kind == "ll":
            if info.part < 0:
                return self.ll_rest
            if isinstance(self.ll_rest[1][0], tuple):  # two-flag line: each word (payload, its flag)
                return (0, self.ll_rest[1][info.part])
            return SINGLE_FLAG_PARTS_REST[info.part]
        if info.kind == "sentinel":
            return protocols.EMPTY
        return protocols.ll128_zero(self._lanes, self._elems)

    def initial_memory(self) -> list[Any]:
        return [self.rest(i) for i in range(len(self.infos))]

    def initial_ghost(self) -> list[Ghost]:
        return [(FREE, None, ()) for _ in self.infos]

    def __len__(self) -> int:
        return len(self.infos)
