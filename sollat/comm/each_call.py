"""Agreement on every call that a library path serves, through the process group's store.

A call that sollat's kernels run carries its signature on the device: a peer whose call differs
sees it in the data and every rank raises (docs/design.md, "Faults"). A call handed to a library
(NCCL, torch's two-shot: ``sollat.collectives.handover``) carries none, and a library does not
check that its peers made the same call: a differing element count hangs it, a differing dtype,
op, or (``all_reduce_rmsnorm``'s ``unfused`` algorithm) eps, hidden size or FP8 copy gives each
rank a finite, wrong result. So before such a call each rank posts the call's text, and the call
runs only when every rank posted the same text within the communicator's timeout: otherwise
``CallMismatchError`` (the texts differ; every rank reads the same texts, so every rank raises,
and nothing was launched) or ``PeerTimeoutError`` (a rank did not post in time, e.g. because its
call ran a sollat kernel instead; the round's decision is the same on every rank, through the
store's ``compare_set``, as in ``agree.py``).

Cost: five store operations per call (set, wait, compare_set, one multi-get, and deleting this
rank's key of the previous round; rank 0 also deletes the previous decision), each a round trip to
the store's server, so the store never holds more than two rounds. Under CUDA-graph capture the
texts are agreed at capture time; a replay is not checked again.
"""

from __future__ import annotations

import datetime
from typing import Any

from ..errors import CallMismatchError, PeerTimeoutError
from .agree import _GO, _LATE, _decide


class EachCall:
    """Rounds of one text per rank for one communicator: ``store``, ``prefix`` (the same on every
    rank, unique per communicator: its Agreement's), this ``rank`` of ``world_size``, each wait at
    most ``timeout_s``. ``realign()`` (every rank, in ``reset()``) starts a new numbering."""

    def __init__(self, store: Any, prefix: str, rank: int, world_size: int, timeout_s: float) -> None:
        self.store = store
        self.prefix = f"{prefix}/each-call"
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.generation = 0
        self.round = 0

    def realign(self) -> None:
        """Rounds start again under a new generation (collective: every rank, in ``reset()``)."""
        self.generation += 1
        self.round = 0

    def _keys(self, k: int) -> tuple[list[str], str]:
        base = f"{self.prefix}/{self.generation}/{k}"
        return [f"{base}/{r}" for r in range(self.world_size)], f"{base}/decision"

    def agree(self, text: str) -> None:
        """Returns when every rank posted ``text`` in this round; raises otherwise (see the module)."""
        k = self.round
        self.round += 1
        keys, decision = self._keys(k)
        store = self.store
        store.set(keys[self.rank], text)
        proposal = _GO
        try:
            store.wait(keys, datetime.timedelta(seconds=self.timeout_s))
        except Exception:  # the store raises its own timeout type
            missing = [r for r, key in enumerate(keys) if not _present(store, key)]
            if missing:
                proposal = _LATE + ",".join(map(str, missing))
        decided = _decide(store, decision, proposal, self.timeout_s)
        if decided.startswith(_LATE):
            late = [int(r) for r in decided[len(_LATE):].split(",") if r]
            raise PeerTimeoutError(
                f"sollat: rank(s) {late} did not reach this call ({text!r} on rank {self.rank}) within "
                f"{self.timeout_s:g} s. Every rank must make the same calls in the same order (a call that "
                "differs may run a sollat kernel on one rank and a library on another).",
                rank=self.rank, peer=late[0] if late else -1, slot=-1, epoch=k)
        # Every rank posted round k, so every rank has read round k - 1: its keys can go.
        if k > 0:
            previous, previous_decision = self._keys(k - 1)
            store.delete_key(previous[self.rank])
            if self.rank == 0:
                store.delete_key(previous_decision)
        texts = _get_all(store, keys)
        if all(t == texts[0] for t in texts):
            return
        peer = next(r for r, t in enumerate(texts) if t != text)
        lines = "; ".join(f"rank {r}: {t}" for r, t in enumerate(texts))
        raise CallMismatchError(f"sollat: the ranks made different calls on a library path ({lines}). Every rank "
                                "must make the same calls in the same order; nothing was launched.",
                                rank=self.rank, peer=peer)


def _present(store: Any, key: str) -> bool:
    try:
        return bool(store.check([key]))
    except Exception:
        return False


def _get_all(store: Any, keys: list[str]) -> list[str]:
    try:
        got = store.multi_get(keys)
    except (AttributeError, NotImplementedError, RuntimeError):  # a store without multi_get
        got = [store.get(key) for key in keys]
    return [g.decode() if isinstance(g, bytes) else str(g) for g in got]
