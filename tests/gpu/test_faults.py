"""Fault semantics on virtual ranks (one GPU): identical bits on every rank (NaN payloads too),
faults recorded on every rank, NaN outputs of faulted calls, refusal until reset(), reporting
under CUDA graphs, and calls on several streams."""

from __future__ import annotations

import pytest
import torch

import sollat
from sollat import testing
from sollat.collectives.algorithms import ALGORITHMS

from ._reference import assert_bitwise, assert_within_sum_bound, random_inputs, rank_order_reduce

pytestmark = pytest.mark.gpu

DEV = torch.device("cuda", 0) if torch.cuda.is_available() else None
# The algorithms of 2..8 ranks, the world sizes of this file (the wide one-shot, 9..72 ranks, is
# tested in test_wide_groups.py).
NARROW = [a for a, alg in ALGORITHMS.items() if alg.runs_on(2) and alg.runs_on(8)]
DETERMINISTIC = [a for a in NARROW if ALGORITHMS[a].deterministic]
INT_OF = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def raw(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(INT_OF[t.element_size()])


def nan_payload_inputs(r: int, n: int, dtype: torch.dtype, gen: torch.Generator) -> list[torch.Tensor]:
    """Random values with a third of the elements NaN of random payloads and signs."""
    xs = random_inputs(r, n, dtype, DEV, gen)
    ib = INT_OF[torch.tensor([], dtype=dtype).element_size()]
    nbits = 8 * torch.tensor([], dtype=ib).element_size()
    exp_mask = {torch.float32: 0x7F800000, torch.bfloat16: 0x7F80, torch.float16: 0x7C00,
                torch.float64: 0x7FF0000000000000}[dtype]
    for x in xs:
        pick = torch.rand(n, device=DEV, generator=gen) < 0.33
        payload = torch.randint(1, 2 ** min(nbits - 2, 62), (n,), device=DEV, generator=gen, dtype=torch.int64)
        mant = payload & ((1 << (nbits - 1)) - 1) & ~exp_mask
        mant = torch.where(mant == 0, torch.ones_like(mant), mant)
        bits = (mant | exp_mask).to(ib)
        bits = torch.where(torch.rand(n, device=DEV, generator=gen) < 0.5, bits, bits | torch.tensor(
            -(1 << (nbits - 1)), dtype=torch.int64, device=DEV).to(ib))
        x.view(ib)[pick] = bits[pick]
    return xs


@pytest.mark.parametrize("algo", DETERMINISTIC)
@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("r", [2, 4])
def test_nan_payloads_identical_bits_on_every_rank(algo: str, op: str, r: int) -> None:
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=5.0)
    gen = torch.Generator(device=DEV).manual_seed(1000 + r)
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        for n in (1, 9, 1000, 70001):
            xs = nan_payload_inputs(r, n, dtype, gen)
            ys = c.all_reduce(xs, op=op, algo=algo)
            ref = rank_order_reduce(xs, op)
            for k, y in enumerate(ys):
                assert_bitwise(y, ref, f"{algo} {op} {dtype} n={n} rank {k}")
                same = raw(y) == raw(ys[0])
                assert bool(same.all()), (f"{algo} {op} {dtype} n={n}: rank {k} differs from rank 0 in "
                                          f"{int((~same).sum())} elements (NaN payloads must be identical)")
    c.check()


def _nan_or_exact(y: torch.Tensor, ref: torch.Tensor) -> bool:
    return bool((torch.isnan(y) | (raw(y) == raw(ref))).all())


