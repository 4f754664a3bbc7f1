"""Built-in AllGather / ReduceScatter (comm.all_gather / comm.reduce_scatter) on virtual ranks:
R = 2, 4, 8, every dtype, both protocols and auto, odd sizes, every op, poisoned (NaN) outputs,
bitwise against the rank-order references of sollat.gather_scatter; special values; misaligned
and non-contiguous views; mixed with all_reduce eagerly and in a CUDA graph (the two collectives
share one region per protocol); an absent rank (timeout on every rank, NaN-or-exact outputs,
refusal until reset) and an LL mismatch. Runs on one GPU (virtual ranks)."""

from __future__ import annotations

import pytest
import torch

import sollat
from sollat import testing
from sollat.collectives import gather_scatter as gs
from sollat.device.dtypes import DTYPES

from ._faults import assert_absent_rank_refuses_until_reset, assert_mismatch_poisons_every_rank, poisoned_like
from ._graphs import check_eagerly_then_in_a_graph
from ._reference import assert_bitwise, random_inputs, rank_order_reduce

pytestmark = pytest.mark.gpu

DEV = torch.device("cuda", 0) if torch.cuda.is_available() else None
SIZES = (1, 3, 7, 127, 1001, 4097, 70001, (1 << 18) + 3)
ALL_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
OPS = ("sum", "max", "min")


def _inputs(r: int, n: int, dtype: torch.dtype, gen: torch.Generator) -> list[torch.Tensor]:
    return random_inputs(r, n, dtype, DEV, gen)


def _poisoned(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=DEV)


def _check_gather(c: sollat.VirtualCommunicator, xs: list[torch.Tensor], algo: str, what: str) -> None:
    r = c.world_size
    outs = [_poisoned((r, *xs[0].shape), xs[0].dtype) for _ in range(r)]
    ys = c.all_gather(xs, out=outs, algo=algo)
    ref = gs.all_gather_reference(xs)
    for k, y in enumerate(ys):
        assert y.data_ptr() == outs[k].data_ptr() and y.shape == (r, *xs[0].shape)
        assert_bitwise(y, ref, f"{what} all_gather rank {k}")


def _check_scatter(c: sollat.VirtualCommunicator, xs: list[torch.Tensor], op: str, algo: str, what: str) -> None:
    r = c.world_size
    shape = gs.scatter_shape(xs[0].shape, r)
    outs = [_poisoned(shape, xs[0].dtype) for _ in range(r)]
    ys = c.reduce_scatter(xs, out=outs, op=op, algo=algo)
    refs = gs.reduce_scatter_reference(xs, op)
    for k, y in enumerate(ys):
        assert y.data_ptr() == outs[k].data_ptr() and y.shape == shape
        assert_bitwise(y, refs[k], f"{what} reduce_scatter {op} rank {k}")


@pytest.mark.parametrize("algo", ["ll", "sentinel", "auto"])
@pytest.mark.parametrize("r", [2, 4, 8])
def test_every_dtype_op_and_odd_size(r: int, algo: str) -> None:
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=5.0)
    gen = torch.Generator(device=DEV).manual_seed(300 + r)
    for dtype in ALL_DTYPES:
        for i, n in enumerate(SIZES):
            what = f"{algo} R={r} {dtype} n={n}"
            _check_gather(c, _inputs(r, n, dtype, gen), algo, what)
            _check_scatter(c, _inputs(r, r * n, dtype, gen), OPS[i % 3], algo, what)
    c.check()


def test_the_reference_order_matters_and_the_kernel_follows_it() -> None:
    """Inputs where another summation order gives other bits: 1e8, 1, -1e8 (fp32) and a bf16 sum
    that only fp32 accumulation gets right."""
    r = 4
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=5.0)
    vals = [1e8, 1.0, -1e8, 3.0]
    xs = [torch.full((r * 33,), v, device=DEV) for v in vals]
    for algo in ("ll", "sentinel"):
        for y in c.reduce_scatter(xs, algo=algo):
            assert bool((y == 3.0).all()), f"{algo}: not rank order: {y[:4].tolist()}"
    xb = [torch.full((r * 9,), v, device=DEV).bfloat16() for v in (1.0, 2.0**-8, 2.0**-8, 0.0)]
    for algo in ("ll", "sentinel"):
        for y in c.reduce_scatter(xb, algo=algo):
            assert bool((y.float() == 1.0 + 2.0**-7).all()), f"{algo}: not fp32 accumulation: {y[:3].tolist()}"
    c.check()


