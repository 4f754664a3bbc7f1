"""GPU correctness of the one-shot (and any registered) all-reduce with virtual ranks.

Every check uses fresh random inputs, poisons outputs first, and compares bitwise with the
rank-order reference (the deterministic algorithms' contract).
"""

from __future__ import annotations

import itertools
import zlib

import pytest
import torch

import sollat
from sollat.collectives.algorithms import ALGORITHMS
from sollat.device import layout

from ._graphs import capture_and_replay
from ._reference import assert_bitwise, assert_within_sum_bound, random_inputs, rank_order_reduce

pytestmark = pytest.mark.gpu

DEV = torch.device("cuda", 0) if torch.cuda.is_available() else None
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def dtypes_of(algo: str) -> list[torch.dtype]:
    return [d for d in DTYPES if d in ALGORITHMS[algo].dtypes]
# The algorithms of 2..8 ranks, the world sizes of this file (the wide one-shot, 9..72 ranks, is
# tested in test_wide_groups.py).
NARROW = [a for a, alg in ALGORITHMS.items() if alg.runs_on(2) and alg.runs_on(8)]
DETERMINISTIC = [a for a in NARROW if ALGORITHMS[a].deterministic]
_comms: dict[int, sollat.VirtualCommunicator] = {}


def comm(r: int) -> sollat.VirtualCommunicator:
    if r not in _comms:
        _comms[r] = sollat.VirtualCommunicator(r, DEV, timeout_s=2.0)
    return _comms[r]


def check_call(c: sollat.VirtualCommunicator, xs: list[torch.Tensor], algo: str, op: str = "sum",
               outs: list[torch.Tensor] | None = None) -> None:
    if outs is not None:
        for o in outs:
            o.fill_(float("nan"))
    ys = c.all_reduce(xs, op=op, algo=algo, out=outs)
    check_result(ys, xs, algo, op)


def check_result(ys: list[torch.Tensor], xs: list[torch.Tensor], algo: str, op: str = "sum", what: str = "") -> None:
    """Bitwise against the rank-order reference for deterministic algorithms; the summation bound
    against a float64 sum (and identical results on every rank) otherwise."""
    tag = f"{what}{algo} R={len(xs)} {xs[0].dtype} n={xs[0].numel()} {op}"
    if ALGORITHMS[algo].deterministic:
        ref = rank_order_reduce(xs, op)
        for r, y in enumerate(ys):
            assert_bitwise(y, ref, f"{tag} rank {r}")
    else:
        for r, y in enumerate(ys):
            assert_within_sum_bound(y, xs, f"{tag} rank {r}")
            assert_bitwise(y, ys[0], f"{tag}: rank {r} differs from rank 0")


def _sizes_for(algo: str, r: int, dtype: torch.dtype) -> list[int]:
    alg = ALGORITHMS[algo]
    esize = torch.tensor([], dtype=dtype).element_size()
    per_line = alg.payload_bytes // esize
    # one pass of the largest plan (blocks x the kernel's threads x slots) in elements, to go past it
    one_pass = layout.MAX_BLOCKS_VIRTUAL * alg.max_threads * per_line * (r if alg.two_shot else 1)
    return [1, 2, 3, 7, 31, 32, 33, 100, 1000, 4097, 65537, 3 * one_pass + 5]


@pytest.mark.parametrize("r", [2, 4, 8])
@pytest.mark.parametrize("algo", NARROW)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sum_sizes(r: int, algo: str, dtype: torch.dtype) -> None:
    if dtype not in ALGORITHMS[algo].dtypes:
        with pytest.raises(sollat.UnsupportedError, match="does not support dtype"):
            comm(r).all_reduce(random_inputs(r, 8, dtype, DEV, torch.Generator(device=DEV)), algo=algo)
        return
    c = comm(r)
    gen = torch.Generator(device=DEV).manual_seed(zlib.crc32(f"{r}|{algo}|{dtype}".encode()))
    for n in _sizes_for(algo, r, dtype):
        xs = random_inputs(r, n, dtype, DEV, gen)
        outs = [torch.empty_like(x) for x in xs]
        check_call(c, xs, algo, "sum", outs)


@pytest.mark.parametrize("r", [2, 8])
@pytest.mark.parametrize("algo", DETERMINISTIC)
@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min(r: int, algo: str, op: str) -> None:
    c = comm(r)
    gen = torch.Generator(device=DEV).manual_seed(7)
    for dtype, n in itertools.product(DTYPES, [1, 33, 5000]):
        xs = random_inputs(r, n, dtype, DEV, gen)
        xs[0][0] = float("nan")
        check_call(c, xs, algo, op)


