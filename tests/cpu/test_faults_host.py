"""Host side of the fault semantics, without a GPU: timeouts, argument validation, the fault
record's decoding, and the ranks' store agreement (ranks simulated by threads on one store)."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
import torch

import sollat
from sollat.comm import agree
from sollat.device import abi, faults, layout

from ._ranks import on_threads


@pytest.mark.parametrize("bad", [0, -1, float("inf"), float("nan"), "5", True, 1e9])
def test_bad_timeouts_are_clear_errors(bad: object) -> None:
    with pytest.raises(sollat.UnsupportedError, match="timeout_s must be"):
        sollat.VirtualCommunicator(2, timeout_s=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("raw", ["0", "-3", "abc", "inf"])
def test_bad_timeout_environment_is_named(monkeypatch, raw: str) -> None:
    monkeypatch.setenv("SOLLAT_TIMEOUT_S", raw)
    with pytest.raises(sollat.UnsupportedError, match=r"SOLLAT_TIMEOUT_S=.* is not understood"):
        sollat.VirtualCommunicator(2)


def test_default_timeout_is_long_enough_for_ordinary_skew(monkeypatch) -> None:
    monkeypatch.delenv("SOLLAT_TIMEOUT_S", raising=False)
    from sollat.comm.real import default_timeout_s

    assert default_timeout_s() == faults.DEFAULT_TIMEOUT_S >= 30
    monkeypatch.setenv("SOLLAT_TIMEOUT_S", "2.5")
    assert default_timeout_s() == 2.5


@pytest.mark.parametrize("ws, match", [(0, "2..72"), (100, "2..72"), ("4", "must be an int"), (2.5, "must be an int"),
                                       (True, "must be an int")])
def test_virtual_world_size_is_validated_first(ws: object, match: str) -> None:
    with pytest.raises(sollat.UnsupportedError, match=match):
        sollat.VirtualCommunicator(ws)  # type: ignore[arg-type]


@pytest.mark.parametrize("device, match", [("banana", "not a device"), ("cpu", "must be a CUDA device"),
                                           (1.5, "must be a torch.device")])
def test_virtual_device_is_validated_before_the_gpu_check(device: object, match: str) -> None:
    with pytest.raises(sollat.UnsupportedError, match=match):
        sollat.VirtualCommunicator(2, device=device)  # type: ignore[arg-type]


@pytest.mark.parametrize("value, env, match", [(0, None, "1..128"), (129, None, "1..128"), (2.0, None, "1..128"),
                                               (True, None, "1..128"), (None, "x", r"SOLLAT_MAX_BLOCKS='x' is not understood"),
                                               (None, "0", r"SOLLAT_MAX_BLOCKS='0' .* 1\.\.128")])
def test_max_blocks_is_validated_before_the_gpu_check(monkeypatch, value: object, env: str | None, match: str) -> None:
    if env is not None:
        monkeypatch.setenv("SOLLAT_MAX_BLOCKS", env)
    with pytest.raises(sollat.UnsupportedError, match=match):
        sollat.VirtualCommunicator(2, max_blocks=value)  # type: ignore[arg-type]


def test_max_blocks_defaults(monkeypatch) -> None:
    from sollat.collectives.validate import checked_max_blocks
    from sollat.device import layout

    monkeypatch.delenv("SOLLAT_MAX_BLOCKS", raising=False)
    assert checked_max_blocks(None, "t", default=16) == 16
    assert checked_max_blocks(64, "t", default=16) == 64
    monkeypatch.setenv("SOLLAT_MAX_BLOCKS", "32")
    assert checked_max_blocks(None, "t", default=16) == 32 and checked_max_blocks(8, "t", default=16) == 8
    # real ranks: 128 blocks at 2 ranks, ranks x blocks = 256 beyond (scratch stays the same size)
    assert [layout.default_max_blocks_real(w) for w in (2, 3, 4, 8)] == [128, 85, 64, 32]


def test_no_gpu_is_an_unsupported_error(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(sollat.UnsupportedError, match="no CUDA device"):
        sollat.VirtualCommunicator(2)


def test_communicator_on_cpu_torch_is_an_unsupported_error(monkeypatch, tmp_path) -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group exists")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        with pytest.raises(sollat.UnsupportedError, match="no CUDA device"):
            sollat.Communicator()
    finally:
        dist.destroy_process_group()


def _record(code: int, rank: int, peer: int, seen: int = 0, collective: str = "all_reduce") -> np.ndarray:
    return np.array([code, rank, peer & 0xFFFFFFFF, 3, 17, 2048, 5, seen, abi.COLLECTIVES[collective]], dtype=np.int64)


def test_records_become_the_same_exception_on_every_rank() -> None:
    rec = _record(layout.FAULT_TIMEOUT, rank=0, peer=1)
    own = faults.to_exception(rec, timeout_s=2.0, where_seen=0)
    other = faults.to_exception(rec, timeout_s=2.0, where_seen=1)
    for e in (own, other):
        assert isinstance(e, sollat.PeerTimeoutError) and (e.rank, e.peer) == (0, 1)
        assert "peer 1 did not deliver" in str(e) and "reset()" in str(e)
    assert "reported to rank 1 by rank 0" in str(other) and "reported" not in str(own)
    mm = faults.to_exception(_record(layout.FAULT_MISMATCH, 1, 0, seen=0xABCD0001), timeout_s=1, where_seen=1)
    assert isinstance(mm, sollat.CallMismatchError) and mm.peer == 0 and "0xabcd0001" in str(mm)
    ll128 = faults.to_exception(_record(layout.FAULT_MISMATCH, 1, -1, seen=0x40400000), timeout_s=1, where_seen=0)
    assert isinstance(ll128, sollat.CallMismatchError) and ll128.peer == -1


@pytest.mark.parametrize("collective", [c for c in abi.COLLECTIVES if c != "unknown"])
def test_a_record_names_the_collective_that_wrote_it(collective: str) -> None:
    for code, kind in ((layout.FAULT_TIMEOUT, sollat.PeerTimeoutError), (layout.FAULT_MISMATCH, sollat.CallMismatchError)):
        e = faults.to_exception(_record(code, 0, 1, seen=0x1235, collective=collective), timeout_s=1, where_seen=0)
        assert isinstance(e, kind) and str(e).startswith(f"sollat {collective}"), str(e)
        others = [c for c in abi.COLLECTIVES if c not in ("unknown", collective) and not collective.startswith(c)]
        assert not any(f"sollat {c}" in str(e) for c in others), str(e)
    mm = faults.to_exception(_record(layout.FAULT_MISMATCH, 0, 1, collective=collective), timeout_s=1, where_seen=0)
    assert f"peer 1 called {faults.collective_label(abi.COLLECTIVES[collective])} with different arguments" in str(mm)


def test_an_unlabelled_record_names_no_collective() -> None:
    e = faults.to_exception(_record(layout.FAULT_TIMEOUT, 0, 1, collective="unknown"), timeout_s=1, where_seen=0)
    assert str(e).startswith("sollat the collective:") and "all_reduce" not in str(e)


def test_every_collective_of_the_registry_has_a_code() -> None:
    from sollat.collectives.algorithms import (
        ALGORITHMS,
        GATHER_SCATTER_ALGORITHMS,
        RMSNORM_ALGORITHMS,
        CustomAlgorithm,
        collective_name,
        kernel_defines,
    )
    from sollat.device.dtypes import DTYPES

    names = {a: collective_name(a) for a in (*ALGORITHMS.values(), *RMSNORM_ALGORITHMS.values(),
                                             *GATHER_SCATTER_ALGORITHMS.values())}
    assert set(names.values()) == {"all_reduce", "all_reduce_rmsnorm", "all_gather", "reduce_scatter"}
    assert all(names[a] == "all_reduce" for a in ALGORITHMS.values())
    custom = CustomAlgorithm("mine", "", "mine", "ll", 16, True, False)
    assert collective_name(custom) == "run"
    d = kernel_defines(GATHER_SCATTER_ALGORITHMS["reduce_scatter_ll"], DTYPES[torch.float32], "sum", 4, 1,
                       test_hooks=False, real_ranks=True)
    assert d["SOLLAT_COLLECTIVE"] == str(abi.COLLECTIVES["reduce_scatter"])


def test_a_claimed_record_is_reread_until_published() -> None:
    reads = [_record(layout.FAULT_CLAIMED, 0, 0), _record(layout.FAULT_CLAIMED, 0, 0), _record(1, 0, 1)]
    got = faults.read_record(lambda: reads.pop(0) if len(reads) > 1 else reads[0])
    assert got[0] == layout.FAULT_TIMEOUT


def test_agreement_passes_and_catches_a_differing_call_on_every_rank() -> None:
    from torch.distributed import HashStore

    store = HashStore()
    store.set_timeout(timedelta(seconds=5))
    world = 3
    ags = [agree.Agreement(store, "gA", r, world, 5.0, seq=0) for r in range(world)]
    assert on_threads(world, lambda r: ags[r].agree("oneshot_ll|f32|sum|n=8", "call")) == [None] * world
    res = on_threads(world, lambda r: ags[r].agree("oneshot_ll|f32|sum|n=8" if r != 2 else "oneshot_ll|bf16|sum|n=16",
                                                   "call"))
    assert all(isinstance(e, sollat.CallMismatchError) for e in res), res
    assert res[0].peer == 2 and res[2].peer == 0  # type: ignore[union-attr]
    assert "rank 2: oneshot_ll|bf16|sum|n=16" in str(res[0])


def test_agreement_names_a_rank_that_never_arrives() -> None:
    from torch.distributed import HashStore

    store = HashStore()
    store.set_timeout(timedelta(seconds=5))
    ag = agree.Agreement(store, "gB", 0, 2, 0.5, seq=0)
    with pytest.raises(sollat.PeerTimeoutError, match=r"rank\(s\) \[1\]") as ei:
        ag.agree("x", "call")
    assert ei.value.peer == 1


def test_setup_agreement_every_rank_raises_on_a_broken_or_different_table(monkeypatch) -> None:
    """Construction: a rank whose table file is corrupt, or that picked another table, makes every
    rank raise (nobody waits for the setup timeout)."""
    from torch.distributed import HashStore

    from sollat.collectives import select
    from sollat.comm.real import Communicator

    store = HashStore()
    store.set_timeout(timedelta(seconds=5))
    good = select.find_table("generic", 2, mode="real")
    other = select.Table("NVIDIA H200", 2, good.rules[:1], mode="real", interconnect="nvlink", source="x.json")

    def make(rank: int, table_or_error: object, seq: int) -> Communicator:
        c = Communicator.__new__(Communicator)
        c.timeout_s, c._algos, c.max_blocks, c._torch_twoshot_bytes = 30.0, ("oneshot_ll",), 16, 0
        c._agreement = agree.Agreement(store, "setup", rank, 2, 5.0, seq=seq)
        c._collectives, c._fused_blocks = {}, None
        c._gather_scatter, c._rmsnorm_twoshot, c._batch_invariant = False, False, False

        def table() -> select.Table:
            if isinstance(table_or_error, Exception):
                raise table_or_error
            return table_or_error  # type: ignore[return-value]

        c._selection_table = table  # type: ignore[method-assign]
        return c

    comms = [make(0, good, 0), make(1, sollat.UnsupportedError("sollat: /x/t.json: truncated"), 0)]
    res = on_threads(2, lambda r: comms[r]._agree_on_setup())
    assert all(isinstance(e, sollat.UnsupportedError) and "rank 1: sollat: /x/t.json: truncated" in str(e)
               for e in res), res
    comms = [make(0, good, 1), make(1, other, 1)]
    res = on_threads(2, lambda r: comms[r]._agree_on_setup())
    assert all(isinstance(e, sollat.SollatError) and "x.json" in str(e) for e in res), res
    comms = [make(0, good, 2), make(1, good, 2)]
    assert on_threads(2, lambda r: comms[r]._agree_on_setup()) == [None, None]
