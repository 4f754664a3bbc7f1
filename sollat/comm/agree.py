"""Host-side agreement between the ranks of a Communicator, through the process group's store.

Used where a disagreement would otherwise become a hang or a silent wrong answer on the GPU:
at construction (the tuning table every rank will select from) and on the first use of every
call shape (algorithm, dtype, op, size), after this rank has compiled its kernel. The wait is
on the host, bounded by the setup timeout, so a peer that is still compiling (or loading a
model) costs waiting, never a device timeout; a peer that made a different call is named in a
``CallMismatchError`` on every rank, before any kernel of that call runs.
"""

from __future__ import annotations

import datetime
import itertools
from typing import Any

from ..errors import CallMismatchError, PeerTimeoutError, SollatError

_seq: dict[str, itertools.count] = {}


def default_store(group: Any) -> Any:
    """The store behind ``group`` (the default process group's, which every group shares), or None."""
    import torch.distributed as dist

    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # pragma: no cover - a torch without the private accessor
        return None


class Agreement:
    """Rounds of "every rank posts a value, every rank reads all of them" for one communicator.

    Its key prefix must be the same on every rank and unique per communicator: the group name
    plus the number of Agreements made on that group in this process (ranks construct
    communicators collectively, hence in the same order), or ``seq`` where the caller numbers them.
    """

    def __init__(self, store: Any, group_name: str, rank: int, world_size: int, timeout_s: float,
                 seq: int | None = None) -> None:
        n = next(_seq.setdefault(group_name, itertools.count())) if seq is None else seq
        self.prefix = f"sollat/{group_name}/{n}"
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = timeout_s
        self._round = itertools.count()

    def exchange(self, value: str) -> list[str]:
        """Posts ``value`` and returns every rank's value of this round (rank order)."""
        k = next(self._round)
        keys = [f"{self.prefix}/{k}/{r}" for r in range(self.world_size)]
        self.store.set(keys[self.rank], value)
        try:
            self.store.wait(keys, datetime.timedelta(seconds=self.timeout_s))
        except Exception as exc:  # the store raises its own timeout type
            missing = [r for r, key in enumerate(keys) if not self.store.check([key])]
            peer = missing[0] if missing else -1
            raise PeerTimeoutError(
                f"sollat: rank(s) {missing} did not reach agreement round {k} ({value!r} on rank {self.rank}) within "
                f"{self.timeout_s:g} s (SOLLAT_SETUP_TIMEOUT_S). Did every rank make the same calls in the same order?",
                rank=self.rank, peer=peer, slot=-1, epoch=k) from exc
        return [self.store.get(key).decode() for key in keys]

    def agree(self, value: str, what: str) -> None:
        """Raises CallMismatchError on every rank unless every rank posted the same ``value``."""
        values = self.exchange(value)
        if all(v == values[0] for v in values):
            return
        peer = next(r for r, v in enumerate(values) if v != value)
        lines = "; ".join(f"rank {r}: {v}" for r, v in enumerate(values))
        raise CallMismatchError(f"sollat: the ranks disagree on {what} ({lines}). Every rank must make the same "
                                "calls in the same order; nothing was launched.", rank=self.rank, peer=peer)


class NoAgreement:
    """Stand-in where no store exists (never a multi-process communicator)."""

    def agree(self, value: str, what: str) -> None:
        return None

    def exchange(self, value: str) -> list[str]:
        raise SollatError("sollat: no store to exchange values through")
