"""Batch invariance without a GPU: the arithmetic of ``all_reduce_rmsnorm`` (``rmsnorm.reference``)
is one geometry-free function, a host model of the kernels' evaluation order gives its bits for
every launch geometry, the kernels are written with the shared helpers, and the batch-invariant
mode's rules (selection, refusals, the environment variable, the setup agreement).

The GPU side (every algorithm and switch point, bitwise across batch sizes) is
tests/gpu/test_batch_invariance.py."""

from __future__ import annotations

import inspect
import itertools
import math
import re
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

import sollat
from sollat.collectives import algorithms, rmsnorm, select
from sollat.collectives.validate import BATCH_INVARIANT_ENV, checked_batch_invariant
from sollat.comm import agree
from sollat.comm import gather_scatter_calls as gs
from sollat.comm.ranks import RealRanks
from sollat.comm.real import Communicator, VirtualCommunicator
from sollat.device import abi, abi_header, build, layout
from sollat.device.dtypes import DTYPES, OPS

from ._ranks import on_threads
from .test_host_logic import fake_virtual

F32 = torch.float32
WARP = layout.WARP


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal, or both NaN (NaN payloads are not part of the arithmetic)."""
    return bool(((bits(a) == bits(b)) | (torch.isnan(a) & torch.isnan(b))).all())


def special_rows(hidden: int, rows: int, seed: int) -> torch.Tensor:
    """float32 rows mixing normal values, huge ones (squares overflow to +Inf), denormals (squares
    underflow to +0), signed zeros, infinities and NaNs; row 0 plain randn, the last all specials."""
    gen = torch.Generator().manual_seed(seed)
    v = torch.randn(rows, hidden, generator=gen) * torch.exp2(torch.randint(-30, 30, (rows, hidden), generator=gen)
                                                              .float())
    specials = torch.tensor([0.0, -0.0, 1e-40, -3e-39, 3e38, -2e30, float("inf"), float("-inf"), float("nan")])
    pick = torch.rand(rows, hidden, generator=gen) < 0.1
    pick[0] = False
    pick[-1] = True
    v[pick] = specials[torch.randint(0, len(specials), (rows, hidden), generator=gen)][pick]
    return v


# ---- the reference: properties ------------------------------------------------------------------
def test_adding_positive_zero_changes_no_bit_of_a_square() -> None:
    """What the zero padding rests on: x + (+0) == x bitwise for every float32 x >= +0 (denormals,
    the largest finite, +Inf included) and NaN + 0 is a NaN; squares are never -0 ((-0)^2 = +0),
    the one value for which it fails (-0 + +0 = +0)."""
    gen = torch.Generator().manual_seed(1)
    pos = torch.randint(0, 0x7F800001, (20000,), generator=gen, dtype=torch.int64).to(torch.int32).view(F32)
    edge = torch.tensor([0.0, 1e-45, 1.1754942e-38, 1.1754944e-38, 3.4028235e38, float("inf")])
    x = torch.cat([pos, edge])
    assert bool((x >= 0).all())
    assert torch.equal(bits(x + torch.zeros_like(x)), bits(x)) and torch.equal(bits(torch.zeros_like(x) + x), bits(x))
    nan = torch.tensor([float("nan")])
    assert bool(torch.isnan(nan + 0.0).all()) and bool(torch.isnan(0.0 + nan).all())
    neg0 = torch.tensor([-0.0])
    assert bits(neg0 * neg0).item() == 0 and bits(neg0 + 0.0).item() == 0 != bits(neg0).item()
    squares = special_rows(257, 4, 2) ** 2
    assert bool(((squares >= 0) | torch.isnan(squares)).all()) and not bool((bits(squares) < 0).any())


@pytest.mark.parametrize("hidden", [1, 2, 3, 7, 64, 1000, 4095, 4096, 5121, 8192])
def test_sum_of_squares_is_the_same_tree_zero_padded_to_any_power_of_two(hidden: int) -> None:
    v = special_rows(hidden, 6, hidden)
    base = rmsnorm.sum_of_squares(v)
    assert base.shape == (6,) and base.dtype == F32
    for width in (rmsnorm.next_pow2(hidden) * 2 ** k for k in range(4)):
        assert same(rmsnorm.sum_of_squares(v, width), base), width
    assert bool(torch.isnan(base[-1])) or bool(torch.isinf(base[-1])) or hidden < 4
    with pytest.raises(ValueError, match="power of two"):
        rmsnorm.sum_of_squares(v, rmsnorm.next_pow2(hidden) * 3 if hidden > 1 else 3)
    if hidden > 1:
        with pytest.raises(ValueError, match="power of two"):
            rmsnorm.sum_of_squares(v, rmsnorm.next_pow2(hidden) // 2)


def _tree(sq: torch.Tensor) -> torch.Tensor:
    while sq.shape[-1] > 1:
        sq = sq[..., 0::2] + sq[..., 1::2]
    return sq[..., 0]


def test_sum_of_squares_is_a_pairwise_tree_not_a_running_sum() -> None:
    """The order is the one stated: a hand-built pairwise tree over 8 squares matches, and a
    left-to-right sum of the same squares does not (for inputs where order shows)."""
    gen = torch.Generator().manual_seed(3)
    v = torch.randn(200, 8, generator=gen) * torch.exp2(torch.randint(-12, 12, (200, 8), generator=gen).float())
    sq = v * v
    by_hand = ((sq[:, 0] + sq[:, 1]) + (sq[:, 2] + sq[:, 3])) + ((sq[:, 4] + sq[:, 5]) + (sq[:, 6] + sq[:, 7]))
    assert torch.equal(bits(rmsnorm.sum_of_squares(v)), bits(by_hand))
    running = torch.zeros(200)
    for e in range(8):
        running = running + sq[:, e]
    assert not torch.equal(bits(running), bits(by_hand))


def test_reference_takes_no_geometry_and_is_every_algorithm_s() -> None:
    """ONE reference for every algorithm (the GPU tests call rmsnorm.reference / algo_reference):
    no geometry, no world size in its signature, and algo_reference gives the same bits whatever
    the algorithm name (an unknown name is an error, not a silent default)."""
    assert list(inspect.signature(rmsnorm.reference).parameters) == ["xs", "residual", "weight", "eps"]
    gen = torch.Generator().manual_seed(4)
    for dtype in rmsnorm.DTYPES_SUPPORTED:
        xs = [torch.randn(3, 1000, generator=gen).to(dtype) for _ in range(3)]
        res = torch.randn(3, 1000, generator=gen).to(dtype)
        w = torch.randn(1000, generator=gen).to(dtype)
        y, r = rmsnorm.reference(xs, res, w, 1e-6)
        for algo in rmsnorm.PUBLIC_ALGOS:
            ya, ra = rmsnorm.algo_reference(algo, xs, res, w, 1e-6)
            assert torch.equal(bits(ya), bits(y)) and torch.equal(bits(ra), bits(r)), algo
    with pytest.raises(sollat.UnsupportedError, match="unknown algorithm"):
        rmsnorm.algo_reference("ll128", xs, res, w, 1e-6)


@pytest.mark.parametrize("dtype", rmsnorm.DTYPES_SUPPORTED, ids=str)
def test_reference_row_is_independent_of_the_batch(dtype: torch.dtype) -> None:
    """Row 0's bits from the reference of a batch of 1 and of larger batches: equal (the reference
    itself is row-wise; a batch-dependent step would show here)."""
    gen = torch.Generator().manual_seed(5)
    xs = [torch.randn(70, 517, generator=gen).to(dtype) for _ in range(4)]
    res = torch.randn(70, 517, generator=gen).to(dtype)
    w = torch.randn(517, generator=gen).to(dtype)
    y1, r1 = rmsnorm.reference([x[:1] for x in xs], res[:1], w, 1e-5)
    for b in (2, 3, 17, 70):
        yb, rb = rmsnorm.reference([x[:b] for x in xs], res[:b], w, 1e-5)
        assert torch.equal(bits(yb[:1]), bits(y1)) and torch.equal(bits(rb[:1]), bits(r1)), b


def test_reference_special_values() -> None:
    """NaN anywhere in a row: y all NaN; +-Inf: rstd 0, so the Inf elements NaN and the rest +-0;
    a sum of -0s stays -0 in residual_out; denormals survive both roundings; squares that overflow
    make ss +Inf (y zeros of the signs of r * w)."""
    x = torch.tensor([[1.0, float("nan"), 2.0], [float("inf"), 1.0, -1.0], [-0.0, -0.0, -0.0], [1e-40, 0, 0],
                      [3e38, 3e38, 1.0]])
    neg0 = torch.full_like(x, -0.0)
    y, r = rmsnorm.reference([x, neg0], neg0, torch.ones(3), 1e-6)
    assert torch.isnan(y[0]).all()
    assert torch.isnan(y[1, 0]) and bits(y[1, 1:]).tolist() == [0, bits(torch.tensor(-0.0)).item()]
    assert torch.equal(bits(r[2]), bits(torch.full((3,), -0.0)))
    assert r[3, 0].item() == pytest.approx(1e-40, rel=1e-3)
    assert y[4].tolist() == [0.0, 0.0, 0.0] and rmsnorm.sum_of_squares(r[4:5].float()).item() == math.inf


# ---- a host model of the kernels' order: the same bits for every geometry ------------------------
def _butterfly(vals: torch.Tensor) -> torch.Tensor:
    """warp_tree_sum on [..., 32] lanes exactly as the shuffles run it: at step o lane l computes
    v[l] + v[l ^ o] (in that operand order); returns lane 0's value after checking every lane agrees."""
    lanes = torch.arange(WARP)
    o = 1
    while o < WARP:
        vals = vals + vals[..., lanes ^ o]
        o *= 2
    assert same(vals, vals[..., :1].expand_as(vals)), "every lane holds the same bits"
    return vals[..., 0]