@pytest.mark.parametrize("algo", DETERMINISTIC)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_special_values(algo: str, dtype: torch.dtype) -> None:
    """NaN, +-Inf, -0.0, denormals, and the sentinel / canonical-NaN bit patterns as inputs."""
    r = 4
    c = comm(r)
    ib = {2: torch.int16, 4: torch.int32, 8: torch.int64}[torch.tensor([], dtype=dtype).element_size()]
    bits = {torch.int16: [-1, 0x7FC0, 0x7E00, 0x0001, -32768, 0x7C00],
            torch.int32: [-1, 0x7FC00000, 0x00000001, -(2**31), 0x7F800000],
            torch.int64: [-1, 0x7FF8000000000000, 1, -(2**63)]}[ib]
    specials = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0, 0.0], dtype=dtype)
    tiny = torch.finfo(dtype).tiny
    pattern = torch.cat([specials, torch.tensor([tiny / 4, -tiny / 8, tiny], dtype=dtype),
                         torch.tensor(bits, dtype=ib).view(dtype)]).to(DEV)
    gen = torch.Generator(device=DEV).manual_seed(3)
    for trial in range(6):
        xs = random_inputs(r, 257, dtype, DEV, gen)
        for k, x in enumerate(xs):
            idx = torch.randint(0, 257, (pattern.numel(),), device=DEV, generator=gen)
            x[idx] = pattern.roll(k + trial)
        # whole lines of sentinel bit patterns and of -0.0
        xs[1][:16] = torch.tensor(bits[0], dtype=ib).view(dtype)
        xs[2][16:32] = -0.0
        check_call(c, xs, algo, "sum")


@pytest.mark.parametrize("algo", DETERMINISTIC)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_every_bit_pattern(algo: str, dtype: torch.dtype) -> None:
    """Every 16-bit pattern (a random million for fp32, plus the NaN / Inf / sentinel edges) on
    each rank position: the sentinel's NaN canonicalisation and its empty-line test work on
    several elements per word at once, so every lane position meets every pattern."""
    if dtype not in ALGORITHMS[algo].dtypes:
        pytest.skip(f"{algo} does not support {dtype}")
    gen = torch.Generator(device=DEV).manual_seed(11)
    if dtype == torch.float32:
        edges = torch.tensor([0x7F800000, 0x7F800001, 0x7FBFFFFF, 0x7FC00000, 0x7FFFFFFF, -1, -2, -0x800000,
                              -0x7FFFFF, 0x00000001, -(2**31)], dtype=torch.int32, device=DEV)
        rand = torch.randint(-2**31, 2**31, (1 << 20,), generator=gen, device=DEV, dtype=torch.int64).to(torch.int32)
        bits = torch.cat([edges, rand])
    else:
        bits = torch.arange(-32768, 32768, dtype=torch.int32, device=DEV).to(torch.int16)
    every = bits.view(dtype)
    c = comm(2)
    for shift in (0, 1):  # each pattern in each lane of a 32-bit word, against random other patterns
        mine = every.roll(shift)
        other = every[torch.randperm(every.numel(), generator=gen, device=DEV)]
        for xs in ([mine.clone(), other.clone()], [other.clone(), mine.clone()]):
            for op in ("sum", "max"):
                check_call(c, xs, algo, op, [torch.empty_like(x) for x in xs])


@pytest.mark.parametrize("algo", NARROW)
def test_misaligned_views_and_non_contiguous(algo: str) -> None:
    r = 4
    c = comm(r)
    gen = torch.Generator(device=DEV).manual_seed(11)
    for dtype, off, n in itertools.product([torch.float32, torch.bfloat16], [1, 3], [5, 1000, 70001]):
        bufs = random_inputs(r, n + 8, dtype, DEV, gen)
        xs = [b[off:off + n] for b in bufs]
        obufs = [torch.full((n + 8,), float("nan"), dtype=dtype, device=DEV) for _ in range(r)]
        outs = [o[off + 1:off + 1 + n] for o in obufs]
        check_call(c, xs, algo, "sum", outs)
        for o in obufs:  # nothing outside the view was written
            assert torch.isnan(o[:off + 1]).all() and torch.isnan(o[off + 1 + n:]).all()
    # non-contiguous inputs are handled (copied); shapes are kept
    xs = [torch.randn(64, 33, device=DEV, generator=gen).t() for _ in range(r)]
    ys = c.all_reduce(xs, algo=algo)
    assert ys[0].shape == (33, 64)
    check_result(ys, [x.contiguous() for x in xs], algo, what="non-contiguous ")


