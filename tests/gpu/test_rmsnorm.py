"""GPU correctness of the fused AllReduce + residual add + RMSNorm on virtual ranks.

How results are compared, and why: the arithmetic is defined exactly and is the same for every
algorithm (sollat/collectives/rmsnorm.py, csrc/include/sollat/rmsnorm_math.h, docs/design.md "Arithmetic and
batch invariance"): rank-order fp32 sum rounded to the dtype, + residual, rounded again; the sum of
squares one pairwise tree over the row, zero-padded to a power of two, whatever the launch
geometry; IEEE div and sqrt (not rsqrt.approx); every add and multiply one rounding, no FMA.
``rmsnorm.reference`` replays those steps on the CPU in float32 (one function, no geometry), so
outputs are compared **bitwise** with it (NaN against NaN regardless of payload, since CPU and GPU
propagate NaN payloads differently), and every rank's outputs are compared bitwise with rank 0's,
NaN payloads included. The fused one-shots, the experimental two-shot (twoshot_sentinel:
reduce-scatter of x to each row's owner, all-gather of the fp32 sums) and the unfused hand-over
(sollat's AllReduce, then kernels/add_rmsnorm.cu) are all held to that one reference, so they agree
with each other bit for bit (tests/gpu/test_batch_invariance.py checks it across batch sizes).
"""

from __future__ import annotations

import itertools
import zlib

import pytest
import torch

import sollat
from sollat import testing
from sollat.collectives import algorithms, rmsnorm, rmsnorm_epilogue, rmsnorm_rules
from sollat.device import abi, dtypes, layout

from ._faults import assert_mismatch_poisons_every_rank, poisoned_like
from ._reference import assert_bitwise

pytestmark = pytest.mark.gpu

DEV = torch.device("cuda", 0) if torch.cuda.is_available() else None
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# oneshot_ll, oneshot_sentinel, twoshot_sentinel: every algorithm gives rmsnorm.reference's bits,
# so every test runs each of them the same way.
# The two-shot is experimental (slower on 2 GPUs; a fault may name the wrong peer:
# sollat/collectives/algorithms.py): its tests run only with SOLLAT_EXPERIMENTAL_RMSNORM_TWOSHOT=1, which also
# lets the communicators built here accept it.
TWOSHOT = algorithms.rmsnorm_twoshot_enabled()
# unfused: the hand-over (the AllReduce, then kernels/add_rmsnorm.cu), bitwise against the same
# reference as the fused algorithms.
# oneshot_ll_block (one block per row) and its pipelined build are not among auto's choices but
# run in every test.
EXPLICIT = ("oneshot_ll_block", "oneshot_ll_block_pipe")
ALGOS = [a for a in rmsnorm.ALGOS if TWOSHOT or a in rmsnorm.AUTO_ALGOS or a in EXPLICIT] + [rmsnorm.UNFUSED]


def algos(*names: str) -> list[str]:
    """``names`` without the two-shot ones unless it is enabled."""
    return [a for a in names if TWOSHOT or a in rmsnorm.AUTO_ALGOS or a in EXPLICIT or a == rmsnorm.UNFUSED]


needs_twoshot = pytest.mark.skipif(not TWOSHOT, reason=f"experimental: set {algorithms.RMSNORM_TWOSHOT_ENV}=1")
HIDDEN = [7, 1000, 4096, 5120, 8192]
TOKENS = [1, 3, 16, 17, 64]
INT_OF = {2: torch.int16, 4: torch.int32}
_comms: dict[int, sollat.VirtualCommunicator] = {}


def comm(r: int) -> sollat.VirtualCommunicator:
    if r not in _comms:
        _comms[r] = sollat.VirtualCommunicator(r, DEV, timeout_s=2.0)
    return _comms[r]