def chunk_lines(geo: rmsnorm.RowGeometry) -> list[int]:
    """The first line of every chunk the kernel stores, by chunk index: the loops of
    allreduce_rmsnorm.cu (pass p, block j, slot i, warp; chunk_line) or add_rmsnorm.cu (pass, warp),
    keeping those that hold a line of the row. Checks that every chunk is written exactly once."""
    t, s, p, k = geo.threads, geo.slots, geo.passes, geo.row_blocks
    assert t % WARP == 0 and p * k * s * t >= geo.row_lines
    firsts = [pi * k * s * t + (j * s + i) * t + w * WARP
              for pi, j, i, w in itertools.product(range(p), range(k), range(s), range(t // WARP))]
    firsts = [f for f in firsts if f < geo.row_lines]
    assert sorted(f // WARP for f in firsts) == list(range(layout.ceil_div(geo.row_lines, WARP)))
    return sorted(firsts)


def quad_model(chunks: torch.Tensor) -> torch.Tensor:
    """rmsnorm_math.h's quad_tree_sum of [rows, n] chunk sums (n <= 128) as the kernels run it: lane
    l adds chunks 4l..4l+3 as (c0 + c1) + (c2 + c3) (zeros past n), the butterfly over offsets below
    ceil(n / 4), then lane 0's value."""
    rows, n = chunks.shape
    assert 1 <= n <= 4 * WARP
    lanes = torch.zeros(rows, 4 * WARP)
    lanes[:, :n] = chunks
    q = lanes.view(rows, WARP, 4)
    vals = (q[..., 0] + q[..., 1]) + (q[..., 2] + q[..., 3])
    idx, o = torch.arange(WARP), 1
    while o < layout.ceil_div(n, 4):
        vals = vals + vals[..., idx ^ o]
        o *= 2
    return vals[..., 0]


def kernel_model_ss(v: torch.Tensor, geo: rmsnorm.RowGeometry, combine: str = "chunk") -> torch.Tensor:
    """The sum of squares of kernels/allreduce_rmsnorm.cu (and, with unfused_geometry, of
    kernels/add_rmsnorm.cu) for launch geometry ``geo``: square_tree per pack of elems_per_line
    elements, warp_tree_sum per (pass, block, slot, warp) over its 32 packs (the chunk the kernel
    stores at index first_line / 32), then chunk_tree_sum (a butterfly over each group of 32 chunks,
    zeros past the last, then one over the group sums), or with ``combine="quad"`` quad_tree_sum
    (row_tree_sum's choice up to 128 chunks, in both kernels)."""
    rows, hidden = v.shape
    e = geo.elems_per_line
    firsts = chunk_lines(geo)
    padded = torch.zeros(rows, len(firsts) * WARP * e)
    padded[:, :hidden] = v
    sq = (padded * padded).view(rows, -1, e)
    w = 1
    while w < e:  # square_tree: s[i] += s[i + w] for i a multiple of 2w
        sq = sq.clone()
        sq[..., 0::2 * w] = sq[..., 0::2 * w] + sq[..., w::2 * w]
        w *= 2
    packs = sq[..., 0]
    index = torch.tensor([[f + lane for lane in range(WARP)] for f in firsts])  # [chunks, 32] lines
    chunks = _butterfly(packs[:, index])  # [rows, chunks]
    n = chunks.shape[1]
    if combine == "quad" and n <= 4 * WARP:
        return quad_model(chunks)
    assert n <= WARP * WARP  # kRmsnormMaxChunks
    groups = torch.zeros(rows, WARP * WARP)
    groups[:, :n] = chunks
    return _butterfly(_butterfly(groups.view(rows, WARP, WARP)))


def _geometries(dtype: torch.dtype) -> list[tuple[rmsnorm.RowGeometry, str]]:
    """Every distinct launch geometry of the fused algorithms (every world size template, batch,
    and a block limit as a virtual communicator's retry uses) and of the unfused epilogue, each with
    its kernel's combine of the chunk sums."""
    dt = DTYPES[dtype]
    seen: dict[tuple[rmsnorm.RowGeometry, str], None] = {}
    for hidden in (1, 7, 33, 1000, 2049, 4096, 5120, 8192, 12288, 16384, rmsnorm.MAX_HIDDEN):
        for rows in (1, 2, 3, 8, 64):
            for alg in algorithms.RMSNORM_ALGORITHMS.values():
                for r in (2, 4, 8):
                    seen[(rmsnorm.row_geometry(alg, dt, rows, hidden, r), "chunk")] = None
                    seen[(rmsnorm.row_geometry(alg, dt, rows, hidden, r, 3), "chunk")] = None
            seen[(rmsnorm.unfused_geometry(dt, rows, hidden), "quad")] = None
    return list(seen)


@pytest.mark.parametrize("dtype", rmsnorm.DTYPES_SUPPORTED, ids=str)
def test_the_kernels_order_gives_the_reference_bits_for_every_geometry(dtype: torch.dtype) -> None:
    """Every launch geometry row_geometry (every algorithm, world size, batch, block limit) and
    unfused_geometry can produce: the kernels' evaluation order (kernel_model_ss) gives exactly
    rmsnorm.sum_of_squares, on rows with NaN, +-Inf, overflowing squares, denormals and signed
    zeros, at a full last line and at an odd hidden size; so the fused and the unfused cut of any
    row give the same bits."""
    cuts = _geometries(dtype)
    geos = [g for g, _ in cuts]
    assert len(geos) > 20 and {g.row_blocks for g in geos} == {1, 2, 4, 8} and max(g.passes for g in geos) > 1
    assert {g.elems_per_line * DTYPES[dtype].size for g in geos} == {8, 16}  # LL packs and 16-byte lines
    quads = [g for g, c in cuts if c == "quad"]
    assert max(g.passes for g in quads) > 1 and {g.row_lines <= 4 * WARP * WARP for g in quads} == {True, False}
    rows: dict[int, torch.Tensor] = {}
    odd = 0
    for k, (geo, combine) in enumerate(cuts):
        e = geo.elems_per_line
        # a full last line, or (every other geometry) a row ending one element into its last line
        hidden = geo.row_lines * e if k % 2 or e == 1 else (geo.row_lines - 1) * e + 1
        odd += hidden % e != 0
        if hidden not in rows:  # the values as the kernels see them: r rounded to the dtype, then widened
            rows[hidden] = special_rows(hidden, 2, hidden).to(dtype).to(F32)
        v = rows[hidden]
        assert same(kernel_model_ss(v, geo, combine), rmsnorm.sum_of_squares(v)), (geo, combine, hidden)
    assert odd > len(cuts) // 3


def test_the_quad_combine_is_the_chunk_tree() -> None:
    """quad_tree_sum and chunk_tree_sum (rmsnorm_math.h) give the same bits for every chunk count
    up to 128, on chunk sums with NaN, +Inf, huge and denormal values; a left-to-right sum of the
    same chunks would not (the comparison can fail)."""
    gen = torch.Generator().manual_seed(11)
    specials = torch.tensor([float("nan"), float("inf"), 3e38, 1e-40, 0.0, 1.0])
    for n in range(1, 4 * WARP + 1):
        c = torch.rand(3, n, generator=gen) * 10.0 ** torch.randint(-30, 30, (3, n), generator=gen)
        c[0, torch.randint(0, n, (max(1, n // 8),), generator=gen)] = specials[torch.randint(0, 6, (1,))]
        groups = torch.zeros(3, WARP * WARP)
        groups[:, :n] = c
        want = _butterfly(_butterfly(groups.view(3, WARP, WARP)))
        assert same(quad_model(c), want), n
    c = torch.rand(8, 100, generator=gen) + 1.0
    running = torch.zeros(8)
    for i in range(100):
        running = running + c[:, i]
    assert not same(running, quad_model(c))


def test_the_old_per_thread_order_would_be_caught() -> None:
    """The comparison can fail: the order the fused kernel had before (a running sum per thread
    over its passes and slots, then a tree over 1024 threads) differs from the reference for a
    multi-pass geometry, while the model of the new order matches."""
    alg = algorithms.RMSNORM_ALGORITHMS["rmsnorm_oneshot_ll"]
    geo = rmsnorm.row_geometry(alg, DTYPES[F32], 64, 8192, 2)
    assert geo.passes * geo.slots > 1 and geo.row_blocks == 1
    v = torch.randn(4, 8192, generator=torch.Generator().manual_seed(9))
    e, t = geo.elems_per_line, geo.threads
    sq = (v * v).view(4, geo.passes, geo.slots, t, e)
    running = torch.zeros(4, t)
    for pi, i, el in itertools.product(range(geo.passes), range(geo.slots), range(e)):
        running = running + sq[:, pi, i, :, el]
    old = _tree(torch.cat([running, torch.zeros(4, 1024 - t)], 1))
    assert not same(old, rmsnorm.sum_of_squares(v))
    assert same(kernel_model_ss(v, geo), rmsnorm.sum_of_squares(v))


def test_chunk_bound_matches_the_largest_row() -> None:
    """abi.h's kRmsnormMaxHidden is rmsnorm.MAX_HIDDEN, and its largest row (8-byte LL packs of
    fp32) has exactly kRmsnormMaxChunks = 32 x 32 chunks: chunk_tree_sum covers every row."""
    assert rmsnorm.MAX_HIDDEN == abi.RMSNORM_MAX_HIDDEN
    assert f"kRmsnormMaxHidden = {rmsnorm.MAX_HIDDEN}" in abi_header.header_text()
    header = (build.INCLUDE_DIR / "sollat" / "rmsnorm_math.h").read_text()
    assert "constexpr int kRmsnormMaxChunks = kWarpSize * kWarpSize;" in header
    assert "kRmsnormMaxHidden / Pack<T, kBytes>::kElems / kWarpSize" in header
    smallest_pack = min(abi.PAYLOAD_BYTES[p] for p in ("ll", "sentinel"))
    assert layout.ceil_div(rmsnorm.MAX_HIDDEN * 4 // smallest_pack, WARP) == WARP * WARP


def test_both_kernels_use_the_shared_arithmetic() -> None:
    """A tripwire for splitting the fused and unfused arithmetic again: both kernels take r from
    rmsnorm_math.h's add_residual (the fused ones through residual_add: round the fp32 sum first)
    and ss from square_tree, warp_tree_sums and row_tree_sum; neither rounds a residual add of its
    own nor keeps a running sum of squares."""
    fused = build.kernel_source("allreduce_rmsnorm.cu")
    unfused = build.kernel_source("add_rmsnorm.cu")
    assert fused.count("residual_add<T>(") == 2  # the one-shot's and the two-shot's r
    assert unfused.count("add_residual<T>(") == 1
    for src in (fused, unfused):
        for helper in ("square_tree(", "warp_tree_sums(", "row_tree_sum("):
            assert helper in src, helper
        assert not re.search(r"from_acc<T>\(add_rn\(", src)  # a residual add outside the helper
        assert not re.search(r"ss = add_rn\(ss", src)  # the old running per-thread sum


# ---- batch-invariant mode: the flag ------------------------------------------------------------
@pytest.mark.parametrize(("env", "want"), [(None, False), ("", False), ("0", False), ("1", True), (" 1 ", True), (" ", False)])
def test_env_parsing(monkeypatch: pytest.MonkeyPatch, env: str | None, want: bool) -> None:
    if env is None:
        monkeypatch.delenv(BATCH_INVARIANT_ENV, raising=False)
    else:
        monkeypatch.setenv(BATCH_INVARIANT_ENV, env)
    assert checked_batch_invariant(None, "X") is want
    assert checked_batch_invariant(True, "X") is True and checked_batch_invariant(False, "X") is False  # over env


@pytest.mark.parametrize("env", ["2", "true", "yes", "1 1", "on", "01"])
def test_env_anything_else_is_an_error(monkeypatch: pytest.MonkeyPatch, env: str) -> None:
    monkeypatch.setenv(BATCH_INVARIANT_ENV, env)
    with pytest.raises(sollat.UnsupportedError, match=f"SOLLAT_BATCH_INVARIANT={re.escape(repr(env))} is not understood; it takes 0 or 1"):
        checked_batch_invariant(None, "X")
    with pytest.raises(sollat.UnsupportedError, match="SOLLAT_BATCH_INVARIANT"):
        VirtualCommunicator(2, batch_invariant=None)  # before any GPU is looked for


@pytest.mark.parametrize("value", [1, 0, "1", "True", 1.0])
def test_the_argument_must_be_a_bool_or_none(value: Any) -> None:
    with pytest.raises(sollat.UnsupportedError, match="batch_invariant must be True, False or None"):
        checked_batch_invariant(value, "X")
    with pytest.raises(sollat.UnsupportedError, match="VirtualCommunicator: batch_invariant must be"):
        VirtualCommunicator(2, batch_invariant=value)
    with pytest.raises(sollat.UnsupportedError, match="Communicator: batch_invariant must be"):
        Communicator(batch_invariant=value)  # before torch.distributed is looked at


def test_the_attribute_defaults_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BATCH_INVARIANT_ENV, raising=False)
    assert checked_batch_invariant(None, "Communicator") is False  # what both constructors store
    assert fake_virtual(2).batch_invariant is False


# ---- batch-invariant mode: selection -------------------------------------------------------------
def _shipped_tables() -> list[select.Table]:
    return [select.load_table(f) for f in sorted(select.TUNING_DIR.glob("*.json"))]


def _sizes(table: select.Table) -> list[int]:
    out = {1, 2, 4, 6, 128 << 20}
    for rule in table.rules:
        out |= {max(1, rule.max_bytes - 2), rule.max_bytes, rule.max_bytes + 2, rule.max_bytes * 4}
    return sorted(out)


_WITH_LIBRARIES = select.Table("NVIDIA H200", 2, (select.Rule(64, "ll128"), select.Rule(4096, "nccl"),
                                                  select.Rule(1 << 20, "torch_twoshot"),
                                                  select.Rule(4 << 20, "ll128"), select.Rule(8 << 20, "twoshot_bulk"),
                                                  select.Rule(16 << 20, "nccl")), mode="real", source="test")


@pytest.mark.parametrize("table", [*_shipped_tables(), _WITH_LIBRARIES], ids=lambda t: t.source.split("/")[-1])
def test_choose_never_returns_a_library_path_or_a_nondeterministic_algorithm(table: select.Table) -> None:
    everything = frozenset(select.HANDOVERS)
    seen_library = False
    for nbytes, dtype, op, det in itertools.product(_sizes(table), DTYPES, OPS, (False, True)):
        got = select.choose(table, nbytes, dtype, op, deterministic=det, handovers=everything,
                            available=tuple(algorithms.ALGORITHMS), batch_invariant=True)
        assert got not in select.LIBRARY_PATHS and algorithms.get(got).deterministic, (nbytes, dtype, op, got)
        assert dtype in algorithms.get(got).dtypes and op in algorithms.get(got).ops
        plain = select.choose(table, nbytes, dtype, op, deterministic=det, handovers=everything,
                              available=tuple(algorithms.ALGORITHMS))
        seen_library |= plain in select.LIBRARY_PATHS
        if plain not in select.LIBRARY_PATHS and algorithms.get(plain).deterministic:
            assert got == plain  # where the table names a sollat rank-order algorithm, it is kept
    assert seen_library  # without the mode every table hands something over (past its end: NCCL)


def test_choose_raises_where_no_sollat_algorithm_serves() -> None:
    with pytest.raises(sollat.UnsupportedError, match="no algorithm serves"):
        select.choose(_WITH_LIBRARIES, 1 << 20, torch.float32, "sum", deterministic=False,
                      handovers=frozenset(select.HANDOVERS), available=("ll128",), batch_invariant=True)


def _fake_real(invariant: bool, table: select.Table = _WITH_LIBRARIES) -> Communicator:
    c = Communicator.__new__(Communicator)
    c._batch_invariant = invariant
    c.world_size = 4
    c._algos = tuple(algorithms.ALGORITHMS)
    c._choices = {}
    c._torch_twoshot = object()  # type: ignore[assignment]  # as if torch's two-shot buffer existed
    c._selection_table = lambda: table  # type: ignore[method-assign]
    return c


def test_a_batch_invariant_communicator_auto_stays_on_sollat(monkeypatch: pytest.MonkeyPatch) -> None:
    from sollat.collectives import handover

    monkeypatch.setattr(handover, "torch_twoshot_available", lambda world_size: True)
    on, off = _fake_real(True), _fake_real(False)
    assert on.handovers == () and set(off.handovers) == {"nccl", "torch_twoshot"}
    for nbytes in _sizes(_WITH_LIBRARIES):
        for symmetric in (False, True):
            got = on.selected_algorithm(nbytes, torch.float32, symmetric=symmetric)
            assert got not in select.LIBRARY_PATHS and algorithms.get(got).deterministic, (nbytes, got)
    assert off.selected_algorithm(16 << 20, torch.float32, symmetric=True) == select.TORCH_TWOSHOT_ZERO_COPY
    assert on._symmetric_path("twoshot_bulk", "auto", 16 << 20, torch.float32, "sum") == "twoshot_bulk"
    assert on._torch_twoshot_capacity(1 << 20) == 0  # no buffer for a path this mode never takes


@pytest.mark.parametrize("algo", ["nccl", "torch_twoshot", "torch_twoshot_zero_copy", "ll128"])
def test_forcing_a_library_path_or_ll128_raises(algo: str) -> None:
    c = _fake_real(True)
    with pytest.raises(sollat.UnsupportedError, match="batch-invariant") as ei:
        c._resolve(algo, 1 << 20, torch.float32, "sum", False)
    assert "auto" in str(ei.value) and "oneshot_ll" in str(ei.value)  # says what to use instead
    for ok in ("oneshot_ll", "oneshot_sentinel", "twoshot_ll", "twoshot_sentinel", "twoshot_bulk"):
        assert c._resolve(ok, 1 << 20, torch.float32, "sum", False) == ok
    assert _fake_real(False)._resolve(algo if algo != "torch_twoshot_zero_copy" else "nccl", 64, torch.float32,
                                      "sum", False)


def test_a_batch_invariant_virtual_communicator_never_runs_ll128() -> None:
    c = fake_virtual(4)
    c._batch_invariant = True
    c._table = select.Table("Fake GPU", 4, (select.Rule(1 << 30, "ll128"),), mode="virtual", source="t")
    for nbytes in (4, 1 << 20, 1 << 31):
        assert algorithms.get(c.selected_algorithm(nbytes, torch.bfloat16)).deterministic
    with pytest.raises(sollat.UnsupportedError, match="not deterministic.*batch-invariant"):
        c._resolve("ll128", 1024, torch.bfloat16, "sum", False)
    c._choices.clear()
    c._algos = ("ll128",)
    with pytest.raises(sollat.UnsupportedError, match="batch-invariant mode: no sollat algorithm"):
        c.selected_algorithm(1024, torch.bfloat16)
    off = fake_virtual(4)
    off._table = c._table
    assert off.selected_algorithm(1024, torch.bfloat16) == "ll128"  # the control: the table's choice


def test_the_rmsnorm_unfused_all_reduce_is_an_auto_call() -> None:
    """unfused's AllReduce is this communicator's all_reduce(auto, deterministic=True): in the mode,
    whatever selected_algorithm gives (never a library path, above)."""
    assert Communicator._all_reduce_rmsnorm_ranks is VirtualCommunicator._all_reduce_rmsnorm_ranks  # one definition
    src = inspect.getsource(Communicator._all_reduce_rmsnorm_ranks)
    assert src.count('_all_reduce_ranks(') == 1 and src.count('"sum", "auto", ys, True') == 1


# ---- batch-invariant mode: ReduceScatter and AllGather ----------------------------------------------
def _fake_gs(invariant: bool, enabled: bool = True) -> Any:
    c = Communicator.__new__(Communicator)
    c._batch_invariant = invariant
    c._gather_scatter = enabled
    c.world_size = 2
    c._ranks = RealRanks(0, torch.empty(0, dtype=torch.uint8))
    c._calls = {}
    c._agreement = agree.NoAgreement()
    c._kernels = SimpleNamespace(plan=lambda name, dt, op, n: name)  # the planned algorithm's name
    return c


def test_reduce_scatter_never_hands_over_in_the_mode() -> None:
    dt = DTYPES[torch.float32]
    big = (64 << 20) // 4  # elements: far above the real-rank size rule
    on, off = _fake_gs(True), _fake_gs(False)
    assert off._gs_plan("reduce_scatter", big, dt, "sum", "auto") == select.NCCL
    assert on._gs_plan("reduce_scatter", big, dt, "sum", "auto") == "reduce_scatter_sentinel"
    assert on._gs_plan("reduce_scatter", 64, dt, "sum", "auto") == off._gs_plan("reduce_scatter", 64, dt, "sum", "auto")
    with pytest.raises(sollat.UnsupportedError, match="reduce_scatter: algo='nccl'.*batch-invariant"):
        gs.check_args("reduce_scatter", "sum", "nccl", real=True, batch_invariant=True)
    gs.check_args("reduce_scatter", "sum", "nccl", real=True, batch_invariant=False)
    with pytest.raises(sollat.UnsupportedError, match="batch-invariant.*gather_scatter=False"):
        _fake_gs(True, enabled=False)._gs_plan("reduce_scatter", 64, dt, "sum", "auto")
    assert _fake_gs(False, enabled=False)._gs_plan("reduce_scatter", 64, dt, "sum", "auto") == select.NCCL


def test_all_gather_may_still_hand_over() -> None:
    """No arithmetic, so the library moves the same bits: allowed in the mode (documented)."""
    dt = DTYPES[torch.bfloat16]
    on = _fake_gs(True)
    gs.check_args("all_gather", "", "nccl", real=True, batch_invariant=True)
    assert on._gs_plan("all_gather", (64 << 20) // 2, dt, "", "auto") == select.NCCL


# ---- batch-invariant mode: the setup agreement --------------------------------------------------------
def test_ranks_that_differ_in_the_mode_all_raise_at_construction() -> None:
    from torch.distributed import HashStore

    store = HashStore()
    store.set_timeout(timedelta(seconds=5))
    table = select.find_table("generic", 2, mode="real")

    def make(rank: int, invariant: bool, seq: int) -> Communicator:
        c = Communicator.__new__(Communicator)
        c.timeout_s, c._algos, c.max_blocks, c._torch_twoshot_bytes = 30.0, ("oneshot_ll",), 16, 0
        c._batch_invariant = invariant
        c._collectives, c._gather_scatter, c._rmsnorm_twoshot, c._fused_blocks = {}, False, False, None
        c._agreement = agree.Agreement(store, "bi-setup", rank, 2, 5.0, seq=seq)
        c._selection_table = lambda: table  # type: ignore[method-assign]
        return c

    for seq, modes in enumerate(((False, False), (True, True))):
        comms = [make(r, modes[r], seq) for r in range(2)]
        assert on_threads(2, lambda r, cs=comms: cs[r]._agree_on_setup()) == [None, None]
    comms = [make(0, True, 2), make(1, False, 2)]
    res = on_threads(2, lambda r: comms[r]._agree_on_setup())
    assert all(isinstance(e, sollat.CallMismatchError) and "batch_invariant 1" in str(e) and "batch_invariant 0"
               in str(e) for e in res), res


def test_special_rows_cover_what_they_claim() -> None:
    v = special_rows(1000, 3, 0)
    assert not bool(torch.isnan(v[0]).any()) and bool(torch.isnan(v[-1]).any()) and bool(torch.isinf(v[-1]).any())
    assert bool((v.abs() < np.finfo(np.float32).tiny).any()) and bool((bits(v) == bits(torch.tensor(-0.0))).any())
