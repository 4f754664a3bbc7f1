"""Groups wider than the peer window (abi.PEER_WINDOW = 8 ranks) and odd world sizes, up to
abi.MAX_RANKS = 72 virtual ranks on one GPU: every collective, bitwise against its rank-order
reference and identical on every rank, from one element to several scratch passes, the
adversarial input classes, a mixed CUDA graph, and the faults (a rank that never arrives, a call
that differs) named on every rank. The R <= 8 suites (test_allreduce.py and the others) cover the
unwindowed kernels."""

from __future__ import annotations

import pytest
import torch

import sollat
from sollat import testing
from sollat.collectives import gather_scatter as gs
from sollat.collectives import rmsnorm
from sollat.collectives.algorithms import ALGORITHMS
from sollat.device import layout

from ._examples import load_example
from ._faults import assert_absent_rank_fault, assert_mismatch_poisons_every_rank, poisoned_like
from ._graphs import capture_and_replay
from ._reference import assert_bitwise, random_inputs, rank_order_reduce

pytestmark = pytest.mark.gpu

DEV = torch.device("cuda", 0) if torch.cuda.is_available() else None
WIDE = [9, 16, 17, 32, 33, 64, 72]  # 9 and 16: the wide one-shot's 16-rank cap
ODD = [3, 5]
ALLREDUCE = ["oneshot_ll", "oneshot_sentinel", "twoshot_ll", "twoshot_sentinel", "oneshot_ll_wide"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
_held: dict[int, sollat.VirtualCommunicator] = {}


def comm(r: int) -> sollat.VirtualCommunicator:
    """One communicator at a time (a 72-rank one holds about 10 GB of scratch)."""
    if r not in _held:
        _held.clear()
        torch.cuda.empty_cache()
        _held[r] = sollat.VirtualCommunicator(r, DEV, timeout_s=5.0)
    return _held[r]


def _one_pass(c: sollat.VirtualCommunicator, algo: str, dtype: torch.dtype) -> int:
    """Elements of one pass of the widest plan this communicator runs (blocks x threads x 1 slot)."""
    alg = ALGORITHMS[algo]
    per_line = alg.payload_bytes // torch.tensor([], dtype=dtype).element_size()
    return c.max_blocks * layout.MAX_THREADS * per_line * (c.world_size if alg.two_shot else 1)


def _specials(dtype: torch.dtype) -> torch.Tensor:
    """NaN, +-Inf, -0.0, denormals, and the sentinel / canonical-NaN bit patterns."""
    ib = {2: torch.int16, 4: torch.int32, 8: torch.int64}[torch.tensor([], dtype=dtype).element_size()]
    bits = {torch.int16: [-1, 0x7FC0, 0x7E00, 0x0001, -32768, 0x7C00],
            torch.int32: [-1, 0x7FC00000, 0x00000001, -(2**31), 0x7F800000],
            torch.int64: [-1, 0x7FF8000000000000, 1, -(2**63)]}[ib]
    tiny = torch.finfo(dtype).tiny
    vals = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0, 0.0, tiny / 4, -tiny / 8, tiny], dtype=dtype)
    return torch.cat([vals, torch.tensor(bits, dtype=ib).view(dtype)]).to(DEV)


def _check(c: sollat.VirtualCommunicator, xs: list[torch.Tensor], algo: str, op: str, what: str) -> None:
    outs = [torch.full_like(x, float("nan")) for x in xs]  # poisoned first
    ys = c.all_reduce(xs, op=op, algo=algo, out=outs)
    ref = rank_order_reduce(xs, op)
    for k, y in enumerate(ys):
        assert_bitwise(y, ref, f"{what} {algo} R={len(xs)} {xs[0].dtype} n={xs[0].numel()} {op} rank {k}")


@pytest.mark.parametrize("r, algo", [(r, a) for r in ODD + WIDE for a in ALLREDUCE if ALGORITHMS[a].runs_on(r)])
def test_all_reduce_every_dtype_size_and_input_class(r: int, algo: str) -> None:
    c = comm(r)
    gen = torch.Generator(device=DEV).manual_seed(1000 + r)
    for dtype in DTYPES:
        passes = 2 * _one_pass(c, algo, dtype) + 5
        for n in (1, 2, 3, 31, 100, 4097, passes):
            _check(c, random_inputs(r, n, dtype, DEV, gen), algo, "sum", "random")
        pattern = _specials(dtype)
        xs = random_inputs(r, 1031, dtype, DEV, gen)
        for k, x in enumerate(xs):
            idx = torch.randint(0, x.numel(), (pattern.numel(),), device=DEV, generator=gen)
            x[idx] = pattern.roll(k)
        _check(c, xs, algo, "sum", "special values")
    for op in ("max", "min"):
        _check(c, random_inputs(r, 777, torch.float32, DEV, gen), algo, op, "op")
    c.check()


