"""Fused AllReduce + residual add + RMSNorm without a GPU: argument checks, the fake (meta)
functions torch.compile uses, the row geometry, the host reference, and NVRTC compiles."""

from __future__ import annotations

import io
import math
import re
from fractions import Fraction

import numpy as np
import pytest
import torch

import sollat
from sollat import abi, algorithms, build, instantiations, layout, ops, registry, rmsnorm
from sollat.communicator import Communicator, VirtualCommunicator
from sollat.dtypes import DTYPES

CPU = torch.device("cpu")
CUDA = torch.device("cuda", 0)


def args(rows: int = 3, hidden: int = 8, dtype: torch.dtype = torch.bfloat16):
    return torch.zeros(rows, hidden, dtype=dtype), torch.zeros(rows, hidden, dtype=dtype), torch.ones(hidden, dtype=dtype)


def check(x, res, w, out=None, res_out=None, device=CPU):
    return rmsnorm.check_rank(x, res, w, out, res_out, device)


# ---- argument checks ----------------------------------------------------------------------------
def test_valid_call_allocates_outputs_and_reports_rows_and_hidden() -> None:
    x, res, w = args(3, 7)
    x2, r2, w2, y, r_out, dt, rows, hidden = check(x, res, w)
    assert (rows, hidden, dt.short) == (3, 7, "bf16")
    assert y.shape == r_out.shape == (3, 7) and y.data_ptr() != x.data_ptr() and r_out.data_ptr() != res.data_ptr()
    x3 = torch.zeros(2, 5, 7, dtype=torch.float16)
    assert check(x3, x3.clone(), torch.ones(7, dtype=torch.float16))[6:] == (10, 7)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.float8_e4m3fn])
def test_unsupported_dtypes(dtype: torch.dtype) -> None:
    x = torch.zeros(2, 4).to(dtype)
    with pytest.raises(sollat.UnsupportedError, match="supported dtypes: float32, bfloat16, float16"):
        check(x, x, torch.zeros(4).to(dtype))


def test_shape_and_dtype_errors() -> None:
    x, res, w = args(3, 8)
    with pytest.raises(sollat.UnsupportedError, match=r"residual is \(3, 9\)"):
        check(x, torch.zeros(3, 9, dtype=x.dtype), w)
    with pytest.raises(sollat.UnsupportedError, match="residual .* they must match"):
        check(x, res.float(), w)
    with pytest.raises(sollat.UnsupportedError, match=r"weight is \(9,\).* must be \(8,\) torch.bfloat16"):
        check(x, res, torch.ones(9, dtype=x.dtype))
    with pytest.raises(sollat.UnsupportedError, match="weight .* must be"):
        check(x, res, w.float())
    with pytest.raises(sollat.UnsupportedError, match=r"\[\.\.\., hidden\]"):
        check(torch.zeros((), dtype=x.dtype), torch.zeros((), dtype=x.dtype), w)
    with pytest.raises(sollat.UnsupportedError, match="out is"):
        check(x, res, w, out=torch.zeros(3, 7, dtype=x.dtype))
    with pytest.raises(sollat.UnsupportedError, match="residual_out is"):
        check(x, res, w, res_out=torch.zeros(3, 8))
    with pytest.raises(TypeError, match="weight must be a torch.Tensor"):
        check(x, res, [1.0] * 8)


def test_hidden_limit_names_the_maximum() -> None:
    h = rmsnorm.MAX_HIDDEN + 1
    x = torch.zeros(1, h, dtype=torch.bfloat16)
    with pytest.raises(sollat.UnsupportedError, match=f"hidden size {h} is above the supported maximum {rmsnorm.MAX_HIDDEN}"):
        check(x, x, torch.zeros(h, dtype=torch.bfloat16))
    x = torch.zeros(1, rmsnorm.MAX_HIDDEN, dtype=torch.bfloat16)
    check(x, x.clone(), torch.zeros(rmsnorm.MAX_HIDDEN, dtype=torch.bfloat16))


def test_devices() -> None:
    x, res, w = args()
    with pytest.raises(sollat.UnsupportedError, match="x is on cpu; sollat needs CUDA tensors on cuda:0"):
        check(x, res, w, device=CUDA)
    with pytest.raises(sollat.UnsupportedError, match="but the communicator is on meta"):
        check(x, res, w, device=torch.device("meta"))