@pytest.mark.parametrize("algo", NARROW)
def test_a_fault_is_recorded_on_every_rank_and_outputs_are_nan_or_exact(algo: str) -> None:
    r = 4
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=0.3)
    gen = torch.Generator(device=DEV).manual_seed(21)
    n = 70001
    xs = random_inputs(r, n, torch.float32, DEV, gen)
    ref = rank_order_reduce(xs, "sum")
    testing.inject(c, absent=2)
    outs = [torch.zeros_like(x) for x in xs]
    c.all_reduce(xs, algo=algo, out=outs)
    with pytest.raises(sollat.PeerTimeoutError) as ei:
        c.check()
    assert ei.value.peer in (2, -1)
    torch.cuda.synchronize()
    for k, (rank, view) in enumerate(c._record_views()):
        assert int(view[0]) == 1, f"rank {rank}'s record does not hold the fault: {view.tolist()}"
        if k != 2:  # the absent rank's kernel returned at once: its outputs were never written
            assert _nan_or_exact(outs[k], ref), f"{algo}: rank {k} wrote a value that is neither NaN nor exact"
            assert bool(torch.isnan(outs[k]).any()), f"{algo}: rank {k} shows no sign of the fault"
    testing.clear(c)
    c.reset()
    ys = c.all_reduce(xs, algo=algo)
    for y in ys:
        if ALGORITHMS[algo].deterministic:
            assert_bitwise(y, ref, f"{algo} after reset")
        else:
            assert_within_sum_bound(y, xs, f"{algo} after reset")


@pytest.mark.parametrize("algo", NARROW)
def test_faulted_graph_is_reported_and_refuses_until_reset(algo: str) -> None:
    """Fault during a replay: check(sync=False) raises, every later replay writes all-NaN (nothing
    is sent), the next eager call raises, and reset() makes the same graph right again."""
    r = 2
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=0.3)
    gen = torch.Generator(device=DEV).manual_seed(22)
    xs = random_inputs(r, 5000, torch.float32, DEV, gen)
    outs = [torch.empty_like(x) for x in xs]
    ref = rank_order_reduce(xs, "sum")
    testing.inject(c, armed=True)  # hook-reading kernels, no fault yet
    c.all_reduce(xs, algo=algo, out=outs)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(3):
            c.all_reduce(xs, algo=algo, out=outs)
    g.replay()
    torch.cuda.synchronize()
    c.check(sync=False)  # healthy: nothing raised
    for o in outs:
        assert_bitwise(o, ref, f"{algo} healthy replay")
    testing.inject(c, absent=1)
    g.replay()
    torch.cuda.synchronize()
    with pytest.raises(sollat.PeerTimeoutError):
        c.check(sync=False)
    testing.inject(c, armed=True)  # the peer is back, but the communicator is faulted
    g.replay()
    torch.cuda.synchronize()
    for k, o in enumerate(outs):
        assert bool(torch.isnan(o).all()), f"{algo}: rank {k} computed after the fault instead of refusing"
    with pytest.raises(sollat.CommunicatorFaultedError):
        c.all_reduce(xs, algo=algo)
    c.reset()
    g.replay()
    torch.cuda.synchronize()
    for o in outs:
        assert_bitwise(o, ref, f"{algo} replay after reset")
    c.check()


def test_mismatch_on_a_used_shape_is_seen_by_every_rank() -> None:
    r = 4
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=1.0)
    gen = torch.Generator(device=DEV).manual_seed(23)
    xs = random_inputs(r, 100, torch.float32, DEV, gen)
    for algo in DETERMINISTIC:  # every protocol detects a mismatch (algorithms.MISMATCH_DETECTION)
        c.all_reduce(xs, algo=algo)
        testing.inject(c, mismatch=3)
        with pytest.raises(sollat.CallMismatchError):
            c.all_reduce(xs, algo=algo)
            c.check()
        for rank, view in c._record_views():
            assert int(view[0]) != 0, f"{algo}: rank {rank}'s record does not hold the mismatch"
        testing.clear(c)
        c.reset()


def test_calls_on_two_streams_run_in_issue_order() -> None:
    r = 2
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=5.0)
    gen = torch.Generator(device=DEV).manual_seed(24)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    calls = []
    for _ in range(400):
        xs = random_inputs(r, 4096, torch.float32, DEV, gen)
        calls.append((xs, [torch.empty_like(x) for x in xs]))
    torch.cuda.synchronize()
    for k, (xs, outs) in enumerate(calls):
        with torch.cuda.stream(s1 if k % 2 == 0 else s2):
            c.all_reduce(xs, algo="oneshot_ll", out=outs)
    torch.cuda.synchronize()
    for k, (xs, outs) in enumerate(calls):
        ref = rank_order_reduce(xs, "sum")
        for y in outs:
            assert_bitwise(y, ref, f"stream call {k}")
    c.check()
