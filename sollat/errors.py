"""Exceptions raised by sollat.

Every error names the operation that failed and, where a peer is involved, the peer.
"""

from __future__ import annotations


class SollatError(RuntimeError):
    """Base class of every sollat error."""


class UnsupportedError(SollatError, ValueError):
    """A request sollat cannot serve (dtype, op, algorithm, size, device...)."""


class PeerTimeoutError(SollatError):
    """A peer did not deliver its data within the communicator's timeout."""

    def __init__(self, message: str, *, rank: int, peer: int, slot: int, epoch: int) -> None:
        super().__init__(message)
        self.rank = rank
        self.peer = peer
        self.slot = slot
        self.epoch = epoch


class CallMismatchError(SollatError):
    """A peer called the collective with different arguments (size, dtype, op or algorithm)."""

    def __init__(self, message: str, *, rank: int, peer: int) -> None:
        super().__init__(message)
        self.rank = rank
        self.peer = peer


class CommunicatorFaultedError(SollatError):
    """The communicator saw a device-side error earlier and must be reset before reuse."""


class TableMismatchError(SollatError):
    """The ranks of one communicator chose different ``algo="auto"`` tuning tables."""


class NotOneNVLinkDomainError(UnsupportedError):
    """Some ranks of a group cannot load/store each other's memory over NVLink (``sollat.device.topology``);
    ``pairs`` lists them as (rank, peer), rank < peer."""

    def __init__(self, message: str, *, rank: int, pairs: list[tuple[int, int]]) -> None:
        super().__init__(message)
        self.rank = rank
        self.pairs = pairs
