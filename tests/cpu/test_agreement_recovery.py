"""The host agreement when the store fails and after a fault (sollat/comm/agree.py,
``Communicator.reset``), with one shared store and threads as ranks: a rank whose ``compare_set``
raises takes its peers' decision (or raises with every rank), never its own proposal; a store
without ``compare_set`` elects the first proposer; ``reset()`` waits only through the store, bounded
by the communicator's timeout, names the absent rank on every survivor, and moves every rank to a
new epoch of rounds, so rounds that drifted apart line up again."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
import torch

from sollat.comm import agree
from sollat.comm.real import Communicator
from sollat.errors import CommunicatorFaultedError, PeerTimeoutError, SollatError

from ._ranks import on_threads


def _store(timeout_s: float = 30.0) -> Any:
    from torch.distributed import HashStore

    store = HashStore()
    store.set_timeout(timedelta(seconds=timeout_s))
    return store


class _Failing:
    """One rank's view of a shared store whose ``compare_set`` raises (``missing``: has none)."""

    def __init__(self, inner: Any, missing: bool = False) -> None:
        self.inner, self.missing = inner, missing

    def compare_set(self, *args: Any) -> Any:
        if self.missing:
            raise AttributeError("compare_set")
        raise RuntimeError("the store's connection broke")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _agreements(stores: list[Any], timeout_s: float, name: str) -> list[agree.Agreement]:
    return [agree.Agreement(s, name, r, len(stores), timeout_s, seq=0) for r, s in enumerate(stores)]


def test_a_rank_whose_compare_set_raises_takes_its_peers_go() -> None:
    shared = _store()
    ags = _agreements([shared, _Failing(shared), shared], 5.0, "cs-go")
    got = on_threads(3, lambda r: ags[r].exchange(f"v{r}"), delay={1: 0.5})
    assert got == [["v0", "v1", "v2"]] * 3


def test_a_late_rank_whose_compare_set_raises_raises_with_its_peers() -> None:
    """Its own proposal would be ``go`` (every key is there when it arrives): it must not go on
    alone while its peers, who gave up on it, raise."""
    shared = _store()
    ags = _agreements([shared, _Failing(shared), shared], 0.3, "cs-late")
    got = on_threads(3, lambda r: ags[r].exchange(f"v{r}"), delay={1: 1.5})
    assert all(isinstance(e, PeerTimeoutError) and e.peer == 1 for e in got), got


def test_every_rank_whose_compare_set_raises_raises_within_the_timeout() -> None:
    shared = _store()
    ags = _agreements([_Failing(shared) for _ in range(3)], 0.5, "cs-all")
    t0 = time.monotonic()
    got = on_threads(3, lambda r: ags[r].exchange(f"v{r}"))
    assert time.monotonic() - t0 < 10
    assert all(isinstance(e, SollatError) and "no agreement decision reached this rank" in str(e) for e in got), got


def test_a_store_without_compare_set_elects_the_first_proposer() -> None:
    shared = _store()
    ags = _agreements([_Failing(shared, missing=True) for _ in range(3)], 0.3, "cs-missing")
    assert on_threads(3, lambda r: ags[r].exchange(f"v{r}")) == [["v0", "v1", "v2"]] * 3
    got = on_threads(3, lambda r: ags[r].exchange(f"w{r}"), delay={2: 1.5})  # the late rank raises too
    assert all(isinstance(e, PeerTimeoutError) and e.peer == 2 for e in got), got


def _drift(ags: list[agree.Agreement]) -> None:
    """Rank 2 gives up on a round ranks 0 and 1 never enter: it is a round ahead of them."""
    with pytest.raises(PeerTimeoutError):
        ags[2].exchange("alone", 0.2)