def test_contiguity_and_aliasing() -> None:
    x, res, w = args(4, 8)
    xt = torch.zeros(8, 4, dtype=x.dtype).t()
    assert not xt.is_contiguous()
    xc = check(xt, res, w)[0]
    assert xc.is_contiguous() and xc.data_ptr() != xt.data_ptr()  # inputs are copied
    with pytest.raises(sollat.UnsupportedError, match="out must be contiguous"):
        check(x, res, w, out=torch.zeros(8, 4, dtype=x.dtype).t())
    with pytest.raises(sollat.UnsupportedError, match="updated in place .* must be contiguous"):
        rt = torch.zeros(8, 4, dtype=x.dtype).t()
        check(x, rt, w, res_out=rt)
    # the supported aliases
    got = check(x, res, w, out=x, res_out=res)
    assert got[3] is x and got[4] is res
    # everything else that shares memory
    with pytest.raises(sollat.UnsupportedError, match="out overlaps residual_out"):
        check(x, res, w, out=res, res_out=res)
    with pytest.raises(sollat.UnsupportedError, match="out overlaps residual"):
        check(x, res, w, out=res)
    with pytest.raises(sollat.UnsupportedError, match="residual_out overlaps x"):
        check(x, res, w, res_out=x)
    big = torch.zeros(5, 8, dtype=x.dtype)
    with pytest.raises(sollat.UnsupportedError, match="out partly overlaps x"):
        check(big[:4], res, w, out=big[1:])


@pytest.mark.parametrize("eps", [-1e-6, float("nan"), float("inf"), 1e39, True, "1e-6", None])
def test_bad_eps(eps: object) -> None:
    with pytest.raises(sollat.UnsupportedError, match="eps"):
        rmsnorm.eps_bits(eps)


def test_eps_is_rounded_to_float32() -> None:
    assert rmsnorm.eps_bits(1e-6) == int(np.float32(1e-6).view(np.uint32))
    assert rmsnorm.eps_float32(1e-6) == float(np.float32(1e-6))
    assert rmsnorm.eps_bits(0) == 0


def test_algorithm_names() -> None:
    assert rmsnorm.internal_name("oneshot_ll") == "rmsnorm_oneshot_ll"
    assert rmsnorm.internal_name("rmsnorm_oneshot_sentinel") == "rmsnorm_oneshot_sentinel"
    with pytest.raises(sollat.UnsupportedError, match="unknown algorithm 'twoshot_ll'; known: oneshot_ll, oneshot_sentinel"):
        rmsnorm.internal_name("twoshot_ll")


def test_fused_algorithms_are_not_allreduce_algorithms() -> None:
    assert not set(algorithms.RMSNORM_ALGORITHMS) & set(algorithms.ALGORITHMS)
    with pytest.raises(sollat.UnsupportedError, match="unknown algorithm"):
        algorithms.get("rmsnorm_oneshot_ll")
    names = tuple(r.name for r in algorithms.regions(("oneshot_ll",), 16))
    assert names == ("oneshot_ll", *algorithms.RMSNORM_ALGORITHMS)
    from sollat.comm_state import scratch_bytes_per_rank

    extra = sum(a.scratch_bytes(4) for a in algorithms.RMSNORM_ALGORITHMS.values())  # their own 16 blocks
    for blocks in (16, 64):  # the AllReduce regions follow the communicator's max_blocks
        assert scratch_bytes_per_rank(4, ["oneshot_ll"], blocks) == (
            layout.CONTROL_BYTES + algorithms.ALGORITHMS["oneshot_ll"].scratch_bytes(4, blocks) + extra)


def fake_virtual(world_size: int = 2) -> VirtualCommunicator:
    from .test_host_logic import fake_virtual as fv

    c = fv(world_size)
    c._pad = (0,) * (abi.MAX_RANKS - world_size)
    return c


