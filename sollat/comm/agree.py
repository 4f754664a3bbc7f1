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
up raises too, instead of going on alone into a collective nobody else will enter. A rank whose
``compare_set`` raises reads the decision its peers made, or raises when none reaches it: no rank
ever decides from its own proposal alone (``_decide``).

Recovery (``Agreement.recovery``, what ``Communicator.reset`` waits through): barriers through the
store, bounded by the communicator's timeout, naming the ranks that never arrived; once they pass,
every rank moves to a new epoch of rounds, so rounds that drifted apart before (a rank that gave up
on a round its peers never entered) line up again.

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
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..errors import CallMismatchError, PeerTimeoutError, SetupFailedError, SollatError

_seq: dict[str, itertools.count] = {}
_GO = "go"
_LATE = "late "
_OK, _ERROR = "ok\t", "error\t"
MAX_CAUSE_CHARS = 400
#: What a reset() waits for its peers beyond 2 x the communicator's timeout (host time: Python,
#: the stream synchronisation, the store's round trips).
RESET_SLACK_S = 5.0


def reset_wait_s(timeout_s: float) -> float:
    """How long ``Communicator.reset`` waits at each of its barriers for every rank: a rank whose
    kernels returned at once (or saw the fault early) can arrive up to one ``timeout_s`` before a
    peer whose kernel spun until it timed out; then this rank's own wait, and RESET_SLACK_S."""
    return 2 * timeout_s + RESET_SLACK_S


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


def _decide(store: Any, key: str, proposal: str, timeout_s: float) -> str:
    """The round's decision: the first proposal any rank made, the same on every rank that returns.

    ``compare_set`` on an absent key sets it; on a present key it returns what is there. A store
    without ``compare_set`` (the same type on every rank) elects the first proposer with ``add``, an
    atomic counter. Where the store raises on this rank, this rank reads the decision another rank
    made (within ``timeout_s``) and raises where there is none: it never falls back to its own
    proposal, which could split the ranks (one going on into a kernel while its peers raise)."""
    try:
        got = store.compare_set(key, "", proposal)
    except AttributeError:  # no compare_set on this store type
        try:
            first = store.add(f"{key}/proposers", 1) == 1
        except AttributeError:
            raise SollatError("sollat: the process group's store has neither compare_set nor add; ranks cannot "
                              "agree through it") from None
        if first:
            store.set(key, proposal)
            return proposal
        got = _read_decision(store, key, timeout_s, None)
    except Exception as exc:  # this rank could not propose: another rank's decision, or none for anyone
        got = _read_decision(store, key, timeout_s, exc)
    return got.decode() if isinstance(got, bytes) else str(got)


def _read_decision(store: Any, key: str, timeout_s: float, why: BaseException | None) -> Any:
    try:
        store.wait([key], datetime.timedelta(seconds=timeout_s))
        return store.get(key)
    except Exception as exc:
        raise SollatError(f"sollat: no agreement decision reached this rank through the store within {timeout_s:g} s "
                          f"({cause(why or exc)}); this rank cannot know what its peers decided, so it stops") from exc


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
        # Rounds are numbered within an epoch; reset() moves every rank to the next epoch together
        # (``recovery``), so rounds that drifted apart before it line up again after it.
        self.epoch = 0
        self._recoveries = 0

    def _round_keys(self) -> tuple[int, list[str], str]:
        k = next(self._round)
        base = f"{self.prefix}/e{self.epoch}/{k}"
        return k, [f"{base}/{r}" for r in range(self.world_size)], f"{base}/decision"

    def _late(self, value: str, timeout_s: float | None) -> tuple[int, list[str], list[int]]:
        """Posts ``value``; (round, keys, the ranks the round's decision names as late: none = go)."""
        k, keys, decision = self._round_keys()
        return (k, keys, self._late_at(keys, decision, value, self.timeout_s if timeout_s is None else timeout_s))

    def _late_at(self, keys: list[str], decision: str, value: str, wait_s: float) -> list[int]:
        self.store.set(keys[self.rank], value)
        proposal = _GO
        try:
            self.store.wait(keys, datetime.timedelta(seconds=wait_s))
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
        decided = _decide(self.store, decision, proposal, wait_s)
        return [int(r) for r in decided[len(_LATE):].split(",") if r] if decided.startswith(_LATE) else []

    @contextlib.contextmanager
    def recovery(self, timeout_s: float) -> Iterator[Callable[[str], None]]:
        """One ``reset()``: yields ``barrier(what)``, which returns once every rank reached the same
        barrier of this recovery, or raises ``PeerTimeoutError`` on every rank naming the ranks that
        had not within ``timeout_s`` (a rank that arrives later reads that decision and raises too).

        Recoveries are numbered on every rank alike (reset() is collective; one that raised counts
        too, on every rank, since every rank raised), and their keys are apart from the rounds', so
        rounds that drifted apart (a rank that gave up on a round its peers never entered) do not
        matter here. When every barrier passed, every rank takes the recovery's number + 1 as its
        new epoch and numbers its rounds from 0 again: the survivors agree on the epoch through the
        barriers' keys in the store, whatever round each had reached."""
        g = self._recoveries
        self._recoveries += 1
        barriers = itertools.count()

        def barrier(what: str) -> None:
            base = f"{self.prefix}/recovery{g}/{next(barriers)}"
            keys = [f"{base}/{r}" for r in range(self.world_size)]
            late = self._late_at(keys, f"{base}/decision", f"epoch {self.epoch} round {self._next_round()}", timeout_s)
            if late:
                raise PeerTimeoutError(
                    f"sollat: reset(): rank(s) {late} did not reach {what} within {timeout_s:g} s (the communicator's "
                    f"timeout_s), seen on rank {self.rank}. A rank that died cannot rejoin this communicator: build a "
                    "new one over the ranks that are alive.", rank=self.rank, peer=late[0], slot=-1, epoch=g)

        yield barrier
        self.epoch = g + 1
        self._round = itertools.count()

    def _next_round(self) -> int:
        """The number of the next round (without taking it)."""
        k = next(self._round)
        self._round = itertools.count(k)
        return k

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

    @contextlib.contextmanager
    def recovery(self, timeout_s: float) -> Iterator[Callable[[str], None]]:
        yield lambda what: None