@pytest.mark.parametrize("r", [2, 4, 8])
def test_in_place(r: int) -> None:
    c = comm(r)
    gen = torch.Generator(device=DEV).manual_seed(5)
    for algo in DETERMINISTIC:
        xs = random_inputs(r, 4099, torch.bfloat16, DEV, gen)
        ref = rank_order_reduce(xs, "sum")
        ys = c.all_reduce(xs, algo=algo, out=xs)
        for y in ys:
            assert_bitwise(y, ref, f"in place {algo}")


@pytest.mark.parametrize("cluster", [False, True], ids=["grid", "rank-clusters"])
@pytest.mark.parametrize("r", [3, 5, 8])
def test_rank_clusters_on_and_off(r: int, cluster: bool) -> None:
    """Both launch shapes of virtual ranks (rank clusters for small grids, a plain grid above),
    odd world sizes included, out of place and in place, up to several passes (the prefetch of
    the next pass must not read a line that this call already wrote)."""
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=2.0, cluster_ranks=cluster)
    assert c._fitting.clustered(1) is cluster and not c._fitting.clustered(16)
    gen = torch.Generator(device=DEV).manual_seed(100 + r)
    for algo in DETERMINISTIC:
        for n in (1, 33, 4097, 65537, _sizes_for(algo, r, torch.float32)[-1]):
            xs = random_inputs(r, n, torch.float32, DEV, gen)
            check_call(c, xs, algo, outs=[torch.empty_like(x) for x in xs])
            ref = rank_order_reduce(xs, "sum")
            for y in c.all_reduce(xs, algo=algo, out=xs):
                assert_bitwise(y, ref, f"in place {algo} R={r} n={n} cluster={cluster}")
    c.check()


