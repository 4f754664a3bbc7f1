"""Host-side agreement between the ranks of a Communicator, through the process group's store.

Used where a disagreement would otherwise become a hang or a silent wrong answer on the GPU:
at construction (every step that can fail on one rank, the tuning table every rank will select
from) and on the first use of every call shape (algorithm, dtype, op, size), after this rank has
compiled its kernel. The wait is on the host, bounded by the setup timeout, so a peer that is
still compiling (or loading a model) costs waiting, never a device timeout; a peer that made a
different call is named in a ``CallMismatchError`` on every rank, before any kernel of that call
runs.

Each round ends in one decision that every rank reads from the store: ``go`` once every rank has
posted, or the list of ranks that had not posted when the first rank's wait ran out. The store's
``compare_set`` makes the first proposal the decision, so a rank that arrives after its peers gave
up raises too, instead of going on alone into a collective nobody else will enter.

Construction (``Agreement.gate``): every rank posts whether its part of a step succeeded (and
what it found, e.g. its GPU's description); a failure on any rank makes every rank raise
``SetupFailedError`` naming the ranks and causes, and a rank that never arrives makes every rank
raise it naming that rank after the setup timeout. torch.distributed collectives cannot be
interrupted when a peer never arrives, so a Communicator enters one only after a gate has seen
every rank ready for it, and bounds the store waits inside it (``store_timeout``).
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
from collections.abc import Iterator, Mapping
from typing import Any

from ..errors import CallMismatchError, PeerTimeoutError, SetupFailedError, SollatError

_seq: dict[str, itertools.count] = {}
_GO = "go"
_LATE = "late "
_OK, _ERROR = "ok\t", "error\t"
MAX_CAUSE_CHARS = 400


def cause(exc: BaseException) -> str:
    """``Type: message`` of ``exc`` on one line, at most MAX_CAUSE_CHARS characters."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= MAX_CAUSE_CHARS else text[:MAX_CAUSE_CHARS - 3] + "..."


def default_store(group: Any) -> Any:
    """The store behind ``group`` (the default process group's, which every group shares), or None."""
    import torch.distributed as dist

    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # pragma: no cover - a torch without the private accessor
        return None


@contextlib.contextmanager
def store_timeout(store: Any, timeout_s: float) -> Iterator[None]:
    """Inside, a wait on ``store`` gives up after ``timeout_s`` (then restores its timeout). A
    prefix view forwards the timeout to the store it wraps, so this bounds the waits of every
    user of that store in this process for that time, torch's symmetric-memory rendezvous
    (which reads its peers' handles from the process group's store) among them. A store
    without a settable timeout is left as it is."""
    try:
        before = store.timeout
        store.set_timeout(datetime.timedelta(seconds=timeout_s))
    except Exception:
        yield
        return
    try:
        yield
    finally:
        store.set_timeout(before)


def _decide(store: Any, key: str, proposal: str) -> str:
    """The round's decision: the first proposal any rank made (``compare_set`` on an absent key
    sets it; on a present key it returns what is there). A store without it: this rank's own."""
    try:
        got = store.compare_set(key, "", proposal)
    except Exception:
        return proposal
    return got.decode() if isinstance(got, bytes) else str(got)


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

    def _round_keys(self) -> tuple[int, list[str], str]:
        k = next(self._round)
        return k, [f"{self.prefix}/{k}/{r}" for r in range(self.world_size)], f"{self.prefix}/{k}/decision"

    def _late(self, value: str, timeout_s: float | None) -> tuple[int, list[str], list[int]]:
        """Posts ``value``; (round, keys, the ranks the round's decision names as late: none = go)."""
        k, keys, decision = self._round_keys()
        self.store.set(keys[self.rank], value)
        proposal = _GO
        try:
            self.store.wait(keys, datetime.timedelta(seconds=self.timeout_s if timeout_s is None else timeout_s))
        except Exception:  # the store raises its own timeout type
            missing = []
            for r, key in enumerate(keys):
                try:
                    present = bool(self.store.check([key]))
                except Exception:
                    present = False
                if not present:
                    missing.append(r)
            if missing:
                proposal = _LATE + ",".join(map(str, missing))
        decided = _decide(self.store, decision, proposal)
        late = [int(r) for r in decided[len(_LATE):].split(",") if r] if decided.startswith(_LATE) else []
        return k, keys, late

    def exchange(self, value: str, timeout_s: float | None = None) -> list[str]:
        """Posts ``value`` and returns every rank's value of this round (rank order); raises
        PeerTimeoutError on every rank when the round's decision names ranks that were late."""
        k, keys, late = self._late(value, timeout_s)
        if late:
            wait = self.timeout_s if timeout_s is None else timeout_s
            raise PeerTimeoutError(
                f"sollat: rank(s) {late} did not reach agreement round {k} ({value!r} on rank {self.rank}) within "
                f"{wait:g} s (SOLLAT_SETUP_TIMEOUT_S). Did every rank make the same calls in the same order?",
                rank=self.rank, peer=late[0], slot=-1, epoch=k)
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

    def gate(self, step: str, error: BaseException | None, payload: str = "",
             timeout_s: float | None = None) -> list[str]:
        """One construction step's outcome, the same on every rank: every rank's ``payload`` (rank
        order) when the step succeeded everywhere. Otherwise every rank raises: where every rank
        failed with the same cause, each its own ``error`` (a call made alike on every rank, wrong
        alike); else
        ``SetupFailedError`` naming the failed ranks and their causes (chained to this rank's
        ``error``), or the ranks that never reached the step within the timeout."""
        mine = _ERROR + cause(error) if error is not None else _OK + payload
        k, keys, late = self._late(mine, timeout_s)
        wait = self.timeout_s if timeout_s is None else timeout_s
        if late:
            failures = {r: f"did not reach {step} within {wait:g} s (SOLLAT_SETUP_TIMEOUT_S)" for r in late}
            raise SetupFailedError(f"sollat: Communicator construction stopped at {step} on every rank: "
                                   f"{_summary(failures)}", step=step, failures=failures) from error
        posted = [self.store.get(key).decode() for key in keys]
        failures = {r: p[len(_ERROR):] for r, p in enumerate(posted) if p.startswith(_ERROR)}
        if not failures:
            return [p[len(_OK):] for p in posted]
        if error is not None and len(failures) == self.world_size and len(set(failures.values())) == 1:
            raise error
        raise SetupFailedError(f"sollat: Communicator construction failed at {step} on rank(s) "
                               f"{sorted(failures)}: {_summary(failures)}. No rank of the group built it.",
                               step=step, failures=failures) from error


def _summary(failures: Mapping[int, str]) -> str:
    return "; ".join(f"rank {r}: {c}" for r, c in sorted(failures.items()))


class NoAgreement:
    """Stand-in where no store exists (never a multi-process communicator)."""

    def agree(self, value: str, what: str) -> None:
        return None

    def exchange(self, value: str, timeout_s: float | None = None) -> list[str]:
        raise SollatError("sollat: no store to exchange values through")

    def gate(self, step: str, error: BaseException | None, payload: str = "",
             timeout_s: float | None = None) -> list[str]:
        if error is not None:
            raise error
        return [payload]
