"""User-written collectives (sollat.custom) on virtual ranks: the two examples (examples/
maxabs_allreduce.py, examples/allgather.py) on R = 2, 4, 8, every dtype they support, both
protocols, odd sizes, bitwise against a torch reference; mixed with all_reduce, eagerly and in a
CUDA graph; in place; the fault path (absent rank, timeout, NaN-or-exact outputs, refusal until
reset) and an LL mismatch."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest
import torch

import sollat
from sollat import testing

from ._examples import load_example
from ._faults import assert_absent_rank_refuses_until_reset, assert_mismatch_poisons_every_rank, poisoned_like
from ._graphs import check_eagerly_then_in_a_graph
from ._reference import assert_bitwise, random_inputs, rank_order_reduce

pytestmark = pytest.mark.gpu

DEV = torch.device("cuda", 0) if torch.cuda.is_available() else None
SIZES = (1, 3, 7, 127, 1001, 4097, 70001, (1 << 20) + 3)


MAXABS = load_example("maxabs_allreduce")
ALLGATHER = load_example("allgather")


def _inputs(r: int, n: int, dtype: torch.dtype, gen: torch.Generator) -> list[torch.Tensor]:
    return random_inputs(r, n, dtype, DEV, gen)


def _check_every_dtype_and_odd_size(example: ModuleType, name: str, proto: str, r: int, seed: int,
                                    out_shape: Callable[[int], tuple[int, ...]]) -> None:
    """``example``'s collective on ``r`` ranks, every dtype it supports and every size of SIZES:
    each rank's output of shape ``out_shape(n)`` and the input's dtype, bitwise its reference."""
    coll = example.collective(proto)
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=5.0, collectives=[coll])
    gen = torch.Generator(device=DEV).manual_seed(seed)
    for dtype in sorted(coll.dtypes, key=str):
        for n in SIZES:
            xs = _inputs(r, n, dtype, gen)
            ys = c.run(coll, xs)
            ref = example.reference(xs)
            for k, y in enumerate(ys):
                assert y.shape == out_shape(n) and y.dtype == dtype
                assert_bitwise(y, ref, f"{name} {proto} R={r} {dtype} n={n} rank {k}")
    c.check()


@pytest.mark.parametrize("proto", ["ll", "sentinel"])
@pytest.mark.parametrize("r", [2, 4, 8])
def test_maxabs_every_dtype_and_odd_size(r: int, proto: str) -> None:
    _check_every_dtype_and_odd_size(MAXABS, "maxabs", proto, r, 100 + r, lambda n: (n,))


@pytest.mark.parametrize("proto", ["ll", "sentinel"])
@pytest.mark.parametrize("r", [2, 4, 8])
def test_allgather_every_dtype_and_odd_size(r: int, proto: str) -> None:
    _check_every_dtype_and_odd_size(ALLGATHER, "allgather", proto, r, 200 + r, lambda n: (r, n))


def test_special_values_and_2d_shapes() -> None:
    r = 4
    coll = MAXABS.collective("sentinel")
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=5.0, collectives=[coll])
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-40, -3.0], device=DEV)
    for dtype in coll.dtypes:
        xs = [torch.roll(special, k).to(dtype).repeat(5, 3) for k in range(r)]  # shape [5, 21]
        ys = c.run(coll, xs)
        ref = MAXABS.reference(xs)
        for y in ys:
            assert y.shape == (5, 21)
            assert_bitwise(y, ref, f"maxabs special values {dtype}")
    c.check()


def test_in_place_misaligned_and_non_contiguous() -> None:
    r = 2
    coll = MAXABS.collective("ll")
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=5.0, collectives=[coll])
    gen = torch.Generator(device=DEV).manual_seed(7)
    base = _inputs(r, 10001, torch.float32, gen)
    xs = [b[1:] for b in base]  # misaligned views
    ref = MAXABS.reference(xs)
    ys = c.run(coll, xs)
    for y in ys:
        assert_bitwise(y, ref, "maxabs misaligned inputs")
    outs = [torch.full((10001,), float("nan"), device=DEV)[1:] for _ in range(r)]  # misaligned, poisoned outputs
    c.run(coll, xs, out=outs)
    for y in outs:
        assert_bitwise(y, ref, "maxabs misaligned outputs")
    inplace = [x.clone() for x in xs]
    c.run(coll, inplace, out=inplace)
    for y in inplace:
        assert_bitwise(y, ref, "maxabs in place")
    nc = [torch.randn(64, 33, device=DEV, generator=gen).t() for _ in range(r)]
    for y in c.run(coll, nc):
        assert_bitwise(y, MAXABS.reference(nc), "maxabs non-contiguous input")
    c.check()


def test_mixed_with_all_reduce_eager_and_in_a_cuda_graph() -> None:
    """Both examples and all_reduce on one communicator (own regions and epochs each), eagerly and
    as one captured graph of varying sizes and dtypes, replayed with fresh inputs."""
    r = 4
    mx, ag = MAXABS.collective("ll"), ALLGATHER.collective("sentinel")
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=5.0, collectives=[mx, ag])
    gen = torch.Generator(device=DEV).manual_seed(9)
    calls = []
    for k in range(60):
        kind = ("maxabs", "allgather", "all_reduce")[k % 3]
        dtype = (torch.float32, torch.bfloat16, torch.float16, torch.float64)[k % 4]
        n = (1, 9, 1000, 4097, 70001)[k % 5]
        xs = _inputs(r, n, dtype, gen)
        outs = [torch.empty((r, n) if kind == "allgather" else (n,), dtype=dtype, device=DEV) for _ in range(r)]
        calls.append((kind, xs, outs))

    def issue() -> None:
        for kind, xs, outs in calls:
            if kind == "all_reduce":
                c.all_reduce(xs, algo="oneshot_ll", out=outs)
            else:
                c.run(mx if kind == "maxabs" else ag, xs, out=outs)

    def verify(what: str) -> None:
        for k, (kind, xs, outs) in enumerate(calls):
            ref = (MAXABS.reference(xs) if kind == "maxabs" else ALLGATHER.reference(xs) if kind == "allgather"
                   else rank_order_reduce(xs, "sum"))
            for y in outs:
                assert_bitwise(y, ref, f"{what} call {k} ({kind})")

    check_eagerly_then_in_a_graph(c, issue, verify, inputs=[x for _, xs, _ in calls for x in xs], gen=gen, replays=3)


@pytest.mark.parametrize("example", ["maxabs_allreduce", "allgather"])
@pytest.mark.parametrize("proto", ["ll", "sentinel"])
def test_absent_rank_times_out_every_rank_raises_and_reset_recovers(example: str, proto: str) -> None:
    r = 4
    mod = MAXABS if example == "maxabs_allreduce" else ALLGATHER
    coll = mod.collective(proto)
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=0.3, collectives=[coll])
    gen = torch.Generator(device=DEV).manual_seed(31)
    xs = _inputs(r, 70001, torch.float32, gen)
    assert_absent_rank_refuses_until_reset(c, lambda out: c.run(coll, xs, out=out), [mod.reference(xs)] * r, 2,
                                           f"{example} {proto}")


@pytest.mark.parametrize("proto", ["ll", "sentinel"])
def test_mismatch_is_detected_on_the_device(proto: str) -> None:
    """A user collective (no shared words: every thread checks every peer): every rank raises and
    no rank keeps a finite element of the mismatched call."""
    r = 4
    coll = MAXABS.collective(proto)
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=1.0, collectives=[coll])
    xs = _inputs(r, 100000, torch.float32, torch.Generator(device=DEV).manual_seed(5))
    c.run(coll, xs)
    c.check()
    outs = poisoned_like(xs)
    testing.inject(c, mismatch=1)
    c.run(coll, xs, out=outs)
    assert_mismatch_poisons_every_rank(c, outs, f"maxabs {proto}")
    testing.clear(c)
    c.reset()
    for y in c.run(coll, xs):
        assert_bitwise(y, MAXABS.reference(xs), "after mismatch and reset")


def test_run_argument_errors() -> None:
    coll = MAXABS.collective("ll")
    other = ALLGATHER.collective("ll")
    c = sollat.VirtualCommunicator(2, DEV, collectives=[coll])
    x = torch.ones(10, device=DEV)
    with pytest.raises(sollat.UnsupportedError, match="not registered"):
        c.run(other, [x, x])
    with pytest.raises(sollat.UnsupportedError, match="needs tensor as a list of 2"):
        c.run(coll, [x])
    with pytest.raises(sollat.UnsupportedError, match="does not support dtype torch.int32"):
        c.run(coll, [x.int(), x.int()])
    with pytest.raises(sollat.UnsupportedError, match="every rank must pass the same"):
        c.run(coll, [x, torch.ones(11, device=DEV)])
    with pytest.raises(sollat.UnsupportedError, match="out"):
        c.run(coll, [x, x], out=[torch.empty(3, device=DEV)] * 2)
    assert c.collectives == ("maxabs",)