@pytest.mark.parametrize("r", [2, 4, 8])
def test_back_to_back_eager_varying(r: int) -> None:
    """Thousands of eager calls of varying size and algorithm; inputs reused right after the call."""
    c = comm(r)
    gen = torch.Generator(device=DEV).manual_seed(r)
    sizes = [1, 5, 64, 300, 2048, 9000, 40000]
    algos = list(NARROW)
    calls = 3400 if r == 8 else 3300
    pending = []
    for k in range(calls):
        n = sizes[(k * 7 + k // 5) % len(sizes)]
        algo = algos[k % len(algos)]
        dtype = (torch.float32, torch.bfloat16)[k % 2]
        xs = random_inputs(r, n, dtype, DEV, gen)
        ys = c.all_reduce(xs, algo=algo)
        kept = [x.clone() for x in xs]
        for x in xs:  # overwrite inputs immediately: the call must not read them later
            x.fill_(float("nan"))
        pending.append((ys, kept, algo))
        if len(pending) >= 64:
            for ys_, xs_, a in pending:
                check_result(ys_, xs_, a, what=f"eager call {k} ")
            pending.clear()
    for ys_, xs_, a in pending:
        check_result(ys_, xs_, a, what="eager ")
    c.check()


@pytest.mark.parametrize("r", [2, 4, 8])
def test_cuda_graph_many_calls(r: int) -> None:
    """A graph of 1000 back-to-back calls of varying size, algorithm and dtype, replayed with fresh
    inputs: >= 10,000 calls checked per world size."""
    c = comm(r)
    gen = torch.Generator(device=DEV).manual_seed(100 + r)
    sizes = [1, 7, 128, 1000, 4097, 20000, 65536]
    algos = list(NARROW)
    calls = []
    for k in range(1000):
        n = sizes[(k * 3 + k // 7) % len(sizes)]
        dtype = (torch.float32, torch.bfloat16, torch.float16)[k % 3]
        xs = random_inputs(r, n, dtype, DEV, gen)
        outs = [torch.empty_like(x) for x in xs]
        calls.append((algos[(k // 3) % len(algos)], xs, outs))
    for algo, xs, outs in calls[:len(algos) * 4]:  # warm up: compile and plan outside capture
        c.all_reduce(xs, algo=algo, out=outs)
    torch.cuda.synchronize()

    def issue() -> None:
        for algo, xs, outs in calls:
            c.all_reduce(xs, algo=algo, out=outs)

    def check_replay(_replay: int) -> None:
        for k, (algo, xs, outs) in enumerate(calls):
            check_result(outs, xs, algo, what=f"graph call {k} ")

    capture_and_replay(issue, inputs=[x for _, xs, _ in calls for x in xs],
                       poisoned=[o for *_, outs in calls for o in outs], gen=gen, replays=10, check=check_replay)
    c.check()


def test_timeout_names_the_peer_and_gpu_recovers() -> None:
    r = 4
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=0.2)
    gen = torch.Generator(device=DEV).manual_seed(9)
    for algo in NARROW:
        xs = random_inputs(r, 1000, torch.float32, DEV, gen)
        c._set_test_hooks(absent=2)
        c.all_reduce(xs, algo=algo)
        with pytest.raises(sollat.PeerTimeoutError) as ei:
            c.check()
        # LL128 may time out on a line counter, which cannot name the missing rank
        assert ei.value.peer == 2 or (algo == "ll128" and ei.value.peer == -1), str(ei.value)
        with pytest.raises(sollat.CommunicatorFaultedError):
            c.all_reduce(xs, algo=algo)
        c._set_test_hooks()
        c.reset()
        check_call(c, xs, algo)  # the GPU and the communicator work again
    # the error is also raised by the next call without an explicit check()
    c._set_test_hooks(absent=1)
    c.all_reduce(random_inputs(r, 10, torch.float32, DEV, gen), algo="oneshot_ll")
    torch.cuda.synchronize()
    with pytest.raises(sollat.PeerTimeoutError):
        c.all_reduce(random_inputs(r, 10, torch.float32, DEV, gen), algo="oneshot_ll")
    c._set_test_hooks()
    c.reset()
    torch.cuda.synchronize()
    assert torch.ones(4, device=DEV).sum().item() == 4.0


def test_call_mismatch_is_reported() -> None:
    r = 4
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=0.5)
    gen = torch.Generator(device=DEV).manual_seed(10)
    xs = random_inputs(r, 100, torch.float32, DEV, gen)
    c._set_test_hooks(mismatch=3)
    with pytest.raises(sollat.CallMismatchError) as ei:
        c.all_reduce(xs, algo="oneshot_ll")  # raised by this call or by check(), whichever sees it
        c.check()
    assert 3 in (ei.value.peer, ei.value.rank)
    c._set_test_hooks()
    c.reset()
    check_call(c, xs, "oneshot_ll")


def test_small_epoch_space_wraps_correctly() -> None:
    """SOLLAT_EPOCH_BITS=2: epochs wrap every 4 calls; stale lines must still never be accepted."""
    r = 4
    c = sollat.VirtualCommunicator(r, DEV, timeout_s=2.0)
    c._extra_defines = {"SOLLAT_EPOCH_BITS": "2"}
    gen = torch.Generator(device=DEV).manual_seed(12)
    sizes = [3, 300, 5000, 70000, 300]
    for k in range(200):
        n = sizes[k % len(sizes)]
        xs = random_inputs(r, n, torch.float32, DEV, gen)
        check_call(c, xs, "oneshot_ll")
    c.check()


def test_torch_compile_keeps_the_op() -> None:
    r = 2
    c = comm(r)

    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ys = c.all_reduce([a * 2, b * 2], algo="oneshot_ll")
        return ys[0] + 1

    cf = torch.compile(f, fullgraph=True)
    a, b = torch.randn(1000, device=DEV), torch.randn(1000, device=DEV)
    out = cf(a, b)
    ref = rank_order_reduce([a * 2, b * 2], "sum") + 1
    assert_bitwise(out, ref, "torch.compile")


def test_bad_inputs_raise_clear_errors() -> None:
    c = comm(2)
    x = torch.randn(10, device=DEV)
    with pytest.raises(sollat.UnsupportedError, match="dtype"):
        c.all_reduce([x.int(), x.int()])
    with pytest.raises(sollat.UnsupportedError, match="op"):
        c.all_reduce([x, x], op="prod")
    with pytest.raises(sollat.UnsupportedError, match="cpu"):
        c.all_reduce([x.cpu(), x.cpu()])
    with pytest.raises(sollat.UnsupportedError, match="2 tensors"):
        c.all_reduce([x, x, x])
    with pytest.raises(sollat.UnsupportedError, match="same shape"):
        c.all_reduce([x, x[:5]])
    with pytest.raises(sollat.UnsupportedError, match="unknown algorithm"):
        c.all_reduce([x, x], algo="ring")
    with pytest.raises(sollat.UnsupportedError, match="nccl"):
        c.all_reduce([x, x], algo="nccl")
    with pytest.raises(sollat.UnsupportedError, match="world_size"):
        sollat.VirtualCommunicator(73, DEV)