def raw(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(INT_OF[t.element_size()])


def inputs(r: int, tokens: int, hidden: int, dtype: torch.dtype, gen: torch.Generator, distinct: bool = False):
    """Partial sums per rank; the residual and weight equal on every rank (tensor parallelism) but
    separate tensors (a residual updated in place is each rank's own), or, with ``distinct``,
    different on every rank (each rank's outputs must use its own)."""
    xs = [torch.randn(tokens, hidden, device=DEV, generator=gen).to(dtype) for _ in range(r)]
    n = r if distinct else 1
    res = [torch.randn(tokens, hidden, device=DEV, generator=gen).to(dtype) for _ in range(n)]
    w = [(1 + 0.1 * torch.randn(hidden, device=DEV, generator=gen)).to(dtype) for _ in range(n)]
    if not distinct:
        res = [res[0].clone() for _ in range(r)]
        w = [w[0].clone() for _ in range(r)]
    return xs, res, w


def check(ys, rs, xs, res, w, eps: float, algo: str, what: str) -> None:
    """Bitwise against the CPU reference (per rank: its own residual and weight; computed once for
    ranks whose residual and weight hold the same bits), and every rank's outputs bitwise equal
    (NaN payloads included) among ranks with the same residual and weight."""
    r = len(xs)
    done: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (rank, reference y, reference residual)
    for k in range(r):
        same = next((d for d in done if torch.equal(raw(res[k]), raw(res[d[0]])) and torch.equal(raw(w[k]), raw(w[d[0]]))),
                    None)
        if same is None:
            ry, rr = rmsnorm.algo_reference(algo, xs, res[k], w[k], eps)
            done.append((k, ry, rr))
            assert_bitwise(rs[k].cpu(), rr, f"{what} residual_out rank {k}")
            assert_bitwise(ys[k].cpu(), ry, f"{what} y rank {k}")
        else:
            for name, a, b in (("y", ys[k], ys[same[0]]), ("residual_out", rs[k], rs[same[0]])):
                eq = raw(a) == raw(b)
                assert bool(eq.all()), (f"{what}: {name} of rank {k} differs from rank {same[0]} (same inputs) "
                                        f"in {int((~eq).sum())} elements")


@pytest.mark.parametrize("r", [2, 4, 8])
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_bitwise_hidden_sizes_and_tokens(r: int, algo: str, dtype: torch.dtype) -> None:
    c = comm(r)
    gen = torch.Generator(device=DEV).manual_seed(zlib.crc32(f"{r}|{algo}|{dtype}".encode()))
    for hidden, tokens in itertools.product(HIDDEN, TOKENS):
        xs, res, w = inputs(r, tokens, hidden, dtype, gen, distinct=True)
        outs = [torch.full_like(x, float("nan")) for x in xs]  # poisoned: every element must be written
        routs = [torch.full_like(x, float("nan")) for x in xs]
        ys, rs = c.all_reduce_rmsnorm(xs, res, w, 1e-6, algo, out=outs, residual_out=routs)
        assert all(y is o for y, o in zip(ys, outs, strict=True)) and all(a is b for a, b in zip(rs, routs, strict=True))
        check(ys, rs, xs, res, w, 1e-6, algo, f"{algo} R={r} {dtype} {tokens}x{hidden}")
    # one residual tensor and one weight tensor for every rank (read only): identical outputs
    xs, res, w = inputs(r, 5, 5120, dtype, gen)
    ys, rs = c.all_reduce_rmsnorm(xs, [res[0]] * r, w[0], 1e-5, algo)
    check(ys, rs, xs, [res[0]] * r, [w[0]] * r, 1e-5, algo, f"{algo} R={r} shared weight")
    c.check()


@pytest.mark.parametrize("r", [2, 5, 8])
def test_every_algorithm_gives_the_same_bits(r: int) -> None:
    """Fused one-shots, the two-shot (when enabled) and unfused on the same inputs: bitwise the same
    y and residual_out (NaN as NaN), adversarial values included, whatever their launch geometry,
    without the reference in between (the property auto's choice by size rests on)."""
    c = comm(r)
    gen = torch.Generator(device=DEV).manual_seed(170 + r)
    for dtype, (tokens, hidden) in itertools.product(DTYPES, ((1, 8192), (2, 12289), (3, 7), (40, 4096))):
        xs, res, w = adversarial(r, tokens, hidden, dtype, gen)
        shared_res, shared_w = [res[0]] * r, [w[0]] * r
        got = {algo: c.all_reduce_rmsnorm(xs, shared_res, shared_w, 1e-6, algo) for algo in ALGOS}
        first = ALGOS[0]
        for algo, (ys, rs) in got.items():
            for name, a, b in (("y", ys[0], got[first][0][0]), ("residual_out", rs[0], got[first][1][0])):
                assert_bitwise(a.cpu(), b.cpu(), f"{algo} vs {first} {name} R={r} {dtype} {tokens}x{hidden}")
    c.check()


@pytest.mark.parametrize("r", [2, 8])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_more_sizes_and_shapes(r: int, dtype: torch.dtype) -> None:
    """Tiny and odd rows, rows that are not line-aligned, several passes per row, many rows per
    block, and x of more than two dimensions."""
    c = comm(r)
    gen = torch.Generator(device=DEV).manual_seed(r * 7 + DTYPES.index(dtype))
    for algo in ALGOS:
        for hidden, tokens in ((1, 1), (1, 64), (2, 5), (3, 33), (33, 2), (127, 9), (2049, 4), (16384, 2),
                               (12288, 3), (rmsnorm.MAX_HIDDEN, 1), (8192, 40)):
            xs, res, w = inputs(r, tokens, hidden, dtype, gen)
            ys, rs = c.all_reduce_rmsnorm(xs, res, w, 1e-6, algo)
            check(ys, rs, xs, res, w, 1e-6, algo, f"{algo} R={r} {dtype} {tokens}x{hidden}")
        xs, res, w = inputs(r, 6, 1000, dtype, gen)
        xs3 = [x.view(2, 3, 1000) for x in xs]
        res3 = [x.view(2, 3, 1000) for x in res]
        ys, rs = c.all_reduce_rmsnorm(xs3, res3, w, 1e-6, algo)
        assert ys[0].shape == rs[0].shape == (2, 3, 1000)
        check(ys, rs, xs3, res3, w, 1e-6, algo, f"{algo} 3-d")
    c.check()


def special_values(dtype: torch.dtype) -> list[float]:
    fi = torch.finfo(dtype)
    return [float("nan"), float("inf"), float("-inf"), -0.0, 0.0, fi.tiny / 4, -fi.tiny / 2, fi.tiny, fi.max,
            -fi.max, fi.max / 2, 1.0, -1.0]


def adversarial(r: int, tokens: int, hidden: int, dtype: torch.dtype, gen: torch.Generator):
    """Random values with NaNs of random payloads, infinities, signed zeros, denormals and values
    whose sum overflows, spread over x, the residual and the weight; some rows all special."""
    xs, res, w = inputs(r, tokens, hidden, dtype, gen)
    vals = torch.tensor(special_values(dtype), dtype=torch.float32, device=DEV).to(dtype)
    for t in [*xs, *res]:
        pick = torch.rand(t.shape, device=DEV, generator=gen) < 0.05
        idx = torch.randint(0, len(vals), t.shape, device=DEV, generator=gen)
        t[pick] = vals[idx][pick]
        if tokens > 2:  # row 1: nothing but zeros of both signs and denormals (a zero or tiny norm)
            tiny = vals[torch.randint(3, 7, (hidden,), device=DEV, generator=gen)]
            t[1] = tiny
    # NaNs with random payloads and signs
    ib = INT_OF[xs[0].element_size()]
    nbits = 8 * xs[0].element_size()
    exp_mask = {torch.float32: 0x7F800000, torch.bfloat16: 0x7F80, torch.float16: 0x7C00}[dtype]
    for t in xs:
        pick = torch.rand(t.shape, device=DEV, generator=gen) < 0.01
        mant = torch.randint(1, 1 << min(nbits - 1 - (8 if dtype != torch.float16 else 5), 22), t.shape, device=DEV,
                             generator=gen)
        sign = torch.where(torch.rand(t.shape, device=DEV, generator=gen) < 0.5, 0, 1 << (nbits - 1))
        bits = (mant | exp_mask | sign).to(torch.int64)
        bits = torch.where(bits >= 1 << (nbits - 1), bits - (1 << nbits), bits).to(ib)
        t.view(ib)[pick] = bits[pick]
    for ww in w:
        pick = torch.rand(hidden, device=DEV, generator=gen) < 0.05
        ww[pick] = vals[torch.randint(3, len(vals), (hidden,), device=DEV, generator=gen)][pick]  # no NaN/Inf weights
    return xs, res, w


@pytest.mark.parametrize("r", [2, 4, 8])
@pytest.mark.parametrize("algo", ALGOS)
def test_adversarial_inputs_bitwise_and_identical_on_every_rank(r: int, algo: str) -> None:
    c = comm(r)
    gen = torch.Generator(device=DEV).manual_seed(zlib.crc32(f"adv|{r}|{algo}".encode()))
    for dtype in DTYPES:
        for hidden, tokens in ((7, 5), (1000, 8), (8192, 4), (5120, 17)):
            for eps in (1e-6, 0.0):  # eps 0: an all-zero row gives 0 * (1 / 0) = NaN, as in the reference
                xs, res, w = adversarial(r, tokens, hidden, dtype, gen)
                shared_res, shared_w = [res[0]] * r, [w[0]] * r
                ys, rs = c.all_reduce_rmsnorm(xs, shared_res, shared_w, eps, algo)
                what = f"{algo} R={r} {dtype} {tokens}x{hidden} eps={eps}"
                check(ys, rs, xs, shared_res, shared_w, eps, algo, what)  # also every rank against rank 0
    c.check()


@pytest.mark.parametrize("r", [2, 4, 8])
def test_in_place_residual_and_output(r: int) -> None:
    """residual_out=residual updates the residual in place; out=x writes y over x (vLLM's
    fused_add_rms_norm does both), for one and several passes per row."""
    c = comm(r)
    gen = torch.Generator(device=DEV).manual_seed(300 + r)
    for algo, dtype, (tokens, hidden) in itertools.product(ALGOS, DTYPES, ((4, 1000), (17, 8192), (2, 16384))):
        xs, res, w = inputs(r, tokens, hidden, dtype, gen)
        xs0, res0 = [x.clone() for x in xs], [t.clone() for t in res]
        ys, rs = c.all_reduce_rmsnorm(xs, res, w, 1e-6, algo, residual_out=res)
        assert all(a is b for a, b in zip(rs, res, strict=True))
        check(ys, rs, xs0, res0, w, 1e-6, algo, f"in-place residual {algo} {dtype}")
        xs, res = [x.clone() for x in xs0], [t.clone() for t in res0]
        ys, rs = c.all_reduce_rmsnorm(xs, res, w, 1e-6, algo, out=xs, residual_out=res)
        assert all(a is b for a, b in zip(ys, xs, strict=True))
        check(ys, rs, xs0, res0, w, 1e-6, algo, f"in-place x and residual {algo} {dtype}")
    c.check()


@pytest.mark.parametrize("r", [2, 4, 8])
@needs_twoshot
@pytest.mark.parametrize("algo", ["twoshot_sentinel"])
def test_twoshot_rows_and_owners(r: int, algo: str) -> None:
    """The two-shot from 1 row (ranks 1..R-1 own none) to a few hundred (many rows per block, each
    block's rows owned by changing ranks: the cross-buffer credit across owners), rows not
    divisible by R, one and several passes per row; bitwise against the reference, and bitwise
    equal to the one-shot of the same protocol on the same inputs (distinct residuals and weights
    per rank: every rank adds its own residual to the owner's sum)."""
    c = comm(r)
    one = algo.replace("twoshot", "oneshot")
    gen = torch.Generator(device=DEV).manual_seed(zlib.crc32(f"owners|{r}|{algo}".encode()))
    for k, tokens in enumerate((1, 2, r - 1, r, r + 1, 2 * r + 3, 31, 33, 100, 257, 300)):
        if tokens < 1:
            continue
        hidden = (1000, 4096, 7, 16384)[k % 4]
        dtype = DTYPES[k % 3]
        xs, res, w = inputs(r, tokens, hidden, dtype, gen, distinct=k % 2 == 0)
        ys, rs = c.all_reduce_rmsnorm(xs, res, w, 1e-6, algo)
        what = f"{algo} R={r} {dtype} {tokens}x{hidden}"
        check(ys, rs, xs, res, w, 1e-6, algo, what)
        ys1, rs1 = c.all_reduce_rmsnorm(xs, res, w, 1e-6, one)
        for q in range(r):
            for name, a, b in (("y", ys[q], ys1[q]), ("residual_out", rs[q], rs1[q])):
                same = (raw(a) == raw(b)) | (torch.isnan(a) & torch.isnan(b))
                assert bool(same.all()), f"{what}: {name} of rank {q} differs from {one}'s"
    c.check()


def test_auto_uses_a_one_shot_algorithm_or_the_unfused_hand_over() -> None:
    """auto follows the all_reduce_rmsnorm rule the card has (its table's, else the built-in
    virtual-rank rule: rmsnorm_rules.rules_for): a fused one-shot or unfused, never the two-shot,
    and the reference's bits whichever it picks."""
    for r in (2, 4, 8):
        c = comm(r)
        rules = rmsnorm_rules.rules_for(c._selection_table().rmsnorm, r, real=False)
        gen = torch.Generator(device=DEV).manual_seed(40 + r)
        for tokens, hidden in ((1, 7), (1, 4096), (1, 8192), (2, 8192), (3, 8192), (8, 8192), (64, 8192),
                               (16, 4096), (128, 5120)):
            xs, res, w = inputs(r, tokens, hidden, torch.bfloat16, gen)
            ys, rs = c.all_reduce_rmsnorm(xs, res, w)  # eps 1e-6, algo auto
            public = c.selected_rmsnorm_algorithm(tokens * hidden * 2, torch.bfloat16, tokens)
            want = rmsnorm_rules.choose(rules, tokens, hidden * 2, rmsnorm_rules.FUSED)
            assert public in rmsnorm.AUTO_ALGOS if want == rmsnorm_rules.FUSED else public == want
            check(ys, rs, xs, res, w, 1e-6, public, f"auto ({public}) R={r} {tokens}x{hidden}")


@pytest.mark.parametrize("cluster", [False, True], ids=["grid", "rank-clusters"])
def test_rank_clusters_on_and_off(cluster: bool) -> None:
    for r in (3, 8):
        c = sollat.VirtualCommunicator(r, DEV, timeout_s=2.0, cluster_ranks=cluster)
        gen = torch.Generator(device=DEV).manual_seed(50 + r)
        for algo, (tokens, hidden) in itertools.product(ALGOS, ((2, 4096), (4, 8192), (64, 5120))):
            xs, res, w = inputs(r, tokens, hidden, torch.bfloat16, gen)
            ys, rs = c.all_reduce_rmsnorm(xs, res, w, 1e-6, algo)
            check(ys, rs, xs, res, w, 1e-6, algo, f"R={r} cluster={cluster} {algo} {tokens}x{hidden}")
        c.check()


@pytest.mark.parametrize("r", [2, 4, 8])
def test_mixed_eager_calls(r: int) -> None:
    """Fused calls of varying shape, dtype and protocol interleaved with AllReduces on the same
    communicator; inputs overwritten right after each call (it must not read them later)."""
    c = comm(r)
    gen = torch.Generator(device=DEV).manual_seed(60 + r)
    shapes = [(1, 7), (8, 8192), (3, 1000), (64, 4096), (2, 5120), (17, 16384)]
    pending = []
    for k in range(300):
        tokens, hidden = shapes[(k * 5 + k // 3) % len(shapes)]
        dtype = DTYPES[k % 3]
        algo = ALGOS[(k // 2) % len(ALGOS)]  # one- and two-shot interleaved on one communicator
        xs, res, w = inputs(r, tokens, hidden, dtype, gen)
        ys, rs = c.all_reduce_rmsnorm(xs, res, w, 1e-6, algo)
        kept = ([x.clone() for x in xs], [t.clone() for t in res], [t.clone() for t in w])
        for t in [*xs, *res, *w]:
            t.fill_(float("nan"))
        ar_in = [torch.randn(tokens * hidden, device=DEV, generator=gen) for _ in range(r)]
        ar_out = c.all_reduce(ar_in, algo=("oneshot_ll", "twoshot_sentinel", "oneshot_sentinel")[k % 3])
        pending.append((ys, rs, kept, algo, [a.clone() for a in ar_in], ar_out))
        if len(pending) >= 32:
            _check_pending(pending, r)
    _check_pending(pending, r)
    c.check()


def _check_pending(pending: list, r: int) -> None:
    from ._reference import rank_order_reduce

    for k, (ys, rs, (xs, res, w), algo, ar_in, ar_out) in enumerate(pending):
        check(ys, rs, xs, res, w, 1e-6, algo, f"mixed call {k}")
        ref = rank_order_reduce(ar_in, "sum")
        for y in ar_out:
            assert_bitwise(y, ref, f"mixed all_reduce {k}")
    pending.clear()


@pytest.mark.parametrize("r", [2, 4, 8])
def test_cuda_graph_mixed_calls(r: int) -> None:
    """A graph of fused calls (both protocols, every dtype, in-place residuals among them)
    interleaved with AllReduces, replayed with fresh inputs."""
    c = comm(r)
    gen = torch.Generator(device=DEV).manual_seed(70 + r)
    shapes = [(1, 8192), (8, 8192), (3, 1000), (64, 4096), (5, 7), (2, 16384)]
    calls = []
    for k in range(120):
        tokens, hidden = shapes[k % len(shapes)]
        dtype = DTYPES[(k // 2) % 3]
        algo = ALGOS[(k + k // 4) % len(ALGOS)]  # every algorithm among the in-place calls (k % 4 == 3)
        xs, res, w = inputs(r, tokens, hidden, dtype, gen)
        in_place = k % 4 == 3
        outs = [torch.empty_like(x) for x in xs]
        routs = res if in_place else [torch.empty_like(x) for x in xs]
        ar_in = [torch.randn(tokens * hidden, device=DEV, generator=gen) for _ in range(r)]
        ar_out = [torch.empty_like(a) for a in ar_in]
        calls.append((algo, xs, res, w, outs, routs, ar_in, ar_out))
    for algo, xs, res, w, outs, _routs, ar_in, ar_out in calls[:24]:  # compile and plan outside capture
        c.all_reduce_rmsnorm(xs, res, w, 1e-6, algo, out=outs, residual_out=[torch.empty_like(x) for x in xs])
        c.all_reduce(ar_in, algo="oneshot_ll", out=ar_out)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for algo, xs, res, w, outs, routs, ar_in, ar_out in calls:
            c.all_reduce_rmsnorm(xs, res, w, 1e-6, algo, out=outs, residual_out=routs)
            c.all_reduce(ar_in, algo="oneshot_ll", out=ar_out)
    from ._reference import rank_order_reduce

    for replay in range(4):
        kept = []
        for _algo, xs, res, _w, outs, _routs, ar_in, ar_out in calls:
            for t in [*xs, *ar_in]:
                t.copy_(torch.randn(t.shape, device=DEV, generator=gen).to(t.dtype))
            fresh = torch.randn(res[0].shape, device=DEV, generator=gen).to(res[0].dtype)
            for t in res:  # equal on every rank (tensor parallelism), each rank's own tensor
                t.copy_(fresh)
            for o in [*outs, *ar_out]:
                o.fill_(float("nan"))
            kept.append(([x.clone() for x in xs], [t.clone() for t in res]))
        g.replay()
        torch.cuda.synchronize()
        for k, ((algo, _xs, _res, w, outs, routs, ar_in, ar_out), (xs0, res0)) in enumerate(zip(calls, kept, strict=True)):
            check(outs, routs, xs0, res0, w, 1e-6, algo, f"graph replay {replay} call {k}")
            ref = rank_order_reduce(ar_in, "sum")
            for y in ar_out:
                assert_bitwise(y, ref, f"graph replay {replay} all_reduce {k}")
    c.check()


def test_small_epoch_space_wraps_correctly() -> None:
    """SOLLAT_EPOCH_BITS=2: epochs wrap every 4 passes; several passes per row and per call."""
    r = 4
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=2.0)
    c._extra_defines = {"SOLLAT_EPOCH_BITS": "2"}
    gen = torch.Generator(device=DEV).manual_seed(80)
    shapes = [(1, 7), (3, 16384), (64, 8192), (2, 1000), (5, 12288)]
    for k in range(100):
        tokens, hidden = shapes[k % len(shapes)]
        algo = ALGOS[(k // 5) % len(ALGOS)]
        xs, res, w = inputs(r, tokens, hidden, torch.float32, gen)
        ys, rs = c.all_reduce_rmsnorm(xs, res, w, 1e-6, algo)
        check(ys, rs, xs, res, w, 1e-6, algo, f"epoch bits 2, call {k}")
    c.check()


@pytest.mark.parametrize("algo", algos("oneshot_ll", "twoshot_sentinel", "unfused"))
def test_torch_compile_keeps_the_op(algo: str) -> None:
    r = 2
    c = comm(r)

    def f(a: torch.Tensor, b: torch.Tensor, res: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ys, rs = c.all_reduce_rmsnorm([a * 2, b * 2], [res, res], w, 1e-5, algo)
        return ys[0] + rs[1]

    cf = torch.compile(f, fullgraph=True)
    gen = torch.Generator(device=DEV).manual_seed(90)
    a, b, res = (torch.randn(4, 1000, device=DEV, generator=gen) for _ in range(3))
    w = torch.randn(1000, device=DEV, generator=gen)
    out = cf(a, b, res, w)
    y, r_ = rmsnorm.algo_reference(algo, [a * 2, b * 2], res, w, 1e-5)
    assert_bitwise(out.cpu(), y + r_, f"torch.compile {algo}")


def test_a_fault_poisons_both_outputs_and_refuses_until_reset() -> None:
    r = 4
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=0.3)
    gen = torch.Generator(device=DEV).manual_seed(100)
    for algo in ALGOS:
        xs, res, w = inputs(r, 20, 8192, torch.float32, gen)
        ref = [rmsnorm.algo_reference(algo, xs, res[k], w[k], 1e-6) for k in range(r)]
        testing.inject(c, absent=2)
        outs = [torch.zeros_like(x) for x in xs]
        routs = [torch.zeros_like(x) for x in xs]
        c.all_reduce_rmsnorm(xs, res, w, 1e-6, algo, out=outs, residual_out=routs)
        with pytest.raises(sollat.PeerTimeoutError) as ei:
            c.check()
        assert ei.value.peer == 2
        for k in (0, 1, 3):  # the absent rank returned at once and wrote nothing
            for got, want in ((outs[k].cpu(), ref[k][0]), (routs[k].cpu(), ref[k][1])):
                ok = torch.isnan(got) | (raw(got) == raw(want))
                assert bool(ok.all()), f"{algo}: rank {k} wrote a value that is neither NaN nor exact"
                assert bool(torch.isnan(got).any()), f"{algo}: rank {k} shows no sign of the fault"
        with pytest.raises(sollat.CommunicatorFaultedError):
            c.all_reduce_rmsnorm(xs, res, w, 1e-6, algo)
        testing.clear(c)
        c.reset()
        ys, rs = c.all_reduce_rmsnorm(xs, res, w, 1e-6, algo)
        check(ys, rs, xs, res, w, 1e-6, algo, f"{algo} after reset")


def _mismatch_poisons_then_reset_recovers(c: sollat.VirtualCommunicator, xs: list[torch.Tensor],
                                          res: list[torch.Tensor], w: torch.Tensor, algo: str) -> None:
    """Rank 3's flipped call signature: every rank's y and residual_out are NaN and every rank
    raises; after reset() the same call is the reference again."""
    outs, res_outs = poisoned_like(xs), poisoned_like(res)
    testing.inject(c, mismatch=3)
    c.all_reduce_rmsnorm(xs, res, w, 1e-6, algo, out=outs, residual_out=res_outs)
    assert_mismatch_poisons_every_rank(c, outs + res_outs, f"{algo} y and residual_out")
    testing.clear(c)
    c.reset()
    ys, rs = c.all_reduce_rmsnorm(xs, res, w, 1e-6, algo)
    check(ys, rs, xs, res, w, 1e-6, algo, "after mismatch and reset")


@pytest.mark.parametrize("algo", algos("oneshot_ll", "oneshot_sentinel", "twoshot_sentinel", "unfused",
                                        "oneshot_ll_block", "oneshot_ll_block_pipe"))
def test_call_mismatch_is_reported(algo: str) -> None:
    """Rank 3 flips a bit of its call signature: in the two-shot the owners see it in rank 3's
    reduce-scatter lines (and rank 3's peers in its all-gather lines of the rows it owns); LL in
    the flags, sentinel in the signature words; unfused in its AllReduce's (NaN sums, so the
    epilogue's y and residual_out are NaN too)."""
    r = 4
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=0.5)
    gen = torch.Generator(device=DEV).manual_seed(110)
    xs, res, w = inputs(r, 4, 1000, torch.bfloat16, gen)
    c.all_reduce_rmsnorm(xs, res, w, 1e-6, algo)  # the shape is known: only the device can see the difference
    c.check()
    _mismatch_poisons_then_reset_recovers(c, xs, res, w, algo)


def test_unfused_all_reduce_carries_the_calls_arguments() -> None:
    """Virtual ranks make one call for all ranks, so a differing call cannot be expressed; what
    makes real ranks see it is that each unfused call's AllReduce carries a signature of its own:
    eps, hidden size at the same element count, rows and the FP8 copy each give another one (and
    the call is still right), while a repeated call reuses its plan."""
    r = 4
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=2.0)
    gen = torch.Generator(device=DEV).manual_seed(111)
    sig = [p.name for p in abi.TAIL_PARAMS].index("sig")
    scale = torch.full((1,), 0.05, device=DEV)
    calls = [(2, 2048, 1e-6, False), (2, 2048, 1e-5, False), (4, 1024, 1e-6, False), (1, 4096, 1e-6, False),
             (2, 2048, 1e-6, True), (2, 2048, 1e-6, False)]
    seen: dict[tuple[int, int, float, bool], int] = {}
    for rows, hidden, eps, fp8 in calls:
        xs, res, w = inputs(r, rows, hidden, torch.bfloat16, gen)
        before = {k: v for k, v in c._calls.items() if len(k) == 7 and isinstance(k[0], int)}  # the unfused AllReduces' plans (keyed by call)
        got = c.all_reduce_rmsnorm(xs, res, w, eps, "unfused", fp8_scale=scale if fp8 else None)
        check(got[0], got[1], xs, res, w, eps, "unfused", f"unfused {rows}x{hidden} eps={eps} fp8={fp8}")
        new = {k: v for k, v in c._calls.items() if len(k) == 7 and isinstance(k[0], int) and k not in before}
        key = (rows, hidden, eps, fp8)
        if key in seen:
            assert not new, f"{key}: a repeated call planned its AllReduce again"
            continue
        assert len(new) == 1, f"{key}: {len(new)} new AllReduce plans for one unfused call"
        seen[key] = int(next(iter(new.values())).tail[sig])
    c.check()
    assert len(set(seen.values())) == len(seen) == 5, f"the signatures do not tell the calls apart: {seen}"


@pytest.mark.parametrize("algo", ["oneshot_ll_block", "oneshot_ll_block_pipe"])
@pytest.mark.parametrize("r", [2, 3, 4, 8, 9])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_block_algorithm_rows_ranks_and_passes(algo: str, r: int, dtype: torch.dtype) -> None:
    """oneshot_ll_block (one block per row, rmsnorm.block_row_geometry) and its pipelined build:
    bitwise the reference on every rank at 1-512 rows, odd and multi-pass rows (two receive groups
    at 8 ranks, a wide group at 9, pipelined passes over several rows per block), distinct
    residuals and weights per rank, poisoned outputs."""
    c = comm(r)
    gen = torch.Generator(device=DEV).manual_seed(zlib.crc32(f"{algo}|{r}|{dtype}".encode()))
    shapes = [(1, 4096), (2, 8192), (16, 4096), (1, 7), (3, 1001), (5, 5120), (33, 2050), (512, 64), (4, 16384),
              (100, 8192)]
    for k, (tokens, hidden) in enumerate(shapes):
        xs, res, w = inputs(r, tokens, hidden, dtype, gen, distinct=k % 2 == 0)
        outs, routs = poisoned_like(xs), poisoned_like(xs)
        ys, rs = c.all_reduce_rmsnorm(xs, res, w, 1e-6, algo, out=outs, residual_out=routs)
        check(ys, rs, xs, res, w, 1e-6, algo, f"{algo} R={r} {dtype} {tokens}x{hidden}")
    c.check()


@pytest.mark.parametrize("algo,hidden", [("oneshot_ll_block", 4096), ("oneshot_ll_block_pipe", 8192)])
def test_block_algorithm_mismatch_in_its_second_receive_group(algo: str, hidden: int) -> None:
    """8 ranks, one row of bf16: four lines per thread in two receive groups (oneshot_ll_block,
    4096), or four pipelined passes on two sets of channels (the pipelined build, 8192); rank 3's
    flipped call signature is seen by every rank, and the communicator computes right again after
    reset."""
    r = 8
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=0.5)
    g = rmsnorm.geometry(algo, torch.bfloat16, 1, hidden, r)
    assert g.slots == 4 if algo == "oneshot_ll_block" else g.passes == 4
    gen = torch.Generator(device=DEV).manual_seed(111)
    xs, res, w = inputs(r, 1, hidden, torch.bfloat16, gen)
    c.all_reduce_rmsnorm(xs, res, w, 1e-6, algo)
    c.check()
    _mismatch_poisons_then_reset_recovers(c, xs, res, w, algo)


def test_bad_inputs_raise_clear_errors() -> None:
    c = comm(2)
    x = torch.randn(3, 16, device=DEV)
    w = torch.ones(16, device=DEV)
    with pytest.raises(sollat.UnsupportedError, match="supported dtypes"):
        c.all_reduce_rmsnorm([x.double()] * 2, [x.double()] * 2, w.double())
    with pytest.raises(sollat.UnsupportedError, match="cpu"):
        c.all_reduce_rmsnorm([x.cpu()] * 2, [x] * 2, w)
    with pytest.raises(sollat.UnsupportedError, match="weight"):
        c.all_reduce_rmsnorm([x] * 2, [x] * 2, torch.ones(15, device=DEV))
    with pytest.raises(sollat.UnsupportedError, match="unknown algorithm"):
        c.all_reduce_rmsnorm([x] * 2, [x] * 2, w, 1e-6, "threeshot_ll")
    with pytest.raises(sollat.UnsupportedError, match="supported maximum"):
        big = torch.zeros(1, rmsnorm.MAX_HIDDEN + 1, device=DEV)
        c.all_reduce_rmsnorm([big] * 2, [big] * 2, torch.zeros(rmsnorm.MAX_HIDDEN + 1, device=DEV))
    c.check()


# ---- the FP8 copy (fp8_scale / fp8_out): bitwise against rmsnorm.fp8_reference ---------------------
FP8 = torch.float8_e4m3fn
POISON_BYTE = 0x55  # an e4m3 value (3.25 / 8 ...) no correct call writes into every element by chance


def fp8_outputs(xs, n_extra: int = 0) -> list[torch.Tensor]:
    """Poisoned FP8 outputs, one per rank; with ``n_extra`` a view ``n_extra`` bytes into a larger
    buffer (misaligned rows: the kernel's byte path)."""
    outs = []
    for x in xs:
        buf = torch.full((x.numel() + n_extra,), POISON_BYTE, dtype=torch.uint8, device=DEV)
        outs.append(buf[n_extra:].view(FP8).view(x.shape))
    return outs


def check_fp8(ys, qs, scales, xs, res, w, eps: float, algo: str, what: str) -> None:
    """Each rank's copy bit for bit against fp8_reference of the reference y (one NaN byte, 0x7F)
    with that rank's scale, and equal on ranks with the same inputs and scale."""
    r = len(xs)
    cache: dict[tuple[int, int], torch.Tensor] = {}
    for k in range(r):
        assert qs[k].dtype == FP8 and qs[k].shape == xs[0].shape, what
        same = next((d for d in range(k) if torch.equal(raw(res[k]), raw(res[d])) and torch.equal(raw(w[k]), raw(w[d]))),
                    k)
        if same not in cache:
            cache[same] = rmsnorm.algo_reference(algo, xs, res[same], w[same], eps)[0]
        want = rmsnorm.fp8_reference(cache[same], scales[k]).view(torch.uint8)
        got = qs[k].cpu().view(torch.uint8)
        bad = got != want
        if bool(bad.any()):
            i = int(bad.flatten().nonzero()[0])
            yk = ys[k].cpu().flatten()[i].item()
            raise AssertionError(f"{what}: fp8 copy of rank {k}: {int(bad.sum())} of {bad.numel()} bytes differ; first "
                                 f"at {i}: got {got.flatten()[i].item():#04x}, expected {want.flatten()[i].item():#04x} "
                                 f"(y {yk!r}, scale {scales[k].item()!r})")


def scale_tensors(r: int, value: float | list[float]) -> list[torch.Tensor]:
    vals = value if isinstance(value, list) else [value] * r
    return [torch.tensor([v], dtype=torch.float32, device=DEV) for v in vals]


@pytest.mark.parametrize("r", [2, 4, 8])
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fp8_bitwise_hidden_sizes_tokens_and_scales(r: int, algo: str, dtype: torch.dtype) -> None:
    """Every element of y, residual_out and the copy written (poisoned outputs), each bitwise; a
    scale per rank (a list) or one for all; aligned and misaligned copies (1 and 3 bytes in)."""
    c = comm(r)
    gen = torch.Generator(device=DEV).manual_seed(zlib.crc32(f"fp8|{r}|{algo}|{dtype}".encode()))
    scale_values: list[float | list[float]] = [0.0123, 1.0, 3.7, [0.02 * (k + 1) for k in range(r)]]
    for k, (hidden, tokens) in enumerate(itertools.product((7, 1000, 4096, 5120, 8192), (1, 3, 17))):
        xs, res, w = inputs(r, tokens, hidden, dtype, gen, distinct=k % 2 == 1)
        value = scale_values[k % len(scale_values)]
        scales = scale_tensors(r, value)
        outs = [torch.full_like(x, float("nan")) for x in xs]
        routs = [torch.full_like(x, float("nan")) for x in xs]
        qouts = fp8_outputs(xs, (0, 1, 3)[k % 3])
        arg = scales if isinstance(value, list) else scales[0]  # a list, or one tensor for every rank
        ys, rs, qs = c.all_reduce_rmsnorm(xs, res, w, 1e-6, algo, out=outs, residual_out=routs, fp8_scale=arg,
                                          fp8_out=qouts)
        assert all(q is o for q, o in zip(qs, qouts, strict=True))
        what = f"fp8 {algo} R={r} {dtype} {tokens}x{hidden} scale={value}"
        check(ys, rs, xs, res, w, 1e-6, algo, what)  # y and residual_out exactly as without the copy
        check_fp8(ys, qs, scales, xs, res, w, 1e-6, algo, what)
    c.check()


@pytest.mark.parametrize("r", [2, 8])
def test_fp8_adversarial_inputs_and_scales(r: int) -> None:
    """NaN, Inf, signed zeros, denormals and overflowing sums (adversarial), with scales that
    saturate most values (1e-4), make most of them e4m3 subnormals or zeros (1e4), flip signs
    (-0.5), divide by zero (0: +-448, and 0 / 0 = NaN -> 0x7F) and give zeros (Inf)."""
    c = comm(r)
    gen = torch.Generator(device=DEV).manual_seed(120 + r)
    for algo, dtype in itertools.product(ALGOS, DTYPES):
        for hidden, tokens in ((7, 5), (1000, 8), (5120, 17)):
            for scale in (1e-4, 0.05, 1e4, -0.5, 0.0, float("inf")):
                xs, res, w = adversarial(r, tokens, hidden, dtype, gen)
                shared_res, shared_w = [res[0]] * r, [w[0]] * r
                scales = scale_tensors(r, scale)
                ys, rs, qs = c.all_reduce_rmsnorm(xs, shared_res, shared_w, 1e-6, algo, fp8_scale=scales[0])
                what = f"fp8 adversarial {algo} R={r} {dtype} {tokens}x{hidden} scale={scale}"
                check(ys, rs, xs, shared_res, shared_w, 1e-6, algo, what)
                check_fp8(ys, qs, scales, xs, shared_res, shared_w, 1e-6, algo, what)
    c.check()


def test_fp8_ties_and_boundaries_exactly() -> None:
    """y / scale exactly on e4m3 rounding ties (1.0625, 1.1875, 232, 1.5 * 2^-9 ...), on their
    float32 neighbours, on +-448, 456, 464 (the tie above 448) and 470, and on e4m3 subnormals.
    How: float32, x holds the values on rank 0 (zeros elsewhere), residual 0, weight 1, and
    eps = 2^50 swallows the mean of squares (below 2^17, far under half an ulp of 2^50: add.rn gives
    2^50 exactly), so rstd = 2^-25 exactly, y = v * 2^-25 exactly, and the scale 2^-25 gives back v."""
    r = 2
    c = comm(r)
    mags = [1.0625, 1.1875, 232.0, 448.0, 456.0, 464.0, 470.0, 3 * 2.0 ** -10, 2.0 ** -10, 1.5 * 2.0 ** -9,
            2.0 ** -9, 0.5 * 2.0 ** -9]
    vals = torch.tensor([m * s for m in mags for s in (1, -1)], dtype=torch.float32)
    vals = torch.cat([vals, torch.nextafter(vals, torch.full_like(vals, float("inf"))),
                      torch.nextafter(vals, torch.full_like(vals, float("-inf"))), torch.tensor([0.0, -0.0])])
    hidden = vals.numel()
    eps = 2.0 ** 50
    for algo in ALGOS:
        x0 = vals.view(1, hidden).to(DEV)
        xs = [x0, torch.zeros_like(x0)]
        res = [torch.zeros_like(x0) for _ in range(r)]
        w = [torch.ones(hidden, device=DEV) for _ in range(r)]
        scales = scale_tensors(r, 2.0 ** -25)
        ys, rs, qs = c.all_reduce_rmsnorm(xs, res, w, eps, algo, fp8_scale=scales[0])
        check(ys, rs, xs, res, w, eps, algo, f"fp8 ties {algo}")
        assert torch.equal(ys[0].cpu()[0] * 2.0 ** 25, vals), "the construction: y = v * 2^-25 exactly"
        check_fp8(ys, qs, scales, xs, res, w, eps, algo, f"fp8 ties {algo}")
        got = qs[0].cpu().view(torch.uint8)[0, :4].tolist()
        assert got == [0x38, 0xB8, 0x3A, 0xBA], got  # 1.0625 -> 1.0, 1.1875 -> 1.25 (ties to even), signs kept
    c.check()


@pytest.mark.parametrize("r", [2, 4])
def test_fp8_and_plain_calls_interleaved_in_place(r: int) -> None:
    """FP8 and plain calls of one shape alternate on one communicator (separate plans and modules),
    with residual_out=residual and out=x; the plain calls return two results as before."""
    c = comm(r)
    gen = torch.Generator(device=DEV).manual_seed(130 + r)
    for k, (algo, dtype, (tokens, hidden)) in enumerate(itertools.product(ALGOS, DTYPES, ((4, 1000), (17, 8192)))):
        xs, res, w = inputs(r, tokens, hidden, dtype, gen)
        xs0, res0 = [x.clone() for x in xs], [t.clone() for t in res]
        scales = scale_tensors(r, 0.01 * (k + 1))
        ys, rs, qs = c.all_reduce_rmsnorm(xs, res, w, 1e-6, algo, out=xs, residual_out=res, fp8_scale=scales)
        assert all(a is b for a, b in zip(ys, xs, strict=True)) and all(a is b for a, b in zip(rs, res, strict=True))
        check(ys, rs, xs0, res0, w, 1e-6, algo, f"fp8 in place {algo} {dtype}")
        check_fp8(ys, qs, scales, xs0, res0, w, 1e-6, algo, f"fp8 in place {algo} {dtype}")
        plain = c.all_reduce_rmsnorm(xs0, res0, w, 1e-6, algo)
        assert len(plain) == 2
        check(plain[0], plain[1], xs0, res0, w, 1e-6, algo, f"plain after fp8 {algo} {dtype}")
    c.check()


@pytest.mark.parametrize("r", [2, 8])
def test_fp8_cuda_graph_reads_the_scale_at_every_replay(r: int) -> None:
    """A graph of FP8 calls (both protocols, every dtype) and plain ones; between replays the
    inputs AND the scales change in place: the copies follow the new scales (read on the device)."""
    c = comm(r)
    gen = torch.Generator(device=DEV).manual_seed(140 + r)
    shapes = [(1, 8192), (8, 4096), (3, 1000), (5, 7)]
    calls = []
    for k in range(24):
        tokens, hidden = shapes[k % len(shapes)]
        dtype = DTYPES[(k // 2) % 3]
        algo = ALGOS[k % len(ALGOS)]
        xs, res, w = inputs(r, tokens, hidden, dtype, gen)
        scales = scale_tensors(r, [0.01 * (j + 1) for j in range(r)])
        outs = [torch.empty_like(x) for x in xs]
        routs = [torch.empty_like(x) for x in xs]
        qouts = fp8_outputs(xs, k % 2)
        calls.append((algo, xs, res, w, scales, outs, routs, qouts))
    for algo, xs, res, w, scales, outs, routs, qouts in calls:  # compile and plan outside capture
        c.all_reduce_rmsnorm(xs, res, w, 1e-6, algo, out=outs, residual_out=routs, fp8_scale=scales, fp8_out=qouts)
        c.all_reduce_rmsnorm(xs, res, w, 1e-6, algo, out=outs, residual_out=routs)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for k, (algo, xs, res, w, scales, outs, routs, qouts) in enumerate(calls):
            c.all_reduce_rmsnorm(xs, res, w, 1e-6, algo, out=outs, residual_out=routs, fp8_scale=scales, fp8_out=qouts)
            if k % 3 == 0:
                extra = [torch.empty_like(x) for x in xs]
                c.all_reduce_rmsnorm(xs, res, w, 1e-6, algo, out=extra, residual_out=[torch.empty_like(x) for x in xs])
    for replay in range(3):
        for _algo, xs, res, _w, scales, _outs, _routs, qouts in calls:
            for t in xs:
                t.copy_(torch.randn(t.shape, device=DEV, generator=gen).to(t.dtype))
            fresh = torch.randn(res[0].shape, device=DEV, generator=gen).to(res[0].dtype)
            for t in res:
                t.copy_(fresh)
            for j, s in enumerate(scales):
                s.fill_((0.003, 0.5, 40.0)[replay] * (j + 1))  # in place: the captured pointer, a new value
            for q in qouts:
                q.view(torch.uint8).fill_(POISON_BYTE)
        g.replay()
        torch.cuda.synchronize()
        for k, (algo, xs, res, w, scales, outs, routs, qouts) in enumerate(calls):
            what = f"fp8 graph replay {replay} call {k}"
            check(outs, routs, xs, res, w, 1e-6, algo, what)
            check_fp8(outs, qouts, scales, xs, res, w, 1e-6, algo, what)
    c.check()


@pytest.mark.parametrize("algo", algos("oneshot_ll", "twoshot_sentinel", "unfused"))
def test_fp8_torch_compile_keeps_the_op(algo: str) -> None:
    r = 2
    c = comm(r)

    def f(a: torch.Tensor, b: torch.Tensor, res: torch.Tensor, w: torch.Tensor, s: torch.Tensor):
        ys, rs, qs = c.all_reduce_rmsnorm([a * 2, b * 2], [res, res], w, 1e-5, algo, fp8_scale=s)
        return ys[0] + rs[1], qs[1]

    cf = torch.compile(f, fullgraph=True)
    gen = torch.Generator(device=DEV).manual_seed(150)
    a, b, res = (torch.randn(4, 1000, device=DEV, generator=gen) for _ in range(3))
    w = torch.randn(1000, device=DEV, generator=gen)
    s = torch.tensor([0.02], device=DEV)
    out, q = cf(a, b, res, w, s)
    y, r_ = rmsnorm.algo_reference(algo, [a * 2, b * 2], res, w, 1e-5)
    assert_bitwise(out.cpu(), y + r_, f"fp8 torch.compile {algo}")
    assert q.dtype == FP8 and torch.equal(q.cpu().view(torch.uint8), rmsnorm.fp8_reference(y, s).view(torch.uint8))


def test_fp8_fault_poisons_the_copy_too() -> None:
    r = 4
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=0.3)
    gen = torch.Generator(device=DEV).manual_seed(160)
    for algo in ALGOS:
        xs, res, w = inputs(r, 20, 8192, torch.bfloat16, gen)
        scales = scale_tensors(r, 0.01)
        want = [rmsnorm.fp8_reference(rmsnorm.algo_reference(algo, xs, res[k], w[k], 1e-6)[0], scales[k]).view(torch.uint8)
                for k in range(r)]
        testing.inject(c, absent=2)
        qouts = fp8_outputs(xs)
        c.all_reduce_rmsnorm(xs, res, w, 1e-6, algo, fp8_scale=scales, fp8_out=qouts)
        with pytest.raises(sollat.PeerTimeoutError):
            c.check()
        for k in (0, 1, 3):  # the absent rank returned at once and wrote nothing
            got = qouts[k].cpu().view(torch.uint8)
            nan = got == abi.FP8_E4M3_NAN
            assert bool((nan | (got == want[k])).all()), f"{algo}: rank {k} wrote a byte that is neither NaN nor exact"
            assert bool(nan.any()), f"{algo}: rank {k}'s copy shows no sign of the fault"
        with pytest.raises(sollat.CommunicatorFaultedError):
            c.all_reduce_rmsnorm(xs, res, w, 1e-6, algo, fp8_scale=scales)
        testing.clear(c)
        c.reset()
        ys, rs, qs = c.all_reduce_rmsnorm(xs, res, w, 1e-6, algo, fp8_scale=scales)
        check_fp8(ys, qs, scales, xs, res, w, 1e-6, algo, f"fp8 {algo} after reset")


def test_fp8_bad_arguments_raise_clear_errors() -> None:
    c = comm(2)
    x = torch.randn(3, 16, device=DEV, dtype=torch.bfloat16)
    w = torch.ones(16, device=DEV, dtype=torch.bfloat16)
    with pytest.raises(sollat.UnsupportedError, match="must be one torch.float32 element"):
        c.all_reduce_rmsnorm([x] * 2, [x] * 2, w, fp8_scale=torch.ones(1, device=DEV, dtype=torch.bfloat16))
    with pytest.raises(sollat.UnsupportedError, match="must be one torch.float32 element"):
        c.all_reduce_rmsnorm([x] * 2, [x] * 2, w, fp8_scale=torch.ones(2, device=DEV))
    with pytest.raises(sollat.UnsupportedError, match=r"fp8_scale\[0\] is on cpu"):
        c.all_reduce_rmsnorm([x] * 2, [x] * 2, w, fp8_scale=torch.ones(1))
    with pytest.raises(sollat.UnsupportedError, match="expected"):
        c.all_reduce_rmsnorm([x] * 2, [x] * 2, w, fp8_scale=torch.ones(1, device=DEV),
                             fp8_out=[torch.empty(3, 16, device=DEV, dtype=torch.uint8)] * 2)
    with pytest.raises(sollat.UnsupportedError, match="without fp8_scale"):
        c.all_reduce_rmsnorm([x] * 2, [x] * 2, w, fp8_out=[torch.empty(3, 16, device=DEV, dtype=FP8)] * 2)
    c.check()


# ---- the epilogue alone (rmsnorm_epilogue.add_rmsnorm) and its one launch for every rank -------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_epilogue_alone_is_the_reference_on_one_gpu(dtype: torch.dtype) -> None:
    """kernels/add_rmsnorm.cu on its own: rmsnorm.reference([x], ...) bit for bit, with the FP8 copy
    (fp8_reference), in place (out=x, residual_out=residual), at decode shapes (one pass), rows of
    several passes (hidden 16385 in 16-bit types, 9000 in fp32), odd rows and 2-byte-offset views
    (the per-line path), adversarial values, and rows past the grid (70000 rows of 7)."""
    gen = torch.Generator(device=DEV).manual_seed(900 + DTYPES.index(dtype))
    scale = torch.tensor([0.0173], device=DEV)
    wide = 9000 if dtype == torch.float32 else 16385
    for rows, hidden in ((1, 4096), (3, 5120), (64, 8192), (2, 7), (5, wide), (512, 4096), (70000, 7)):
        for offset in (0, 1):
            flat = [torch.randn(rows * hidden + offset, device=DEV, generator=gen).to(dtype) for _ in range(2)]
            x, res = (t[offset:].view(rows, hidden) for t in flat)
            if rows <= 64:
                x[0], res[0] = adversarial(1, 1, hidden, dtype, gen)[0][0][0], x[0].flip(0)
            w = (1 + 0.1 * torch.randn(hidden, device=DEV, generator=gen)).to(dtype)
            what = f"epilogue {dtype} {rows}x{hidden} offset {offset}"
            want_y, want_r = rmsnorm.reference([x], res, w, 1e-6)
            y, r, q = rmsnorm_epilogue.add_rmsnorm(x, res, w, 1e-6, fp8_scale=scale)
            assert_bitwise(r.cpu(), want_r, what + " residual_out")
            assert_bitwise(y.cpu(), want_y, what + " y")
            assert torch.equal(q.cpu().view(torch.uint8), rmsnorm.fp8_reference(want_y, scale).view(torch.uint8)), what
            y2, r2 = rmsnorm_epilogue.add_rmsnorm(x, res, w, 1e-6, out=x, residual_out=res)  # in place
            assert y2 is x and r2 is res
            assert_bitwise(r2.cpu(), want_r, what + " in place residual_out")
            assert_bitwise(y2.cpu(), want_y, what + " in place y")
    torch.cuda.synchronize()


@pytest.mark.parametrize("variant", [rmsnorm_epilogue.Variant(2), rmsnorm_epilogue.Variant(1, True),
                                     rmsnorm_epilogue.Variant(4, True)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_epilogue_variants_are_the_reference(variant: rmsnorm_epilogue.Variant, dtype: torch.dtype) -> None:
    """The epilogue's A/B builds (fewer slots per thread: more warps and passes; the power-of-two
    mean as a multiply) give the default's bits on every case of the test above."""
    with rmsnorm_epilogue.variant(variant):
        test_epilogue_alone_is_the_reference_on_one_gpu(dtype)


@pytest.mark.parametrize("r", [2, 8])
def test_unfused_epilogue_serves_every_rank_in_one_launch_under_a_graph(r: int) -> None:
    """unfused with each rank's own residual, weight and outputs (the rank table), eager and in a
    CUDA graph replayed on new inputs; and a rank's output shared with another rank's tensors is
    refused (one launch writes all ranks' outputs while each reads its own inputs)."""
    c = comm(r)
    gen = torch.Generator(device=DEV).manual_seed(950 + r)
    xs, res, w = inputs(r, 16, 5120, torch.bfloat16, gen, distinct=True)
    outs = [torch.full_like(x, float("nan")) for x in xs]
    routs = [torch.full_like(x, float("nan")) for x in xs]
    c.all_reduce_rmsnorm(xs, res, w, 1e-6, "unfused", out=outs, residual_out=routs)
    check(outs, routs, xs, res, w, 1e-6, "unfused", f"unfused R={r} eager")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c.all_reduce_rmsnorm(xs, res, w, 1e-6, "unfused", out=outs, residual_out=routs)
    fresh, fres, _ = inputs(r, 16, 5120, torch.bfloat16, gen, distinct=True)
    for dst, src in zip(xs + res, fresh + fres, strict=True):
        dst.copy_(src)
    for t in outs + routs:
        t.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    check(outs, routs, xs, res, w, 1e-6, "unfused", f"unfused R={r} graph replay")
    shared = [res[0]] * r
    with pytest.raises(sollat.UnsupportedError, match="share memory"):
        c.all_reduce_rmsnorm(xs, shared, w, 1e-6, "unfused", residual_out=shared)
    with pytest.raises(sollat.UnsupportedError, match="share memory"):
        c.all_reduce_rmsnorm(xs, res, w, 1e-6, "unfused", out=[outs[0]] * r)
    c.check()


# ---- row geometries that leave warps or blocks without a line ----------------------------------
# The cut rounds threads up to whole warps, so a row cluster's last block can get a warp's worth of
# lines or none (rmsnorm.row_exchange: 2880 bf16 on LL leaves warp 5 of block 3 empty, 5376 bf16
# on LL block 7 of 8; the sentinel and fp32 cuts have their own); those warps and blocks leave
# the kernel at entry, and every warp that waits on a block's row phase stores into every
# receiving block in every row (csrc/kernels/allreduce_rmsnorm.cu, "Row exchange"). A cluster
# reuses its row buffers (two parities) from its third row on, which the algorithms' 32 blocks
# never give a cluster (one row cluster per row up to 32 blocks): a cap of 8 or 4 blocks per
# rank does, at the row counts that keep clusters (up to 16 rows); the fused algorithms' blocks
# are capped here through the virtual communicator's block cap.
GEOMETRY_HIDDEN = [2880, 5376, 6144, 7168]
GEOMETRY_ROWS = [1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 17, 33, 64, 129, 512]
GEOMETRY_REPEATS = 3  # back-to-back calls of one shape (each with fresh inputs), checked after all
FUSED = [a for a in ALGOS if a != rmsnorm.UNFUSED]


def capped_comm(r: int, cap: int | None, monkeypatch: pytest.MonkeyPatch, timeout_s: float = 2.0
                ) -> sollat.VirtualCommunicator:
    """A virtual communicator whose fused regions (and AllReduce blocks) hold at most ``cap``
    blocks per rank (None: the default)."""
    if cap is None:
        return comm(r)
    with monkeypatch.context() as m:
        m.setattr(layout, "virtual_block_cap", lambda world, sms: cap)
        return sollat.VirtualCommunicator(r, DEV, timeout_s=timeout_s)


def _reuses_a_row_buffer(algo: str, dtype: torch.dtype, rows: int, hidden: int, r: int, cap: int) -> bool:
    """Whether the cut at ``cap`` blocks per rank gives some cluster (of more than one block) three
    rows or more (the kernel's geometry, as the plan makes it before the occupancy check)."""
    alg = algorithms.RMSNORM_ALGORITHMS[rmsnorm.internal_name(algo)]
    dt = dtypes.DTYPES[dtype]
    g = rmsnorm.row_geometry(alg, dt, rows, hidden, r, cap)
    if g.row_blocks > cap:
        g = rmsnorm.row_geometry(alg, dt, rows, hidden, r, cap, widest_blocks=cap)
    return g.row_blocks > 1 and rows > 2 * (g.blocks // g.row_blocks)


@pytest.mark.parametrize("r", [2, 3, 4, 8])
@pytest.mark.parametrize("cap", [None, 8, 4], ids=["blocks-default", "blocks-8", "blocks-4"])
@pytest.mark.parametrize("algo", FUSED)
def test_row_geometries_with_empty_warps_and_reused_row_buffers(r: int, cap: int | None, algo: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """hidden 2880, 5376, 6144, 7168 (bf16, and fp32 where its cut leaves warps empty too) at 1 to
    512 rows: every call's y and residual_out bitwise rmsnorm.reference on every rank, outputs
    poisoned first, GEOMETRY_REPEATS calls of each shape back to back (fresh inputs each) before
    any is checked, so that a block the scheduler holds back meets its siblings rows ahead."""
    c = capped_comm(r, cap, monkeypatch)
    gen = torch.Generator(device=DEV).manual_seed(zlib.crc32(f"geometry|{r}|{cap}|{algo}".encode()))
    reused = 0
    for hidden, dtype in itertools.product(GEOMETRY_HIDDEN, (torch.bfloat16, torch.float32)):
        if dtype == torch.float32 and hidden not in (2880, 5376):
            continue
        for rows in GEOMETRY_ROWS:
            if rows > 16 and (cap is not None or dtype != torch.bfloat16):
                continue  # no row cluster above 16 rows: the default blocks and bf16 cover it
            reused += cap is not None and _reuses_a_row_buffer(algo, dtype, rows, hidden, r, cap)
            pending = []
            for _ in range(GEOMETRY_REPEATS if rows <= 16 else 1):
                xs, res, w = inputs(r, rows, hidden, dtype, gen)
                outs, routs = poisoned_like(xs), poisoned_like(res)
                c.all_reduce_rmsnorm(xs, res, w, 1e-6, algo, out=outs, residual_out=routs)
                pending.append((outs, routs, xs, res, w))
            for k, (outs, routs, xs, res, w) in enumerate(pending):
                check(outs, routs, xs, res, w, 1e-6, algo, f"{algo} R={r} cap={cap} {dtype} {rows}x{hidden} call {k}")
    c.check()
    clustered = rmsnorm.geometry(algo, torch.bfloat16, 1, 4096, r).row_blocks > 1  # one block per row: no cluster
    assert cap is None or not clustered or reused >= 5, f"only {reused} shapes reuse a row buffer in a cluster"


@pytest.mark.parametrize("algo", FUSED)
def test_a_timeout_names_the_absent_peer_where_warps_or_blocks_hold_no_line(algo: str) -> None:
    """An absent rank (the first, a middle one, the last) at cuts that leave warps or whole blocks
    without a line: every rank raises PeerTimeoutError naming the absent rank, never the rank that
    detected it (a block's wait for its siblings must not time out before their receives, which
    know the peer), and the communicator computes right again after reset()."""
    r = 4
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=0.3)
    gen = torch.Generator(device=DEV).manual_seed(zlib.crc32(f"late peer|{algo}".encode()))
    for (hidden, dtype, rows), absent in itertools.product(
            ((2880, torch.bfloat16, 1), (5376, torch.bfloat16, 3), (2880, torch.float32, 2), (5376, torch.float32, 1)),
            (0, 2, 3)):
        what = f"{algo} {dtype} {rows}x{hidden} rank {absent} absent"
        xs, res, w = inputs(r, rows, hidden, dtype, gen)
        c.all_reduce_rmsnorm(xs, res, w, 1e-6, algo)  # planned and compiled before the fault
        c.check()
        testing.inject(c, absent=absent)
        outs, routs = poisoned_like(xs), poisoned_like(res)
        c.all_reduce_rmsnorm(xs, res, w, 1e-6, algo, out=outs, residual_out=routs)
        with pytest.raises(sollat.PeerTimeoutError) as ei:
            c.check()
        err = ei.value
        if algo == "twoshot_sentinel":  # may name a row's owner instead (algorithms.py: why it is experimental)
            assert err.peer != err.rank and err.rank != absent, f"{what}: {err}"
        else:
            assert err.peer == absent and err.rank != absent, f"{what}: {err}"
        testing.clear(c)
        c.reset()
        ys, rs = c.all_reduce_rmsnorm(xs, res, w, 1e-6, algo)
        check(ys, rs, xs, res, w, 1e-6, algo, f"{what}, after reset")
    c.check()
