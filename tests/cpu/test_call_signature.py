"""Which arguments of a call its ranks must agree on, without a GPU: the signature the unfused
RMSNorm's AllReduce carries (every argument that changes a rank's output changes it), and the
agreement through the store that every call a library path serves goes through
(``sollat/comm/each_call.py``), on threads that share one store."""

from __future__ import annotations

import datetime
import itertools
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

import sollat
from sollat.collectives import algorithms, rmsnorm, select
from sollat.comm import agree
from sollat.comm.each_call import EachCall
from sollat.comm.ranks import RealRanks
from sollat.comm.real import Communicator
from sollat.device.dtypes import DTYPES

from ._ranks import on_threads

LL_UNCARRIED_BIT = 1 << 16  # an LL flag carries the signature's two 16-bit halves but bit 16 (algorithms.signature)
BF16, F16, F32 = DTYPES[torch.bfloat16], DTYPES[torch.float16], DTYPES[torch.float32]


def _unfused_sig(alg: str, dt: Any, rows: int, hidden: int, eps: float, fp8: bool) -> int:
    """The signature of the AllReduce that ``unfused`` runs for this call."""
    call = rmsnorm.signature_text(rmsnorm.UNFUSED, dt, rows, hidden, rmsnorm.eps_bits(eps), fp8)
    return algorithms.signature(algorithms.get(alg), dt, "sum", rows * hidden, call)


# (what differs, the call): 2 x 2048 bf16, eps 1e-6, no FP8 copy, against each argument that
# changes a rank's output with the AllReduce's own arguments (algorithm, dtype, op, elements) kept
# where the call allows (hidden and rows at the same element count, dtype over the same bytes).
BASE = (BF16, 2, 2048, 1e-6, False)
VARIANTS = {
    "eps": (BF16, 2, 2048, 1e-5, False),
    "eps by one float32 ulp": (BF16, 2, 2048, float(np.nextafter(np.float32(1e-6), np.float32(1))), False),
    "hidden at the same element count": (BF16, 4, 1024, 1e-6, False),
    "rows at the same element count": (BF16, 1, 4096, 1e-6, False),
    "the FP8 copy (fp8_scale given)": (BF16, 2, 2048, 1e-6, True),
    "dtype over the same bytes": (F16, 2, 2048, 1e-6, False),
}


@pytest.mark.parametrize("alg", ["oneshot_ll", "oneshot_sentinel", "twoshot_sentinel", "twoshot_ll", "twoshot_bulk"])
@pytest.mark.parametrize("what", list(VARIANTS))
def test_every_argument_of_the_unfused_call_changes_its_all_reduce_signature(alg: str, what: str) -> None:
    base, other = _unfused_sig(alg, *BASE), _unfused_sig(alg, *VARIANTS[what])
    assert base & 1 and other & 1, "a signature is odd (never 0)"
    assert (base ^ other) & ~LL_UNCARRIED_BIT, f"{what}: the signatures differ only where LL does not carry them"


def test_the_fold_leaves_all_reduce_signatures_as_they_were() -> None:
    """A plain all_reduce (no call) keeps its signature; the same call always folds to the same one
    (every rank computes it alone)."""
    import zlib

    alg = algorithms.get("oneshot_ll")
    assert algorithms.signature(alg, BF16, "sum", 4096) == zlib.crc32(b"oneshot_ll|bf16|sum|4096") | 1
    assert algorithms.signature(alg, BF16, "sum", 4096, "") == algorithms.signature(alg, BF16, "sum", 4096)
    assert _unfused_sig("oneshot_ll", *BASE) == _unfused_sig("oneshot_ll", *BASE)
    assert _unfused_sig("oneshot_ll", *BASE) != algorithms.signature(alg, BF16, "sum", 4096)
    every = {_unfused_sig("oneshot_ll", *v) for v in (BASE, *VARIANTS.values())}
    assert len(every) == 1 + len(VARIANTS)


# ---- the plan cache: one AllReduce plan per unfused call ------------------------------------------
def _fake_real(resolved: str) -> Any:
    """A Communicator without a GPU: ``auto`` resolves to ``resolved``; a plan is (name, call)."""
    c = Communicator.__new__(Communicator)
    c._calls = {}
    c._agreement = agree.NoAgreement()
    c._ranks = RealRanks(0, torch.empty(0, dtype=torch.uint8))
    c._kernels = SimpleNamespace(plan=lambda name, dt, op, n, call="": (name, call))
    c._resolve = lambda algo, nbytes, dtype, op, det: resolved  # type: ignore[method-assign]
    c._check_handover = lambda *a: None  # type: ignore[method-assign]
    return c


def test_unfused_calls_get_their_own_all_reduce_plans() -> None:
    c = _fake_real("oneshot_ll")
    calls = [rmsnorm.signature_text(rmsnorm.UNFUSED, BF16, rows, hidden, rmsnorm.eps_bits(eps), fp8)
             for _, rows, hidden, eps, fp8 in (BASE, *VARIANTS.values()) if _ is BF16]
    plans = [c._call_plan(4096, BF16, "sum", "auto", True, False, call) for call in calls]
    assert plans == [("oneshot_ll", call) for call in calls]  # each call's text reaches its plan's signature
    assert c._call_plan(4096, BF16, "sum", "auto", True) == ("oneshot_ll", "")  # all_reduce's own plan
    assert (4096, torch.bfloat16, "sum", "auto", True, False) in c._calls  # the hot path's key, unchanged
    assert len(c._calls) == len(calls) + 1


class _Recorder:
    def __init__(self) -> None:
        self.texts: list[str] = []

    def agree(self, text: str) -> None:
        self.texts.append(text)


