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

from dataclasses import dataclass
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
    kind: str  # "ll" | "sentinel" | "ll128"
    parity: int
    src: int  # sending rank (-1 for an LL128 accumulator: every rank adds)
    slot: int  # line-channel index (layout.slot_index)
    sub: int  # line of the warp (LL128), else 0
    address: int  # line index inside the rank's region of this buffer

    def name(self) -> str:
        if self.kind == "ll128":
            return f"r{self.rank}.acc[p{self.parity} ch{self.slot} line{self.sub}]@{self.address}"
        return f"r{self.rank}.{self.buffer}[p{self.parity} src{self.src} ch{self.slot}]@{self.address}"


class Scratch:
    """Dense numbering of the lines a configuration touches, and their initial contents."""

    def __init__(self, ll128_lanes: int = 2, ll128_elems: int = 2) -> None:
        self.infos: list[LineInfo] = []
        self.index: dict[tuple[int, str, int], int] = {}
        self.aliases: dict[int, list[LineInfo]] = {}
        self._lanes = ll128_lanes
        self._elems = ll128_elems

    def line(self, info: LineInfo) -> int:
        key = (info.rank, info.buffer, info.address)
        idx = self.index.get(key)
        if idx is None:
            idx = len(self.infos)
            self.index[key] = idx
            self.infos.append(info)
        elif self.infos[idx] != info:
            group = self.aliases.setdefault(idx, [self.infos[idx]])
            if info not in group:
                group.append(info)
        return idx

    def initial_memory(self) -> list[Any]:
        """LL regions start at 0, sentinel regions at all ones, LL128 accumulators at zero."""
        mem: list[Any] = []
        for info in self.infos:
            if info.kind == "ll":
                mem.append(protocols.LL_REST)
            elif info.kind == "sentinel":
                mem.append(protocols.EMPTY)
            else:
                mem.append(protocols.ll128_zero(self._lanes, self._elems))
        return mem

    def initial_ghost(self) -> list[Ghost]:
        return [(FREE, None, ()) for _ in self.infos]

    def __len__(self) -> int:
        return len(self.infos)