@pytest.mark.parametrize("r", [5, 9, 17, 33, 72])
@pytest.mark.parametrize("proto", ["ll", "sentinel"])
def test_all_gather_and_reduce_scatter(r: int, proto: str) -> None:
    c = comm(r)
    gen = torch.Generator(device=DEV).manual_seed(2000 + r)
    for dtype in DTYPES:
        for n in (1, 3, 100, 5000):
            xs = random_inputs(r, n, dtype, DEV, gen)
            outs = [torch.full((r, n), float("nan"), dtype=dtype, device=DEV) for _ in range(r)]
            ref = gs.all_gather_reference(xs)
            for k, y in enumerate(c.all_gather(xs, out=outs, algo=proto)):
                assert_bitwise(y, ref, f"all_gather {proto} R={r} {dtype} n={n} rank {k}")
            xs = random_inputs(r, r * n, dtype, DEV, gen)
            refs = gs.reduce_scatter_reference(xs, "sum")
            for k, y in enumerate(c.reduce_scatter(xs, algo=proto)):
                assert_bitwise(y, refs[k], f"reduce_scatter {proto} R={r} {dtype} n={n} rank {k}")
    c.check()


@pytest.mark.parametrize("r", [5, 9, 33, 72])
@pytest.mark.parametrize("algo", ["oneshot_ll", "oneshot_sentinel"])
@pytest.mark.parametrize("fp8", [False, True], ids=["plain", "fp8"])
def test_all_reduce_rmsnorm(r: int, algo: str, fp8: bool) -> None:
    c = comm(r)
    gen = torch.Generator(device=DEV).manual_seed(3000 + r)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for tokens, hidden in ((1, 8), (3, 1000), (8, 4096)):
            xs = [torch.randn(tokens, hidden, device=DEV, generator=gen).to(dtype) for _ in range(r)]
            res = torch.randn(tokens, hidden, device=DEV, generator=gen).to(dtype)
            w = (1 + 0.1 * torch.randn(hidden, device=DEV, generator=gen)).to(dtype)
            scale = torch.tensor([0.5], device=DEV)
            got = c.all_reduce_rmsnorm(xs, [res.clone() for _ in range(r)], w, 1e-6, algo,
                                       fp8_scale=scale if fp8 else None)
            ry, rr = rmsnorm.algo_reference(algo, xs, res, w, 1e-6)
            want = rmsnorm.fp8_reference(ry, scale).view(torch.uint8) if fp8 else None
            what = f"rmsnorm {algo} R={r} {dtype} {tokens}x{hidden}"
            for k in range(r):
                assert_bitwise(got[0][k].cpu(), ry, f"{what} y rank {k}")
                assert_bitwise(got[1][k].cpu(), rr, f"{what} residual rank {k}")
                if want is not None:
                    assert torch.equal(got[2][k].cpu().view(torch.uint8), want), f"{what} fp8 copy rank {k}"
    c.check()


@pytest.mark.parametrize("r", [17, 72])
@pytest.mark.parametrize("proto", ["ll", "sentinel"])
def test_user_written_collectives(r: int, proto: str) -> None:
    """The examples, unchanged: a user kernel written with recvReduce / recvEach runs windowed."""
    maxabs, allgather = load_example("maxabs_allreduce"), load_example("allgather")
    colls = [maxabs.collective(proto), allgather.collective(proto)]
    _held.clear()
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=5.0, collectives=colls, algorithms=["oneshot_ll"])
    gen = torch.Generator(device=DEV).manual_seed(4000 + r)
    for n in (1, 33, 3000):
        xs = random_inputs(r, n, torch.float32, DEV, gen)
        for k, y in enumerate(c.run(colls[0], xs)):
            assert_bitwise(y, maxabs.reference(xs), f"maxabs {proto} R={r} n={n} rank {k}")
        for k, y in enumerate(c.run(colls[1], xs)):
            assert_bitwise(y, allgather.reference(xs), f"allgather example {proto} R={r} n={n} rank {k}")
    c.check()