@pytest.mark.parametrize("algo", ["ll", "sentinel"])
def test_special_values_and_2d_shapes(algo: str) -> None:
    r = 4
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=5.0)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-40, -3.0], device=DEV,
                           dtype=torch.float64)
    for dtype in ALL_DTYPES:
        xs = [torch.roll(special, k).to(dtype).repeat(r * 5, 3) for k in range(r)]  # shape [r * 5, 21]
        _check_gather(c, [x[:5] for x in xs], algo, f"special {dtype}")
        for op in OPS:
            _check_scatter(c, xs, op, algo, f"special {dtype}")
    c.check()


def test_misaligned_non_contiguous_and_concatenated_outputs() -> None:
    r = 2
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=5.0)
    gen = torch.Generator(device=DEV).manual_seed(11)
    for dtype in ALL_DTYPES:
        base = _inputs(r, 2 * 10001, dtype, gen)
        xs = [b[1:2 * 10000 + 1] for b in base]  # misaligned views, 20000 elements
        for algo in ("ll", "sentinel"):
            # misaligned, poisoned outputs; guard elements around them must stay NaN
            obufs = [_poisoned((r * 20000 + 4,), dtype) for _ in range(r)]
            ys = c.all_gather(xs, out=[o[1:1 + r * 20000] for o in obufs], algo=algo)  # concatenated shape
            ref = gs.all_gather_reference(xs).flatten(0, 1)
            for y, o in zip(ys, obufs, strict=True):
                assert y.shape == (r * 20000,)
                assert_bitwise(y, ref, f"misaligned all_gather {algo} {dtype}")
                assert bool(torch.isnan(o[0])) and bool(torch.isnan(o[1 + r * 20000:]).all())
            obufs = [_poisoned((10000 + 4,), dtype) for _ in range(r)]
            ys = c.reduce_scatter(xs, out=[o[3:3 + 10000] for o in obufs], algo=algo)
            refs = gs.reduce_scatter_reference(xs, "sum")
            for k, (y, o) in enumerate(zip(ys, obufs, strict=True)):
                assert_bitwise(y, refs[k], f"misaligned reduce_scatter {algo} {dtype} rank {k}")
                assert bool(torch.isnan(o[:3]).all()) and bool(torch.isnan(o[3 + 10000:]).all())
    nc = [torch.randn(64, 2 * 33, device=DEV, generator=gen).t() for _ in range(r)]  # [66, 64], not contiguous
    for y, want in zip(c.reduce_scatter(nc, op="max"), gs.reduce_scatter_reference(nc, "max"), strict=True):
        assert y.shape == (33, 64)
        assert_bitwise(y, want, "non-contiguous reduce_scatter")
    for y in c.all_gather(nc):
        assert_bitwise(y, gs.all_gather_reference(nc), "non-contiguous all_gather")
    c.check()