def test_drifted_rounds_fail_a_call_every_rank_makes_alike() -> None:
    """What recovery repairs: without it the next exchange of every rank fails."""
    ags = _agreements([_store()] * 3, 0.3, "drift")
    _drift(ags)
    got = on_threads(3, lambda r: ags[r].exchange(f"v{r}"))
    assert all(isinstance(e, PeerTimeoutError) for e in got), got


def test_recovery_moves_every_rank_to_a_new_epoch() -> None:
    ags = _agreements([_store()] * 3, 0.5, "epoch")
    _drift(ags)

    def recover(r: int) -> list[str]:
        with ags[r].recovery(2.0) as barrier:
            barrier("one")
            barrier("two")
        return ags[r].exchange(f"v{r}")

    assert on_threads(3, recover) == [["v0", "v1", "v2"]] * 3
    assert [a.epoch for a in ags] == [1, 1, 1]
    assert on_threads(3, lambda r: ags[r].exchange(f"w{r}")) == [["w0", "w1", "w2"]] * 3


# ---- Communicator.reset, its GPU parts faked ---------------------------------------------------------
def _communicators(world: int, timeout_s: float, name: str) -> list[Any]:
    store = _store()
    comms = []
    for r in range(world):
        c = object.__new__(Communicator)
        c.device, c.timeout_s, c._faulted, c.rank = torch.device("cpu"), timeout_s, True, r
        c._agreement = agree.Agreement(store, name, r, world, 5.0, seq=0)
        c.resets = 0

        def local(c: Any = c) -> None:
            c.resets += 1
            c._faulted = False

        c._reset_local = local
        comms.append(c)
    return comms


@pytest.fixture(autouse=True)
def _no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(agree, "RESET_SLACK_S", 0.2)  # each reset() barrier waits 2 x timeout_s + 0.2 s

    def no_barrier(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("reset() waited on a device-group barrier")

    monkeypatch.setattr(dist, "barrier", no_barrier)


def test_reset_realigns_drifted_rounds() -> None:
    comms = _communicators(3, 2.0, "reset-ok")
    _drift([c._agreement for c in comms])

    def reset_then_agree(r: int) -> list[str]:
        comms[r].reset()
        return comms[r]._agreement.exchange(f"v{r}")

    assert on_threads(3, reset_then_agree) == [["v0", "v1", "v2"]] * 3
    assert [(c.resets, c._faulted) for c in comms] == [(1, False)] * 3


def test_reset_waits_twice_the_timeout_and_a_slack() -> None:
    assert agree.reset_wait_s(0.5) == 1.2  # RESET_SLACK_S patched to 0.2 here


def test_reset_with_an_absent_rank_raises_on_every_survivor_within_the_timeout() -> None:
    comms = _communicators(3, 0.5, "reset-absent")
    t0 = time.monotonic()
    got = on_threads(2, lambda r: comms[2 * r].reset())  # ranks 0 and 2; rank 1 never arrives
    assert time.monotonic() - t0 < agree.reset_wait_s(0.5) + 3
    assert all(isinstance(e, PeerTimeoutError) and e.peer == 1 and "rank(s) [1] did not reach reset()" in str(e)
               for e in got), got
    assert [c.resets for c in comms] == [0, 0, 0]  # no survivor re-filled its scratch
    assert comms[0]._faulted and comms[2]._faulted


def test_a_rank_lost_between_the_barriers_leaves_every_survivor_faulted(monkeypatch: pytest.MonkeyPatch) -> None:
    comms = _communicators(3, 0.5, "reset-lost")
    comms[1]._reset_local = lambda: time.sleep(2.5)  # rank 1 reaches the second barrier after 1.2 s
    got = on_threads(3, lambda r: comms[r].reset())
    assert isinstance(got[0], PeerTimeoutError) and isinstance(got[2], PeerTimeoutError), got
    assert got[0].peer == 1 and got[2].peer == 1
    assert comms[0]._faulted and comms[2]._faulted
    with pytest.raises(CommunicatorFaultedError):
        comms[0]._guard()