# 72 ranks: half a minute on an H200, so it runs with -m '' (slow); 17 ranks in every run.
@pytest.mark.parametrize("r", [17, pytest.param(72, marks=pytest.mark.slow)])
def test_cuda_graph_of_mixed_calls(r: int) -> None:
    """One graph of 300 calls: every AllReduce algorithm, AllGather, ReduceScatter, sizes 1 ..
    20000, three dtypes; replayed 3 times with fresh inputs and poisoned outputs, each call checked."""
    c = comm(r)
    gen = torch.Generator(device=DEV).manual_seed(5000 + r)
    sizes = [1, 7, 128, 1000, 4097, 20000]
    calls = []
    for k in range(300):
        n = sizes[(k * 5 + k // 7) % len(sizes)]
        dtype = (torch.float32, torch.bfloat16, torch.float16)[k % 3]
        kind = ("ar", "ar", "ag", "rs")[k % 4]
        xs = random_inputs(r, r * n if kind == "rs" else n, dtype, DEV, gen)
        shape = (r, n) if kind == "ag" else (n,)
        outs = [torch.empty(shape, dtype=dtype, device=DEV) for _ in range(r)]
        calls.append((kind, ALLREDUCE[(k // 4) % len(ALLREDUCE)], ("ll", "sentinel")[(k // 2) % 2], xs, outs))

    def issue() -> None:
        for kind, algo, proto, xs, outs in calls:
            if kind == "ar":
                c.all_reduce(xs, algo=algo, out=outs)
            elif kind == "ag":
                c.all_gather(xs, algo=proto, out=outs)
            else:
                c.reduce_scatter(xs, algo=proto, out=outs)

    issue()  # compile and plan outside the capture
    torch.cuda.synchronize()

    def check_replay(replay: int) -> None:
        for i, (kind, _algo, _proto, xs, outs) in enumerate(calls):
            what = f"replay {replay} call {i} {kind} R={r}"
            if kind == "ar":
                refs = [rank_order_reduce(xs, "sum")] * r
            elif kind == "ag":
                refs = [gs.all_gather_reference(xs)] * r
            else:
                refs = gs.reduce_scatter_reference(xs, "sum")
            for k in range(r):
                assert_bitwise(outs[k], refs[k], f"{what} rank {k}")

    capture_and_replay(issue, inputs=[x for *_, xs, _ in calls for x in xs],
                       poisoned=[o for *_, outs in calls for o in outs], gen=gen, replays=3, check=check_replay)
    c.check()


def _wide_sizes(c: sollat.VirtualCommunicator, dtype: torch.dtype) -> list[int]:
    """Element counts that cut oneshot_ll_wide differently: one element, part of a block, one block's
    lines, one line more, several blocks, several passes (the first version timed out at R = 9 on
    such a sequence: its lines per block followed the message size)."""
    per_line = ALGORITHMS["oneshot_ll_wide"].payload_bytes // torch.tensor([], dtype=dtype).element_size()
    lb = layout.peer_group_lines(c.world_size)
    return [1, 16 * per_line, 57 * per_line + 1, lb * per_line, lb * per_line + 1, 7, 3 * lb * per_line + 5,
            2 * _one_pass(c, "oneshot_ll_wide", dtype) + 3, 2]


@pytest.mark.parametrize("r", [9, 17, 64])
def test_oneshot_ll_wide_calls_of_changing_sizes(r: int) -> None:
    """Eager calls whose sizes (and so blocks and passes) change from call to call, interleaved with
    the plain one-shot and the two-shot, twice through: every result bitwise right on every rank."""
    c = comm(r)
    gen = torch.Generator(device=DEV).manual_seed(8000 + r)
    for rnd in range(2):
        for k, n in enumerate(_wide_sizes(c, torch.float32)):
            _check(c, random_inputs(r, n, torch.float32, DEV, gen), "oneshot_ll_wide", "sum", f"round {rnd} call {k}")
            if k % 3 == 2:
                _check(c, random_inputs(r, 100, torch.float32, DEV, gen), ("oneshot_ll", "twoshot_sentinel")[k % 2],
                       "sum", "between")
    c.check()


@pytest.mark.parametrize("r", [9, 33, 72])
@pytest.mark.parametrize("focus", ["oneshot_ll_wide"])
def test_cuda_graph_of_mixed_sizes_and_algorithms(r: int, focus: str) -> None:
    """One graph of 120 AllReduces: `focus` every other call at the sizes that cut it differently,
    between them the other algorithms, three dtypes; replayed 3 times with fresh inputs and
    poisoned outputs, each call checked on every rank."""
    c = comm(r)
    gen = torch.Generator(device=DEV).manual_seed(9000 + r)
    others = [a for a in ALLREDUCE if a != focus]
    calls = []
    for k in range(120):
        dtype = (torch.float32, torch.bfloat16, torch.float16)[(k // 2) % 3]
        sizes = _wide_sizes(c, dtype)
        algo = focus if k % 2 == 0 else others[(k // 2) % len(others)]
        n = sizes[(k // 2 + k // 11) % len(sizes)] if k % 2 == 0 else (1, 100, 5000)[k % 3]
        xs = random_inputs(r, n, dtype, DEV, gen)
        calls.append((algo, xs, [torch.empty_like(x) for x in xs]))

    def issue() -> None:
        for algo, xs, outs in calls:
            c.all_reduce(xs, algo=algo, out=outs)

    issue()  # compile and plan outside the capture
    torch.cuda.synchronize()

    def check_replay(replay: int) -> None:
        for i, (algo, xs, outs) in enumerate(calls):
            ref = rank_order_reduce(xs, "sum")
            for k in range(r):
                assert_bitwise(outs[k], ref, f"replay {replay} call {i} {algo} R={r} n={xs[0].numel()} rank {k}")

    capture_and_replay(issue, inputs=[x for _, xs, _ in calls for x in xs],
                       poisoned=[o for *_, outs in calls for o in outs], gen=gen, replays=3, check=check_replay)
    c.check()


# Faults in a wide group's last window, and in the wide one-shot's 16-rank cap (12, 16 ranks).
FAULT_CASES = [(r, a) for r in (17, 72) for a in ALLREDUCE] + [(12, "oneshot_ll_wide"), (16, "oneshot_ll_wide")]


@pytest.mark.parametrize("r, algo", FAULT_CASES)
def test_absent_rank_is_named_on_every_rank(r: int, algo: str) -> None:
    _held.clear()
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=0.3, algorithms=ALLREDUCE)
    gen = torch.Generator(device=DEV).manual_seed(6000 + r)
    xs = random_inputs(r, 50001, torch.float32, DEV, gen)
    ref = rank_order_reduce(xs, "sum")
    absent = r - 2  # in the last window
    outs = [torch.zeros_like(x) for x in xs]
    testing.inject(c, absent=absent)
    c.all_reduce(xs, algo=algo, out=outs)
    assert_absent_rank_fault(c, outs, [ref] * r, absent, f"{algo} R={r}")
    testing.clear(c)
    c.reset()
    for k, y in enumerate(c.all_reduce(xs, algo=algo)):
        assert_bitwise(y, ref, f"{algo} R={r} after reset rank {k}")
    c.check()


@pytest.mark.parametrize("r, algo", FAULT_CASES)
def test_call_mismatch_is_detected_on_the_device(r: int, algo: str) -> None:
    """Rank r-3 flips its call signature (a window other than the first): LL flags and the sentinel
    signature words see it, every rank raises, and no rank keeps a finite element of that call."""
    _held.clear()
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=1.0, algorithms=ALLREDUCE)
    xs = random_inputs(r, 1000, torch.float32, DEV, torch.Generator(device=DEV).manual_seed(7))
    c.all_reduce(xs, algo=algo)
    c.check()
    outs = poisoned_like(xs)
    testing.inject(c, mismatch=r - 3)
    c.all_reduce(xs, algo=algo, out=outs)
    assert_mismatch_poisons_every_rank(c, outs, f"{algo} R={r}")
    testing.clear(c)
    c.reset()
    ref = rank_order_reduce(xs, "sum")
    for k, y in enumerate(c.all_reduce(xs, algo=algo)):
        assert_bitwise(y, ref, f"{algo} R={r} after mismatch and reset rank {k}")


def test_scratch_and_blocks_scale_with_the_world() -> None:
    """Per-rank scratch at most linear in R (blocks per rank shrink as R grows: every block of
    every rank must be resident at once), and 73 ranks are refused with the limit named."""
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    per_rank = {}
    for r in (8, 16, 72):
        _held.clear()
        c = sollat.VirtualCommunicator(r, DEV)
        assert c.max_blocks == min(layout.MAX_BLOCKS_VIRTUAL, layout.virtual_block_cap(r, sms))
        per_rank[r] = c.scratch_bytes_per_rank
        del c
    assert per_rank[72] <= per_rank[8] * 72 / 8
    with pytest.raises(sollat.UnsupportedError, match="2..72"):
        sollat.VirtualCommunicator(73, DEV)