def test_virtual_list_lengths_are_checked() -> None:
    c = fake_virtual(2)
    x, res, w = args()
    with pytest.raises(sollat.UnsupportedError, match="needs xs as a list of 2 tensors, got 3 tensors"):
        c._all_reduce_rmsnorm_impl([x] * 3, [res] * 2, [w] * 2, 1e-6, "auto", None, None)
    with pytest.raises(sollat.UnsupportedError, match="needs residuals as a list of 2 tensors, got a single tensor"):
        c._all_reduce_rmsnorm_impl([x] * 2, res, [w] * 2, 1e-6, "auto", None, None)
    with pytest.raises(sollat.UnsupportedError, match="needs out as a list"):
        c._all_reduce_rmsnorm_impl([x] * 2, [res] * 2, [w] * 2, 1e-6, "auto", [x], None)
    with pytest.raises(sollat.UnsupportedError, match=r"x\[0\] is on cpu; sollat needs CUDA tensors"):
        c._all_reduce_rmsnorm_impl([x, x], [res, res], [w, w], 1e-6, "auto", None, None)
    with pytest.raises(sollat.UnsupportedError, match="eps must be finite"):
        c._all_reduce_rmsnorm_impl([x, x], [res, res], [w, w], -1.0, "auto", None, None)


def test_virtual_ranks_must_agree_on_shape() -> None:
    c = fake_virtual(2)
    c.device = CPU  # get past the device checks
    x, res, w = args(3, 8)
    x4, res4, _ = args(4, 8)
    with pytest.raises(sollat.UnsupportedError, match=r"xs\[1\] is \(4, 8\).*every rank must pass the same shape"):
        c._all_reduce_rmsnorm_impl([x, x4], [res, res4], [w, w], 1e-6, "auto", None, None)


# ---- torch.compile: fake functions and no graph break ----------------------------------------------
def test_fake_functions_describe_the_outputs() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(5, 7, dtype=torch.bfloat16)
        w = torch.empty(7, dtype=torch.bfloat16)
        y, r = torch.ops.sollat.all_reduce_rmsnorm(x, x, w, 1, 1e-6, "auto")
        assert y.shape == r.shape == (5, 7) and y.dtype == r.dtype == torch.bfloat16
        both = torch.ops.sollat.all_reduce_rmsnorm_virtual([x, x, x], [x, x, x], [w, w, w], 1, 1e-6, "oneshot_ll")
        assert len(both) == 6 and all(t.shape == (5, 7) and t.dtype == torch.bfloat16 for t in both)


