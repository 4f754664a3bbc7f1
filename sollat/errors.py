"""Exceptions raised by sollat.

Every error names the operation that failed and, where a peer is involved, the peer.
"""

from __future__ import annotations

from collections.abc import Mapping


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


class SetupFailedError(SollatError):
    """A Communicator's construction failed on one or more ranks (or a rank never reached a step
    within the setup timeout); raised on every rank of the group alike, with the same ``step``
    and ``failures`` (rank -> cause, e.g. ``"OutOfMemoryError: CUDA out of memory ..."``)."""

    def __init__(self, message: str, *, step: str, failures: Mapping[int, str]) -> None:
        super().__init__(message)
        self.step = step
        self.failures = dict(failures)

    @property
    def summary(self) -> str:
        """``rank r: cause`` for every failed rank (rank order): the same text on every rank."""
        return "; ".join(f"rank {r}: {c}" for r, c in sorted(self.failures.items()))


class EnvironmentValueError(UnsupportedError):
    """A ``SOLLAT_*`` environment variable has a value sollat does not understand (one line: the
    variable, its value, the values it takes; ``sollat.device.environment``)."""

    def __init__(self, name: str, value: str, allowed: str, *, consequence: str = "") -> None:
        message = f"sollat: {name}={value!r} is not understood; it takes {allowed}"
        super().__init__(f"{message}. {consequence}" if consequence else message)
        self.name = name
        self.value = value
        self.allowed = allowed