def test_auto_takes_ll_for_small_and_sentinel_for_larger_messages() -> None:
    r = 4
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=5.0)
    f32 = DTYPES[torch.float32]
    ll_n = gs.LL_MAX_BYTES // 4
    assert c._gs_plan("all_gather", ll_n, f32, "", "auto").alg.name == "all_gather_ll"
    assert c._gs_plan("all_gather", ll_n + 1, f32, "", "auto").alg.name == "all_gather_sentinel"
    assert c._gs_plan("reduce_scatter", r * ll_n, f32, "sum", "auto").alg.name == "reduce_scatter_ll"
    assert c._gs_plan("reduce_scatter", r * (ll_n + 1), f32, "sum", "auto").alg.name == "reduce_scatter_sentinel"
    big = (gs.LIBRARY_ABOVE_BYTES // 4) + 5  # no library on virtual ranks: still sentinel
    assert c._gs_plan("all_gather", big, f32, "", "auto").alg.name == "all_gather_sentinel"
    gen = torch.Generator(device=DEV).manual_seed(12)
    _check_gather(c, _inputs(r, big, torch.float32, gen), "auto", "big auto")
    _check_scatter(c, _inputs(r, r * big, torch.float32, gen), "sum", "auto", "big auto")
    c.check()


def test_scratch_cost_and_gather_scatter_false() -> None:
    on = sollat.VirtualCommunicator(4, DEV)
    off = sollat.VirtualCommunicator(4, DEV, gather_scatter=False)
    assert on.gather_scatter and not off.gather_scatter
    cost = gs.region_cost(4, on.max_blocks)
    assert on.scratch_bytes_per_rank - off.scratch_bytes_per_rank == cost
    # 8 MiB: both regions' lines (the sentinel one keeps its signature words in its signature slot)
    assert cost <= 8 << 20
    x = torch.ones(8, device=DEV)
    with pytest.raises(sollat.UnsupportedError, match="gather_scatter=False"):
        off.all_gather([x] * 4)
    with pytest.raises(sollat.UnsupportedError, match="gather_scatter=False"):
        off.reduce_scatter([x] * 4, algo="ll")
    for y in off.all_reduce([x] * 4):  # the AllReduce is unaffected
        assert bool((y == 4).all())


def test_mixed_with_all_reduce_eager_and_in_a_cuda_graph() -> None:
    """all_gather and reduce_scatter (sharing one region per protocol) and all_reduce on one
    communicator, eagerly and as one captured graph of varying sizes, dtypes and protocols, replayed
    with fresh inputs."""
    r = 4
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=5.0)
    gen = torch.Generator(device=DEV).manual_seed(13)
    calls = []
    for k in range(72):
        kind = ("all_gather", "reduce_scatter", "all_reduce")[k % 3]
        dtype = ALL_DTYPES[k % 4]
        n = (1, 9, 1000, 4097, 70001)[k % 5]
        algo = ("ll", "sentinel", "auto")[(k // 3) % 3]
        op = OPS[k % 3] if kind == "reduce_scatter" else "sum"
        xs = _inputs(r, r * n if kind == "reduce_scatter" else n, dtype, gen)
        shape = (r, n) if kind == "all_gather" else (n,)
        calls.append((kind, algo, op, xs, [_poisoned(shape, dtype) for _ in range(r)]))

    def issue() -> None:
        for kind, algo, op, xs, outs in calls:
            if kind == "all_gather":
                c.all_gather(xs, out=outs, algo=algo)
            elif kind == "reduce_scatter":
                c.reduce_scatter(xs, out=outs, op=op, algo=algo)
            else:
                c.all_reduce(xs, algo="oneshot_ll", out=outs)

    def verify(what: str) -> None:
        for k, (kind, _, op, xs, outs) in enumerate(calls):
            refs = (gs.reduce_scatter_reference(xs, op) if kind == "reduce_scatter"
                    else [gs.all_gather_reference(xs)] * r if kind == "all_gather" else [rank_order_reduce(xs, "sum")] * r)
            for j, y in enumerate(outs):
                assert_bitwise(y, refs[j], f"{what} call {k} ({kind}) rank {j}")

    check_eagerly_then_in_a_graph(c, issue, verify, inputs=[x for *_, xs, _ in calls for x in xs],
                                  poisoned=[o for *_, outs in calls for o in outs], gen=gen, replays=3)


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter"])
@pytest.mark.parametrize("algo", ["ll", "sentinel"])
def test_absent_rank_times_out_every_rank_raises_and_reset_recovers(kind: str, algo: str) -> None:
    r = 4
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=0.3)
    gen = torch.Generator(device=DEV).manual_seed(31)
    n = 70001
    xs = _inputs(r, r * n if kind == "reduce_scatter" else n, torch.float32, gen)
    refs = gs.reduce_scatter_reference(xs) if kind == "reduce_scatter" else [gs.all_gather_reference(xs)] * r

    def call(out: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
        if kind == "all_gather":
            return c.all_gather(xs, out=out, algo=algo)
        return c.reduce_scatter(xs, out=out, algo=algo)

    assert_absent_rank_refuses_until_reset(c, call, refs, 2, f"{kind} {algo}")


@pytest.mark.parametrize("r", [3, 4])
@pytest.mark.parametrize("proto", ["ll", "sentinel"])
@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter"])
def test_mismatch_is_detected_on_the_device(kind: str, proto: str, r: int) -> None:
    """LL: the flags carry the signature; sentinel: the signature words (ll_buffer.h). The odd
    rank's shape was used before, so only the device can see the difference: every rank raises
    and no rank keeps a finite element of the mismatched call."""
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=1.0)
    gen = torch.Generator(device=DEV).manual_seed(5)
    fn = c.all_gather if kind == "all_gather" else c.reduce_scatter
    for n in (r * 100, r * 70001):
        xs = _inputs(r, n, torch.float32, gen)
        refs = gs.reduce_scatter_reference(xs) if kind == "reduce_scatter" else [gs.all_gather_reference(xs)] * r
        fn(xs, algo=proto)
        c.check()
        outs = poisoned_like(refs)
        testing.inject(c, mismatch=r // 2)
        fn(xs, algo=proto, out=outs)
        assert_mismatch_poisons_every_rank(c, outs, f"{kind} {proto} R={r} n={n}")
        testing.clear(c)
        c.reset()
        ys = fn(xs, algo=proto)
        for k, y in enumerate(ys):
            assert_bitwise(y, refs[k], f"{kind} after mismatch and reset rank {k}")


def test_argument_errors_on_the_gpu() -> None:
    c = sollat.VirtualCommunicator(2, DEV)
    x = torch.ones(10, device=DEV)
    with pytest.raises(sollat.UnsupportedError, match="multiple of world_size"):
        c.reduce_scatter([torch.ones(9, device=DEV)] * 2)
    with pytest.raises(sollat.UnsupportedError, match="is on cpu"):
        c.all_gather([x.cpu(), x.cpu()])
    with pytest.raises(sollat.UnsupportedError, match="dtype torch.int32"):
        c.all_gather([x.int(), x.int()])
    with pytest.raises(sollat.UnsupportedError, match="op 'avg'"):
        c.reduce_scatter([x, x], op="avg")
    with pytest.raises(sollat.UnsupportedError, match="needs a process group"):
        c.all_gather([x, x], algo="nccl")
    with pytest.raises(sollat.UnsupportedError, match="not contiguous"):
        c.all_gather([x, x], out=[torch.empty(10, 2, device=DEV).t()] * 2)


def test_torch_compile_keeps_both_ops() -> None:
    """fullgraph=True: all_gather and reduce_scatter stay in the compiled graph (sollat::gather_scatter
    ops) and give the eager bits."""
    c = sollat.VirtualCommunicator(2, DEV, timeout_s=5.0)

    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        g = c.all_gather([a * 2, b], algo="ll")
        s = c.reduce_scatter([a, b * 3], algo="sentinel")
        return g[1].flatten() + torch.cat([s[0], s[1]]).repeat(2)

    gen = torch.Generator(device=DEV).manual_seed(91)
    a, b = (torch.randn(1000, device=DEV, generator=gen) for _ in range(2))
    out = torch.compile(f, fullgraph=True)(a, b)
    g = gs.all_gather_reference([a * 2, b])
    s = gs.reduce_scatter_reference([a, b * 3], "sum")
    assert_bitwise(out.cpu(), (g.flatten() + torch.cat([s[0], s[1]]).repeat(2)).cpu(), "torch.compile")
    c.check()