def test_every_library_call_is_agreed_with_its_arguments() -> None:
    """all_reduce on a library path, the unfused RMSNorm's AllReduce on one (its arguments in the
    text), and all_gather/reduce_scatter on torch.distributed: each call, not only the first."""
    c = _fake_real(select.NCCL)
    c._faulted, c._err_host, c.debug = False, np.zeros(4, dtype=np.int32), False
    c._check_common = lambda t, op, what: DTYPES[t.dtype]  # type: ignore[method-assign]  # CPU tensors pass
    c._zero_copy = lambda x, y: False  # type: ignore[method-assign]
    ran: list[str] = []
    c._library_all_reduce = lambda path, x, y, op: ran.append(path)  # type: ignore[method-assign]
    c._each_call = rec = _Recorder()
    x = torch.ones(4096, dtype=torch.bfloat16)
    call = rmsnorm.signature_text(rmsnorm.UNFUSED, BF16, 2, 2048, rmsnorm.eps_bits(1e-6), False)
    for _ in range(3):
        c._all_reduce_ranks([x], "sum", "auto", None, False)
        c._all_reduce_ranks([x], "sum", "auto", [torch.empty_like(x)], True, call)
    assert ran == [select.NCCL] * 6
    assert rec.texts == ["nccl|bf16|sum|n=4096|symmetric=0", f"nccl|bf16|sum|n=4096|symmetric=0|{call}"] * 3
    c._gs_plan = lambda kind, n, dt, op, algo: select.NCCL  # type: ignore[method-assign]
    c._library_gather_scatter = lambda kind, x, y, op: ran.append(kind)  # type: ignore[method-assign]
    c.world_size, c.device = 2, torch.device("cpu")
    c._gs_ranks("all_gather", [torch.ones(8)], None, "", "auto")
    assert rec.texts[-1] == "all_gather:nccl|f32||n=8" and ran[-1] == "all_gather"


# ---- the agreement of every library call, on threads sharing one store ----------------------------
TIMEOUT_S = 1.0


def _round(store: Any, world: int, texts: dict[int, str | None], each: list[EachCall]) -> list[Any]:
    """One round: rank r agrees on texts[r] (None: rank r does not come)."""
    def one(r: int) -> Any:
        text = texts[r]
        return None if text is None else each[r].agree(text)
    return on_threads(world, one)


def _each(store: Any, world: int) -> list[EachCall]:
    return [EachCall(store, "sollat/test/0", r, world, TIMEOUT_S) for r in range(world)]


def _differing(world: int) -> list[tuple[int, ...]]:
    """The first, a middle one, the last, and half of the ranks."""
    return [(0,), (world // 2,), (world - 1,), tuple(range(1, 1 + world // 2))]


@pytest.mark.parametrize("world", [3, 4])
def test_library_calls_that_differ_raise_on_every_rank(world: int) -> None:
    store = dist.HashStore()
    each = _each(store, world)
    for differing in _differing(world):
        assert _round(store, world, dict.fromkeys(range(world), "nccl|bf16|sum|n=4096"), each) == [None] * world
        texts = {r: "nccl|bf16|sum|n=4096|eps" if r in differing else "nccl|bf16|sum|n=4096" for r in range(world)}
        got = _round(store, world, texts, each)
        assert all(isinstance(e, sollat.CallMismatchError) for e in got), (differing, got)
        assert all(e.peer in differing or r in differing for r, e in enumerate(got)), "names a rank that differs"
        # every rank finished the round alike: the next one lines up without a reset
    assert _round(store, world, dict.fromkeys(range(world), "x"), each) == [None] * world


def test_a_rank_that_never_comes_is_a_timeout_on_every_rank_that_did() -> None:
    world = 3
    store = dist.HashStore()
    each = _each(store, world)
    got = _round(store, world, {0: "nccl|f32|sum|n=8", 1: None, 2: "nccl|f32|sum|n=8"}, each)
    for r in (0, 2):
        assert isinstance(got[r], sollat.PeerTimeoutError) and got[r].peer == 1, got
    # rank 1 comes late: the round's decision is already "late", so it raises too (never runs alone)
    with pytest.raises(sollat.PeerTimeoutError):
        each[1].agree("nccl|f32|sum|n=8")
    for e in each:  # reset() on every rank
        e.realign()
    assert _round(store, world, dict.fromkeys(range(world), "y"), each) == [None] * world


def test_the_store_holds_at_most_two_rounds() -> None:
    world = 3
    store = dist.HashStore()
    each = _each(store, world)
    for k in range(20):
        assert _round(store, world, dict.fromkeys(range(world), f"call {k % 3}"), each) == [None] * world
    assert store.num_keys() <= 2 * (world + 1)


def test_rounds_are_bounded_by_the_communicators_timeout() -> None:
    store = dist.HashStore()
    e = EachCall(store, "sollat/test/1", 0, 2, 0.3)
    t0 = datetime.datetime.now()
    with pytest.raises(sollat.PeerTimeoutError, match="rank\\(s\\) \\[1\\] did not reach this call"):
        e.agree("nccl|f32|sum|n=8")
    assert (datetime.datetime.now() - t0).total_seconds() < 5


def test_combinations_of_differing_ranks_are_all_seen() -> None:
    """Every non-empty proper subset of 4 ranks differing: every rank raises CallMismatchError."""
    world = 4
    store = dist.HashStore()
    each = _each(store, world)
    for size in range(1, world):
        for differing in itertools.combinations(range(world), size):
            texts = {r: ("b" if r in differing else "a") for r in range(world)}
            assert all(isinstance(e, sollat.CallMismatchError) for e in _round(store, world, texts, each)), differing