class _CpuStub:
    """Stands in for a communicator behind the custom ops: the host reference on CPU tensors."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.calls = 0

    def _all_reduce_rmsnorm_impl(self, x, residual, weight, eps, algo, out, residual_out):
        self.calls += 1
        if isinstance(x, torch.Tensor):  # one rank: the sum of world_size copies of x
            geo = rmsnorm.geometry("oneshot_ll", x.dtype, x.numel() // x.shape[-1], x.shape[-1], self.world_size)
            y, r = rmsnorm.reference([x] * self.world_size, residual, weight, eps, geo)
            return (y if out is None else out.copy_(y)), (r if residual_out is None else residual_out.copy_(r))
        geo = rmsnorm.geometry("oneshot_ll", x[0].dtype, x[0].numel() // x[0].shape[-1], x[0].shape[-1],
                               self.world_size)
        got = [rmsnorm.reference(list(x), r, w, eps, geo) for r, w in zip(residual, weight, strict=True)]
        ys, rs = [g[0] for g in got], [g[1] for g in got]
        if out is not None:
            ys = [o.copy_(y) for o, y in zip(out, ys, strict=True)]
        if residual_out is not None:
            rs = [o.copy_(r) for o, r in zip(residual_out, rs, strict=True)]
        return ys, rs


def test_compiled_calls_keep_one_graph() -> None:
    stub = _CpuStub(2)
    comm_id = registry.register(stub)
    real = Communicator.__new__(Communicator)
    real.comm_id = comm_id
    virt = VirtualCommunicator.__new__(VirtualCommunicator)
    virt.comm_id = comm_id
    virt.world_size = 2
    real._all_reduce_rmsnorm_impl = stub._all_reduce_rmsnorm_impl  # the eager path, on the CPU
    virt._all_reduce_rmsnorm_impl = stub._all_reduce_rmsnorm_impl

    def step(x, res, w):
        y, r = real.all_reduce_rmsnorm(x, res, w, 1e-5, residual_out=res)
        ys, rs = virt.all_reduce_rmsnorm([x, y], [r, r.clone()], w, 1e-5)
        return ys[0] + ys[1] + rs[1]

    x = torch.randn(4, 16)
    res = torch.randn(4, 16)
    w = torch.randn(16)
    res_eager = res.clone()
    expect = step(x, res_eager, w)
    compiled = torch.compile(step, fullgraph=True, backend="eager")  # fullgraph: a graph break is an error
    res_c = res.clone()
    got = compiled(x, res_c, w)
    assert torch.equal(got, expect) and torch.equal(res_c, res_eager)  # residual_out=res updated in place
    assert stub.calls >= 4


def test_ops_module_exports() -> None:
    assert callable(ops.all_reduce_rmsnorm) and callable(ops.all_reduce_rmsnorm_virtual)


# ---- geometry and the reference ------------------------------------------------------------------
@pytest.mark.parametrize("algo", list(rmsnorm.ALGOS))
@pytest.mark.parametrize("dtype", rmsnorm.DTYPES_SUPPORTED, ids=str)
@pytest.mark.parametrize("r", [2, 4, 8])
def test_geometry_covers_each_line_of_a_row_once(algo: str, dtype: torch.dtype, r: int) -> None:
    alg = algorithms.RMSNORM_ALGORITHMS[rmsnorm.internal_name(algo)]
    for rows in (1, 3, 8, 64):
        for hidden in (1, 7, 1000, 4096, 5120, 8192, 16384, rmsnorm.MAX_HIDDEN):
            g = rmsnorm.geometry(algo, dtype, rows, hidden, r)
            k = g.row_blocks
            assert k in (1, 2, 4, 8) and k <= abi.RMSNORM_MAX_ROW_BLOCKS
            assert g.blocks == k * min(rows, alg.max_blocks // k) <= alg.max_blocks  # a cluster per row
            assert g.threads % layout.WARP == 0 and g.threads <= abi.RMSNORM_MAX_THREADS
            assert (r, g.slots) in alg.slot_choices or g.slots == 1
            lines = [((p * k + j) * g.slots + i) * g.threads + t for p in range(g.passes) for j in range(k)
                     for i in range(g.slots) for t in range(g.threads)]
            assert len(set(lines)) == len(lines) and set(range(g.row_lines)) <= set(lines)
            assert g.row_lines > (g.passes - 1) * k * g.slots * g.threads  # no empty pass
            # more blocks per row only while a block holds more than ROW_LINES_PER_BLOCK lines and
            # every row still gets its own cluster
            if k > 1:
                assert layout.ceil_div(g.row_lines, k // 2) > rmsnorm.ROW_LINES_PER_BLOCK
                assert rows * k <= alg.max_blocks
            if layout.ceil_div(g.row_lines, k) > rmsnorm.ROW_LINES_PER_BLOCK:
                assert k == abi.RMSNORM_MAX_ROW_BLOCKS or rows * 2 * k > alg.max_blocks
    assert rmsnorm.geometry(algo, dtype, 3, 64, r).blocks == 3  # a short row: one block per row
    # fewer blocks at once (a virtual communicator's retry): fewer clusters, never narrower ones
    full = rmsnorm.row_geometry(alg, DTYPES[dtype], 8, 8192, r)
    for limit in range(1, alg.max_blocks):
        g = rmsnorm.row_geometry(alg, DTYPES[dtype], 8, 8192, r, limit)
        assert g.row_blocks == full.row_blocks and (g.threads, g.slots, g.passes) == (full.threads, full.slots,
                                                                                       full.passes)
        assert g.blocks == full.row_blocks * max(1, limit // full.row_blocks)
    assert rmsnorm.geometry(algo, dtype, 1, 8192, r).row_blocks > 1  # a decode row: a cluster


def test_reference_is_rmsnorm_of_the_sum() -> None:
    gen = torch.Generator().manual_seed(1)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float16, 2e-3)):
        xs = [torch.randn(6, 1000, generator=gen).to(dtype) for _ in range(4)]
        res = torch.randn(6, 1000, generator=gen).to(dtype)
        w = torch.randn(1000, generator=gen).to(dtype)
        y, r = rmsnorm.reference(xs, res, w, 1e-6, rmsnorm.geometry("oneshot_ll", dtype, 6, 1000, 4))
        r64 = sum(x.double() for x in xs) + res.double()
        assert torch.allclose(r.double(), r64, rtol=tol, atol=tol)
        rr = r.double()
        y64 = rr * torch.rsqrt(rr.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
        assert torch.allclose(y.double(), y64, rtol=tol, atol=tol)


def _nearest_float32(exact: Fraction, square: bool = False) -> float:
    """The float32 nearest to ``exact`` (or, with ``square``, to its square root), found in
    rational arithmetic: a float library's rounding is what is under test, so none is trusted."""
    guess = np.float32(math.sqrt(exact) if square else float(exact))
    candidates = [np.nextafter(guess, np.float32(-np.inf)), guess, np.nextafter(guess, np.float32(np.inf))]

    def distance(c: np.float32) -> Fraction:  # |c - x|; for a root |c - sqrt q| = |c^2 - q| / (c + sqrt q)
        f = Fraction(float(c))
        return abs(f * f - exact) / (f + Fraction(math.sqrt(exact))) if square else abs(f - exact)

    return float(min(candidates, key=distance))


@pytest.mark.parametrize("hidden", [4096, 5120, 7])
def test_row_rstd_is_correctly_rounded_at_every_step(hidden: int) -> None:
    """The reference's 1 / sqrt(total / hidden + eps) is the kernel's (div.rn, add.rn, sqrt.rn,
    div.rn): every step the float32 nearest to the exact result, found in rational arithmetic.
    torch's float32 sqrt on the CPU fails this on some machines: the first 2-GPU run's three
    'mismatches' were the reference's last bit, not the kernel's."""
    gen = torch.Generator().manual_seed(3)
    total = (torch.rand(1500, generator=gen, dtype=torch.float64) * 1e4).to(torch.float32)
    eps = 1e-6
    got = rmsnorm.row_rstd(total, hidden, eps)
    e = Fraction(rmsnorm.eps_float32(eps))
    for t, g in zip(total.tolist(), got.tolist(), strict=True):
        mean = _nearest_float32(Fraction(t) / hidden)
        shifted = _nearest_float32(Fraction(mean) + e)
        root = _nearest_float32(Fraction(shifted), square=True)
        assert g == _nearest_float32(1 / Fraction(root)), (t, g)


def test_reference_order_is_the_geometry_order() -> None:
    """The sum of squares depends on the order: the reference must follow the geometry (a different
    cut of the same row gives other bits for some inputs)."""
    gen = torch.Generator().manual_seed(2)
    xs = [torch.randn(64, 4096, generator=gen) * 1e3 for _ in range(2)]
    res = torch.randn(64, 4096, generator=gen)
    w = torch.ones(4096)
    a, _ = rmsnorm.reference(xs, res, w, 1e-6, rmsnorm.geometry("oneshot_ll", torch.float32, 64, 4096, 2))
    b, _ = rmsnorm.reference(xs, res, w, 1e-6, rmsnorm.geometry("oneshot_sentinel", torch.float32, 64, 4096, 2))
    assert not torch.equal(a, b)
    assert torch.allclose(a, b, rtol=1e-6)
    # the same rows cut over a cluster of 8 blocks (8 rows of their own) and over one block each
    g8 = rmsnorm.geometry("oneshot_ll", torch.float32, 1, 4096, 2)
    assert g8.row_blocks == 8
    g1 = rmsnorm.RowGeometry(1, 256, 4, 2, g8.row_lines, g8.elems_per_line, 1)
    c, _ = rmsnorm.reference(xs, res, w, 1e-6, g8)
    d, _ = rmsnorm.reference(xs, res, w, 1e-6, g1)
    assert not torch.equal(c, d)
    assert torch.allclose(c, d, rtol=1e-6)


def test_reference_adversarial_values() -> None:
    x = torch.tensor([[1.0, float("nan"), 2.0], [float("inf"), 1.0, 1.0], [-0.0, -0.0, -0.0], [1e-40, 0, 0]])
    neg0 = torch.full_like(x, -0.0)
    y, r = rmsnorm.reference([x, neg0], neg0, torch.ones(3), 1e-6, rmsnorm.geometry("oneshot_ll", torch.float32, 4, 3, 2))
    assert torch.isnan(y[0]).all()  # a NaN in a row: NaN everywhere in it
    assert torch.isnan(y[1, 0]) and y[1, 1:].eq(0).all()  # an Inf: rstd = 0, so Inf * 0 = NaN and 0 elsewhere
    assert torch.equal(r[2].view(torch.int32), torch.full((3,), -0.0).view(torch.int32))  # -0 + -0 + -0 = -0
    assert y[2].eq(0).all()
    assert r[3, 0].item() == pytest.approx(1e-40, rel=1e-3)  # a denormal survives the sum


# ---- NVRTC -------------------------------------------------------------------------------------
cuda_core = pytest.importorskip("cuda.core")


def test_rmsnorm_instantiations_are_listed() -> None:
    work = [d for f, d in instantiations.all_instantiations() if f == "allreduce_rmsnorm.cu"]
    expect = sum(len(a.dtypes) * len(a.slot_choices) * 2 for a in algorithms.RMSNORM_ALGORITHMS.values())
    assert len(work) == expect
    assert {d["SOLLAT_PROTO"] for d in work} == {"ProtoLL", "ProtoSentinel"}


@pytest.mark.parametrize("proto,t,ranks,slots", [("ProtoLL", "sollat::bf16", 8, 1), ("ProtoSentinel", "float", 2, 1)])
def test_kernel_compiles(tmp_path, monkeypatch, proto: str, t: str, ranks: int, slots: int) -> None:
    monkeypatch.setenv("SOLLAT_CACHE_DIR", str(tmp_path))
    build.compile_cubin(build.kernel_source("allreduce_rmsnorm.cu"), name="allreduce_rmsnorm", arch="sm_90", defines={
        "SOLLAT_T": t, "SOLLAT_OP": "OpSum", "SOLLAT_PROTO": proto, "SOLLAT_MAX_RANKS": str(ranks),
        "SOLLAT_SLOTS": str(slots), "SOLLAT_FENCE_SYS": "0", "SOLLAT_TEST_HOOKS": "1"})


def _ptxas_report(defines: dict[str, str]) -> str:
    from cuda.core import Program, ProgramOptions

    opts = build._options("sm_90", defines)
    o = ProgramOptions(**{**{f: getattr(opts, f) for f in opts.__dataclass_fields__}, "ptxas_options": "-v"})
    log = io.StringIO()
    Program(build.kernel_source("allreduce_rmsnorm.cu"), code_type="c++", options=o).compile("cubin", logs=log)
    return log.getvalue()


@pytest.mark.slow  # about 40 s on 2 cores: every dtype x protocol x (ranks, slots), both entry points
def test_every_rmsnorm_instantiation_compiles_without_spills() -> None:
    """Measured (ptxas -v, sm_90): with 256 threads per block (abi.RMSNORM_MAX_THREADS) no entry
    spills. At 512 (128 registers per thread) the row clusters made the 16-bit sentinel 8-rank
    entries spill up to 40 bytes; before them 8 bytes. The 16-bit sentinel with 2 slots spilled
    24-172 bytes, hence one slot for the sentinel."""
    for f, d in instantiations.all_instantiations():
        if f != "allreduce_rmsnorm.cu" or d["SOLLAT_FENCE_SYS"] != "0":
            continue  # the fence scope does not change register use
        report = _ptxas_report(d)
        spills = dict(zip(re.findall(r"Function properties for (\w+)", report),
                          (int(s) for s in re.findall(r"(\d+) bytes spill stores", report)), strict=True))
        assert spills == {"ar_rmsnorm_pg": 0, "ar_rmsnorm_vr": 0}, (d, spills)


def test_auto_resolves_through_the_tuning_table() -> None:
    """algo="auto" picks a fused one-shot algorithm from the AllReduce table at every size (never a
    library path: the fused op has none)."""
    c = fake_virtual(2)
    for nbytes in (4, 1024, 1 << 20, 64 << 20):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            assert c._rmsnorm_resolve("auto", nbytes, dtype) in algorithms.RMSNORM_ALGORITHMS
            assert rmsnorm.ALGOS[c.selected_rmsnorm_algorithm(nbytes, dtype)] == c._rmsnorm_resolve("auto", nbytes,
                                                                                                   dtype)
