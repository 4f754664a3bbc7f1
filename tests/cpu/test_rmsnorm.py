"""Fused AllReduce + residual add + RMSNorm without a GPU: argument checks, the fake (meta)
functions torch.compile uses, the row geometry, the host reference, and NVRTC compiles."""

from __future__ import annotations

import dataclasses
import itertools
import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import torch

import sollat
from sollat.collectives import (
    algorithms,
    instantiations,
    ops,
    registry,
    rmsnorm,
    rmsnorm_checks,
    rmsnorm_epilogue,
    rmsnorm_rules,
)
from sollat.comm.ranks import RealRanks, VirtualRanks
from sollat.comm.real import Communicator, VirtualCommunicator
from sollat.device import abi, abi_header, build, layout
from sollat.device.dtypes import DTYPES

CPU = torch.device("cpu")
CUDA = torch.device("cuda", 0)


def args(rows: int = 3, hidden: int = 8, dtype: torch.dtype = torch.bfloat16):
    return torch.zeros(rows, hidden, dtype=dtype), torch.zeros(rows, hidden, dtype=dtype), torch.ones(hidden, dtype=dtype)


def check(x, res, w, out=None, res_out=None, device=CPU):
    return rmsnorm_checks.check_rank(x, res, w, out, res_out, device)


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
    assert rmsnorm.internal_name("twoshot_sentinel") == "rmsnorm_twoshot_sentinel"
    assert rmsnorm.internal_name("rmsnorm_twoshot_sentinel") == "rmsnorm_twoshot_sentinel"
    assert rmsnorm.internal_name("unfused") == "unfused" == rmsnorm.public_name("unfused")
    assert rmsnorm.public_name("rmsnorm_twoshot_sentinel") == "twoshot_sentinel"
    known = ("known: oneshot_ll, oneshot_sentinel, twoshot_sentinel, oneshot_ll_block, oneshot_ll_block_pipe, unfused "
             "or 'auto'")
    for bad in ("ll128", "twoshot", "oneshot", "twoshot_LL", "twoshot_ll"):  # no LL two-shot: algorithms.py
        with pytest.raises(sollat.UnsupportedError, match=f"unknown algorithm '{bad}'; {known}"):
            rmsnorm.internal_name(bad)
    assert set(rmsnorm.ALGOS.values()) == set(algorithms.RMSNORM_ALGORITHMS)
    assert set(rmsnorm.AUTO_ALGOS) == {"oneshot_ll", "oneshot_sentinel"}  # auto never picks the two-shot (unmeasured)


def test_twoshot_algorithms_are_registered() -> None:
    """Own regions of two buffers each, the two-shot module define, the one-shot defines untouched;
    sentinel only (an LL two-shot is unsound: the protocol model's owner-only-slots counterexample)."""
    assert "rmsnorm_twoshot_ll" not in algorithms.RMSNORM_ALGORITHMS
    for proto in ("sentinel",):
        one = algorithms.RMSNORM_ALGORITHMS[f"rmsnorm_oneshot_{proto}"]
        two = algorithms.RMSNORM_ALGORITHMS[f"rmsnorm_twoshot_{proto}"]
        assert (two.kernel_file, two.kernel, two.proto, two.buffers) == ("allreduce_rmsnorm.cu", "ar_rmsnorm_twoshot",
                                                                          proto, 2)
        assert two.buffers == abi.KERNELS["ar_rmsnorm_twoshot"].buffers and one.buffers == 1
        # the same limits, hence the same cut of every call (rmsnorm.row_geometry) as the one-shot
        assert (two.max_blocks, two.slot_choices, two.dtypes) == (one.max_blocks, one.slot_choices, one.dtypes)
        assert two.scratch_bytes(4) == 2 * one.scratch_bytes(4)
        for fp8 in (False, True):
            d1 = algorithms.kernel_defines(one, DTYPES[torch.bfloat16], "sum", 4, 1, False, True, fp8=fp8)
            d2 = algorithms.kernel_defines(two, DTYPES[torch.bfloat16], "sum", 4, 1, False, True, fp8=fp8)
            assert "SOLLAT_RMSNORM_TWOSHOT" not in d1  # the one-shot's defines (its cubin key) are unchanged
            assert d2 == {**d1, "SOLLAT_RMSNORM_TWOSHOT": "1"}
    assert abi.rmsnorm_entry("ar_rmsnorm_twoshot", False) == "ar_rmsnorm_twoshot"
    assert abi.rmsnorm_entry("ar_rmsnorm_twoshot", True) == "ar_rmsnorm_twoshot_fp8"
    assert abi.rmsnorm_entry("ar_rmsnorm", True) == abi.RMSNORM_FP8_ENTRY
    src = build.kernel_source("allreduce_rmsnorm.cu")
    for entry in ("ar_rmsnorm_twoshot", "ar_rmsnorm_twoshot_fp8"):
        assert f"#define SOLLAT_RMSNORM_{'FP8_' if 'fp8' in entry else ''}ENTRY {entry}\n" in src
    assert "kArRmsnormTwoshotBuffers = 2" in abi_header.header_text()


@pytest.mark.parametrize("r", [2, 3, 4, 5, 8])
def test_twoshot_row_ownership(r: int) -> None:
    """Rank row % R owns a row: every row exactly one owner, fewer rows than ranks leave the
    highest ranks without rows, rows not divisible by R differ by at most one row per rank."""
    for rows in (1, 2, r - 1, r, r + 1, 2 * r + 3, 64, 257):
        if rows < 1:
            continue
        owned = [list(rmsnorm.rows_owned(rows, r, k)) for k in range(r)]
        assert sorted(row for rs in owned for row in rs) == list(range(rows))
        assert all(rmsnorm.row_owner(row, r) == k for k in range(r) for row in owned[k])
        assert max(map(len, owned)) - min(map(len, owned)) <= 1
        assert [len(o) for o in owned] == [len(range(k, rows, r)) for k in range(r)]
        if rows < r:
            assert all(owned[k] == [row] for row, k in zip(range(rows), range(rows), strict=True))
            assert all(not owned[k] for k in range(rows, r))  # ranks >= rows own nothing


@pytest.mark.parametrize("proto", ["sentinel"])
@pytest.mark.parametrize("dtype", rmsnorm.DTYPES_SUPPORTED, ids=str)
def test_twoshot_geometry_is_the_one_shot_s(proto: str, dtype: torch.dtype) -> None:
    """The two-shot cuts every call as the one-shot of its protocol (rows < ranks, rows not
    divisible by ranks, clusters, several passes): the same launch, and (as for every algorithm)
    the bits of rmsnorm.reference, which takes no geometry."""
    for r in (2, 4, 8):
        for rows in (1, 2, 3, 5, 7, 8, 9, 17, 64, 200):
            for hidden in (1, 7, 1000, 4096, 5120, 8192, 16384, rmsnorm.MAX_HIDDEN):
                assert rmsnorm.geometry(f"twoshot_{proto}", dtype, rows, hidden, r) == rmsnorm.geometry(
                    f"oneshot_{proto}", dtype, rows, hidden, r)


@pytest.mark.parametrize("twoshot", [False, True])
def test_fused_algorithms_are_not_allreduce_algorithms(monkeypatch: pytest.MonkeyPatch, twoshot: bool) -> None:
    if twoshot:
        monkeypatch.setenv(algorithms.RMSNORM_TWOSHOT_ENV, "1")
    else:
        monkeypatch.delenv(algorithms.RMSNORM_TWOSHOT_ENV, raising=False)
    assert not set(algorithms.RMSNORM_ALGORITHMS) & set(algorithms.ALGORITHMS)
    with pytest.raises(sollat.UnsupportedError, match="unknown algorithm"):
        algorithms.get("rmsnorm_oneshot_ll")
    names = tuple(r.name for r in algorithms.regions(("oneshot_ll",), 16))
    # the experimental two-shot gets regions only when enabled
    # the block kernel runs on rmsnorm_oneshot_ll's region (no region of its own)
    fused = [a for n, a in algorithms.RMSNORM_ALGORITHMS.items()
             if (twoshot or n not in algorithms.RMSNORM_EXPERIMENTAL) and not a.region]
    assert names == ("oneshot_ll", *(a.name for a in fused))
    assert len(fused) == (3 if twoshot else 2)
    from sollat.comm.state import scratch_bytes_per_rank

    extra = sum(a.scratch_bytes(4) for a in fused)  # their own blocks
    for blocks in (16, 64):  # the AllReduce regions follow the communicator's max_blocks
        assert scratch_bytes_per_rank(4, ["oneshot_ll"], blocks) == (
            layout.CONTROL_BYTES + algorithms.ALGORITHMS["oneshot_ll"].scratch_bytes(4, blocks) + extra)


def test_the_experimental_two_shot_is_refused_unless_enabled() -> None:
    comm = fake_virtual(2)
    assert not comm._rmsnorm_twoshot
    with pytest.raises(sollat.UnsupportedError, match=algorithms.RMSNORM_TWOSHOT_ENV):
        comm._rmsnorm_resolve("twoshot_sentinel", 1024, torch.bfloat16)
    assert comm._rmsnorm_resolve("oneshot_sentinel", 1024, torch.bfloat16) == "rmsnorm_oneshot_sentinel"
    comm._rmsnorm_twoshot = True
    assert comm._rmsnorm_resolve("twoshot_sentinel", 1024, torch.bfloat16) == "rmsnorm_twoshot_sentinel"


def fake_virtual(world_size: int = 2) -> VirtualCommunicator:
    from .test_host_logic import fake_virtual as fv

    return fv(world_size)


def _public(c: Any, x: Any, residual: Any, weight: Any, eps: float, algo: str, out: Any, residual_out: Any,
            fp8_scale: Any = None, fp8_out: Any = None) -> Any:
    """The public all_reduce_rmsnorm, its arguments in the order of the one definition's eager path."""
    return c.all_reduce_rmsnorm(x, residual, weight, eps, algo, out=out, residual_out=residual_out,
                                fp8_scale=fp8_scale, fp8_out=fp8_out)


def test_virtual_list_lengths_are_checked() -> None:
    c = fake_virtual(2)
    x, res, w = args()
    with pytest.raises(sollat.UnsupportedError, match="needs x as a list of 2 tensors, got 3 tensors"):
        _public(c, [x] * 3, [res] * 2, [w] * 2, 1e-6, "auto", None, None)
    with pytest.raises(sollat.UnsupportedError, match="needs residual as a list of 2 tensors, got a single tensor"):
        _public(c, [x] * 2, res, [w] * 2, 1e-6, "auto", None, None)
    with pytest.raises(sollat.UnsupportedError, match="needs out as a list"):
        _public(c, [x] * 2, [res] * 2, [w] * 2, 1e-6, "auto", [x], None)
    with pytest.raises(sollat.UnsupportedError, match=r"x\[0\] is on cpu; sollat needs CUDA tensors"):
        _public(c, [x, x], [res, res], [w, w], 1e-6, "auto", None, None)
    with pytest.raises(sollat.UnsupportedError, match="eps must be finite"):
        _public(c, [x, x], [res, res], [w, w], -1.0, "auto", None, None)


def test_virtual_ranks_must_agree_on_shape() -> None:
    c = fake_virtual(2)
    c.device = CPU  # get past the device checks
    x, res, w = args(3, 8)
    x4, res4, _ = args(4, 8)
    with pytest.raises(sollat.UnsupportedError, match=r"x\[1\] is \(4, 8\).*every rank must pass the same shape"):
        _public(c, [x, x4], [res, res4], [w, w], 1e-6, "auto", None, None)


# ---- torch.compile: fake functions and no graph break ----------------------------------------------
def test_fake_functions_describe_the_outputs() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(5, 7, dtype=torch.bfloat16)
        w = torch.empty(7, dtype=torch.bfloat16)
        y, r = torch.ops.sollat.all_reduce_rmsnorm([x], [x], [w], 1, 1e-6, "auto")  # one launch rank
        assert y.shape == r.shape == (5, 7) and y.dtype == r.dtype == torch.bfloat16
        both = torch.ops.sollat.all_reduce_rmsnorm([x, x, x], [x, x, x], [w, w, w], 1, 1e-6, "oneshot_ll")
        assert len(both) == 6 and all(t.shape == (5, 7) and t.dtype == torch.bfloat16 for t in both)


class _CpuStub:
    """Stands in for a communicator behind the custom ops: the host reference on CPU tensors."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.calls = 0

    def _all_reduce_rmsnorm_ranks(self, xs, residuals, weights, eps, algo, outs, r_outs, fp8_outs=None,
                                  scales=None):
        """The communicators' one eager path, over per-launch-rank lists: one rank (a Communicator)
        sums world_size copies of its x, R ranks (a VirtualCommunicator) sum their xs."""
        self.calls += 1
        summands = list(xs) * self.world_size if len(xs) == 1 else list(xs)
        got = [rmsnorm.reference(summands, r, w, eps) for r, w in zip(residuals, weights, strict=True)]
        ys, rs = [g[0] for g in got], [g[1] for g in got]
        if outs is not None:
            ys = [o.copy_(y) for o, y in zip(outs, ys, strict=True)]
        if r_outs is not None:
            rs = [o.copy_(r) for o, r in zip(r_outs, rs, strict=True)]
        return ys, rs


def _stub_communicators(stub: Any) -> tuple[Communicator, VirtualCommunicator]:
    """A Communicator and a 2-rank VirtualCommunicator whose eager path is ``stub``'s (on the CPU),
    reachable from the custom ops through the registry."""
    comm_id = registry.register(stub)
    real = Communicator.__new__(Communicator)
    virt = VirtualCommunicator.__new__(VirtualCommunicator)
    real.comm_id = virt.comm_id = comm_id
    virt.world_size = 2
    real._ranks = RealRanks(0, torch.empty(0, dtype=torch.uint8))
    virt._ranks = VirtualRanks(2, torch.empty(0, dtype=torch.uint8))
    real._all_reduce_rmsnorm_ranks = stub._all_reduce_rmsnorm_ranks  # type: ignore[method-assign]
    virt._all_reduce_rmsnorm_ranks = stub._all_reduce_rmsnorm_ranks  # type: ignore[method-assign]
    return real, virt


def test_compiled_calls_keep_one_graph() -> None:
    stub = _CpuStub(2)
    real, virt = _stub_communicators(stub)

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
    assert callable(ops.all_reduce_rmsnorm) and not hasattr(ops, "all_reduce_rmsnorm_virtual")


# ---- geometry and the reference ------------------------------------------------------------------
@pytest.mark.parametrize("algo", [a for a in rmsnorm.ALGOS if not a.startswith("oneshot_ll_block")])  # row clusters
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
        y, r = rmsnorm.reference(xs, res, w, 1e-6)
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


def test_reference_adversarial_values() -> None:
    x = torch.tensor([[1.0, float("nan"), 2.0], [float("inf"), 1.0, 1.0], [-0.0, -0.0, -0.0], [1e-40, 0, 0]])
    neg0 = torch.full_like(x, -0.0)
    y, r = rmsnorm.reference([x, neg0], neg0, torch.ones(3), 1e-6)
    assert torch.isnan(y[0]).all()  # a NaN in a row: NaN everywhere in it
    assert torch.isnan(y[1, 0]) and y[1, 1:].eq(0).all()  # an Inf: rstd = 0, so Inf * 0 = NaN and 0 elsewhere
    assert torch.equal(r[2].view(torch.int32), torch.full((3,), -0.0).view(torch.int32))  # -0 + -0 + -0 = -0
    assert y[2].eq(0).all()
    assert r[3, 0].item() == pytest.approx(1e-40, rel=1e-3)  # a denormal survives the sum


# ---- NVRTC -------------------------------------------------------------------------------------
cuda_core = pytest.importorskip("cuda.core")


def test_rmsnorm_instantiations_are_listed() -> None:
    work = [d for f, d in instantiations.all_instantiations() if f == "allreduce_rmsnorm.cu"]
    # x 2 entry kinds (real / virtual ranks) x 2 variants (plain / with the FP8 copy)
    expect = sum(len(a.dtypes) * len(a.slot_choices) * 2 * 2 for a in algorithms.RMSNORM_ALGORITHMS.values()
                 if a.kernel_file == "allreduce_rmsnorm.cu")
    assert len(work) == expect
    assert {d["SOLLAT_PROTO"] for d in work} == {"ProtoLL", "ProtoSentinel"}


@pytest.mark.parametrize("proto,t,ranks,slots,fp8,two", [("ProtoLL", "sollat::bf16", 8, 1, False, False),
                                                         ("ProtoSentinel", "float", 2, 1, False, False),
                                                         ("ProtoLL", "float", 2, 2, True, False),  # 2 elements per line
                                                         ("ProtoSentinel", "sollat::f16", 4, 1, True, False),  # 8 per line
                                                         ("ProtoLL", "sollat::bf16", 2, 2, False, True),  # 4 ag channels
                                                         ("ProtoSentinel", "sollat::f16", 8, 1, True, True),
                                                         ("ProtoLL", "float", 4, 1, True, True)])
def test_kernel_compiles(tmp_path, monkeypatch, proto: str, t: str, ranks: int, slots: int, fp8: bool,
                         two: bool) -> None:
    monkeypatch.setenv("SOLLAT_CACHE_DIR", str(tmp_path))
    defines = {"SOLLAT_T": t, "SOLLAT_OP": "OpSum", "SOLLAT_PROTO": proto, "SOLLAT_MAX_RANKS": str(ranks),
               "SOLLAT_SLOTS": str(slots), "SOLLAT_FENCE_SYS": "0", "SOLLAT_TEST_HOOKS": "1"}
    if fp8:
        defines["SOLLAT_RMSNORM_FP8"] = "1"
    if two:
        defines["SOLLAT_RMSNORM_TWOSHOT"] = "1"
    cubin = build.compile_cubin(build.kernel_source("allreduce_rmsnorm.cu"), name="allreduce_rmsnorm", arch="sm_90",
                                defines=defines)
    kernel = "ar_rmsnorm_twoshot" if two else "ar_rmsnorm"
    entry = abi.rmsnorm_entry(kernel, fp8)
    assert f"{entry}\0".encode() in cubin  # the entry the host asks for
    others = {abi.rmsnorm_entry(k, f) for k in ("ar_rmsnorm", "ar_rmsnorm_twoshot") for f in (False, True)} - {entry}
    for other in others:  # and only that one: one variant per module
        assert f"{other}\0".encode() not in cubin


def test_auto_resolves_through_the_tuning_table() -> None:
    """algo="auto" follows the table's all_reduce_rmsnorm rule (rmsnorm_rules; where the table has
    none, rules_for's: on virtual ranks the built-in rule of its world size, on real ones DEFAULT, a
    fused one-shot for at most AUTO_FUSED_MAX_ROWS rows of at least AUTO_FUSED_MIN_ROW_BYTES); a "fused" rule takes the AllReduce table's LL or sentinel choice
    (never a library path, never the two-shot); a table's own rule replaces the default."""
    c = fake_virtual(2)
    most, wide = rmsnorm.AUTO_FUSED_MAX_ROWS, rmsnorm.AUTO_FUSED_MIN_ROW_BYTES

    def check(rules: rmsnorm_rules.Rules | None) -> set[str]:
        seen = set()
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for rows in (1, 2, 3, 8, 4096):
                for row_bytes in (2, wide // 2, wide - 2, wide, 2 * wide, 1 << 20):
                    nbytes = rows * row_bytes
                    name = c._rmsnorm_resolve("auto", nbytes, dtype, rows)
                    want = rmsnorm_rules.choose(rmsnorm_rules.rules_for(rules, 2, False), rows, row_bytes,
                                                rmsnorm_rules.FUSED)
                    if want == rmsnorm_rules.FUSED:
                        assert name in ("rmsnorm_oneshot_ll", "rmsnorm_oneshot_sentinel")
                    else:
                        assert name == rmsnorm.internal_name(want)
                    assert c.selected_rmsnorm_algorithm(nbytes, dtype, rows) == rmsnorm.public_name(name)
                    seen.add(rmsnorm.public_name(name))
        return seen

    table = c._selection_table()
    assert table.rmsnorm is None or table.mode == "virtual"
    check(table.rmsnorm)
    c._table = dataclasses.replace(table, rmsnorm=None)
    c._choices.clear()
    assert check(None) >= {"unfused"} and len(check(None)) >= 2
    for rows, row_bytes, want in ((1, wide, "fused"), (most, 1 << 20, "fused"), (most + 1, wide, "unfused"),
                                  (1, wide - 1, "unfused")):
        assert rmsnorm_rules.choose(None, rows, row_bytes, "fused") == want
    own = rmsnorm_rules.Rules((rmsnorm_rules.Rule(16, 8192, "oneshot_sentinel"),
                               rmsnorm_rules.Rule(64, 1 << 20, "oneshot_ll")))
    c._table = dataclasses.replace(table, rmsnorm=own)
    c._choices.clear()
    assert check(own) == {"oneshot_sentinel", "oneshot_ll", "unfused"}
    assert c.selected_rmsnorm_algorithm(16 * 8192, torch.bfloat16, 16) == "oneshot_sentinel"
    assert c.selected_rmsnorm_algorithm(17 * 8192, torch.bfloat16, 17) == "oneshot_ll"
    assert c.selected_rmsnorm_algorithm(65 * 8192, torch.bfloat16, 65) == "unfused"


@pytest.mark.parametrize("dtype", rmsnorm.DTYPES_SUPPORTED, ids=str)
def test_unfused_geometry_covers_each_line_once(dtype: torch.dtype) -> None:
    """kernels/add_rmsnorm.cu: one block per row (up to UNFUSED_MAX_GRID blocks), 16-byte lines,
    abi.add_rmsnorm_slots chunks of 32 lines per warp and pass (4 for fp32, 2 for 16-bit types), the
    fewest warps that hold the row in one pass up to abi.ADD_RMSNORM_MAX_THREADS threads, no empty
    pass; a row of up to abi.ADD_RMSNORM_PASS_ELEMS elements is one pass, in every dtype;
    rmsnorm.geometry("unfused", ...) is it."""
    dt = DTYPES[dtype]
    slots = {4: 4, 2: 2}[dt.size]
    for rows in (1, 3, 17, 70000):
        for hidden in (1, 7, 1000, 4096, 5120, 8192, 16384, rmsnorm.MAX_HIDDEN):
            g = rmsnorm.unfused_geometry(dt, rows, hidden)
            assert g == rmsnorm.geometry("unfused", dtype, rows, hidden, 8)
            assert (g.row_blocks, g.slots, g.elems_per_line) == (1, slots, layout.LINE_BYTES // dt.size)
            assert g.blocks == min(rows, rmsnorm.UNFUSED_MAX_GRID)
            assert g.threads % layout.WARP == 0 and g.threads <= abi.ADD_RMSNORM_MAX_THREADS
            assert g.row_lines == -(-hidden // g.elems_per_line)
            per_pass = g.threads * slots
            assert g.passes * per_pass >= g.row_lines > (g.passes - 1) * per_pass
            if g.passes > 1:
                assert g.threads == abi.ADD_RMSNORM_MAX_THREADS
            else:  # one warp fewer would not hold the row
                assert (g.threads - layout.WARP) * slots < g.row_lines or g.threads == layout.WARP
            assert (g.passes == 1) == (hidden <= 8192), (hidden, g)


def test_the_reference_rounds_the_sum_before_the_residual() -> None:
    """r = round(float(round(sum)) + float(residual)): the AllReduce's rounded output, then the
    residual add rounded again (the unfused path's two roundings, now every algorithm's), and y the
    RMSNorm of that r; the reference of one input, the rounded sum, gives the same bits."""
    gen = torch.Generator().manual_seed(5)
    xs = [torch.randn(5, 1000, generator=gen).to(torch.bfloat16) for _ in range(2)]
    res = torch.randn(5, 1000, generator=gen).to(torch.bfloat16)
    w = torch.randn(1000, generator=gen).to(torch.bfloat16)
    s = (xs[0].float() + xs[1].float()).to(torch.bfloat16)
    y, r = rmsnorm.reference(xs, res, w, 1e-6)
    assert torch.equal(r, (s.float() + res.float()).to(torch.bfloat16))
    once = (xs[0].float() + xs[1].float() + res.float()).to(torch.bfloat16)
    assert not torch.equal(r, once)  # one rounding would give other bits: the test can tell
    y1, r1 = rmsnorm.reference([s], res, w, 1e-6)
    assert torch.equal(y.view(torch.int16), y1.view(torch.int16)) and torch.equal(r.view(torch.int16),
                                                                                  r1.view(torch.int16))
    want = torch.nn.functional.rms_norm(r.float(), (1000,), w.float(), 1e-6)
    assert torch.allclose(y.float(), want, rtol=2e-2, atol=2e-2)


def test_add_rmsnorm_kernel_compiles_for_every_dtype(tmp_path, monkeypatch) -> None:
    pytest.importorskip("cuda.core")
    monkeypatch.setenv("SOLLAT_CACHE_DIR", str(tmp_path))
    src = build.kernel_source("add_rmsnorm.cu")
    assert "SOLLAT_ADD_RMSNORM_PARAMS" in src
    for dtype, table_ranks in itertools.product(rmsnorm.DTYPES_SUPPORTED, (1, 8)):
        build.compile_cubin(src, name="add_rmsnorm", arch="sm_90",
                            defines=rmsnorm_epilogue.defines(DTYPES[dtype], table_ranks))


# ---- the FP8 copy (fp8_scale / fp8_out) -----------------------------------------------------------
FP8 = torch.float8_e4m3fn


def check_fp8(scale, q=None, x=None, res=None, w=None, out=None, res_out=None):
    x, res, w = (x, res, w) if x is not None else args(3, 8)
    xc, rc, wc, y, r_out, *_ = check(x, res, w, out, res_out)
    return rmsnorm_checks.check_fp8(scale, q, xc, (xc, rc, wc), (y, r_out), CPU)


def test_fp8_arguments_valid() -> None:
    assert check_fp8(None) is None
    for shape in ((), (1,), (1, 1)):  # vLLM's scale is [1]; any one-element float32 tensor is accepted
        scale, q = check_fp8(torch.ones(shape))
        assert q.shape == (3, 8) and q.dtype == FP8 and q.is_contiguous() and scale.numel() == 1
    given = torch.empty(3, 8, dtype=FP8)
    assert check_fp8(torch.ones(1), given)[1] is given
    view = torch.ones(4)[2:3]  # a one-element view at an offset: the kernel reads its data_ptr
    assert check_fp8(view)[0] is view


@pytest.mark.parametrize("scale,match", [
    (torch.ones(1, dtype=torch.float16), "must be one torch.float32 element"),
    (torch.ones(1, dtype=torch.float64), "must be one torch.float32 element"),
    (torch.ones(1, dtype=torch.bfloat16), "must be one torch.float32 element"),
    (torch.ones(2), r"fp8_scale is \(2,\) torch.float32; it must be one"),
    (torch.ones(0), r"fp8_scale is \(0,\)"),
    (torch.ones(1, device="meta"), "fp8_scale is on meta but the communicator is on cpu"),
])
def test_fp8_scale_errors(scale: torch.Tensor, match: str) -> None:
    with pytest.raises(sollat.UnsupportedError, match=match):
        check_fp8(scale)


def test_fp8_scale_must_be_a_tensor() -> None:
    with pytest.raises(TypeError, match="fp8_scale must be a torch.Tensor"):
        check_fp8(1.0)


@pytest.mark.parametrize("q,match", [
    (torch.empty(3, 8, dtype=torch.uint8), r"fp8_out is \(3, 8\) torch.uint8, expected \(3, 8\) torch.float8_e4m3fn"),
    (torch.empty(3, 8, dtype=torch.float8_e5m2), "torch.float8_e5m2, expected"),
    (torch.empty(3, 8, dtype=torch.bfloat16), "torch.bfloat16, expected"),
    (torch.empty(3, 7, dtype=FP8), r"fp8_out is \(3, 7\)"),
    (torch.empty(24, dtype=FP8), r"fp8_out is \(24,\)"),
    (torch.empty(3, 8, dtype=FP8, device="meta"), "fp8_out is on meta"),
    (torch.empty(8, 3, dtype=FP8).t(), "fp8_out must be contiguous"),
])
def test_fp8_out_errors(q: torch.Tensor, match: str) -> None:
    with pytest.raises(sollat.UnsupportedError, match=match):
        check_fp8(torch.ones(1), q)


def test_fp8_out_without_scale_is_an_error() -> None:
    with pytest.raises(sollat.UnsupportedError, match="fp8_out was given without fp8_scale"):
        check_fp8(None, torch.empty(3, 8, dtype=FP8))
    with pytest.raises(TypeError, match="fp8_out must be a torch.Tensor"):
        check_fp8(torch.ones(1), [0] * 24)


def test_fp8_memory_may_not_be_shared() -> None:
    x, res, w = args(3, 8, torch.float32)

    def inside(t: torch.Tensor) -> torch.Tensor:  # a (3, 8) e4m3 view of t's first 24 bytes
        return t.view(-1).view(torch.uint8)[:24].view(FP8).view(3, 8)

    for t in (x, res, w.repeat(3)):
        with pytest.raises(sollat.UnsupportedError, match="fp8_out shares memory"):
            check_fp8(torch.ones(1), inside(t), x, res, t[:8] if t.dim() == 1 else w)
    out, r_out = torch.empty(3, 8), torch.empty(3, 8)
    for kw in ({"out": out}, {"res_out": r_out}):
        target = out if "out" in kw else r_out
        with pytest.raises(sollat.UnsupportedError, match="fp8_out shares memory"):
            check_fp8(torch.ones(1), inside(target), x, res, w, **kw)
        with pytest.raises(sollat.UnsupportedError, match="fp8_scale lies inside an output"):
            check_fp8(target.view(-1)[5:6], None, x, res, w, **kw)
    q = torch.empty(32, dtype=FP8)
    with pytest.raises(sollat.UnsupportedError, match="fp8_scale lies inside an output"):
        check_fp8(q.view(torch.float32)[2:3], q[:24].view(3, 8), x, res, w)
    # the scale inside an input is only read, as the inputs are: allowed
    assert check_fp8(w[2:3], None, x, res, w) is not None


def test_fp8_virtual_argument_lists() -> None:
    c = fake_virtual(2)
    c.device = CPU
    x, res, w = args()
    with pytest.raises(sollat.UnsupportedError, match="needs fp8_scale as a list of 2 tensors, got 3 tensors"):
        _public(c, [x] * 2, [res, res.clone()], [w] * 2, 1e-6, "auto", None, None,
                                   [torch.ones(1)] * 3, None)
    with pytest.raises(sollat.UnsupportedError, match="needs fp8_out as a list of 2 tensors, got a single tensor"):
        _public(c, [x] * 2, [res, res.clone()], [w] * 2, 1e-6, "auto", None, None,
                                   [torch.ones(1)] * 2, torch.empty(3, 8, dtype=FP8))
    with pytest.raises(sollat.UnsupportedError, match=r"fp8_scale\[1\] is \(1,\) torch.float64"):
        _public(c, [x] * 2, [res, res.clone()], [w] * 2, 1e-6, "auto", None, None,
                                   [torch.ones(1), torch.ones(1, dtype=torch.float64)], None)
    with pytest.raises(sollat.UnsupportedError, match="fp8_out was given without fp8_scale"):
        _public(c, [x] * 2, [res, res.clone()], [w] * 2, 1e-6, "auto", None, None, None,
                                   [torch.empty(3, 8, dtype=FP8)] * 2)
    q = torch.empty(3, 8, dtype=FP8)
    with pytest.raises(sollat.UnsupportedError, match=r"fp8_out\[1\] shares memory"):  # one launch writes both
        _public(c, [x] * 2, [res, res.clone()], [w] * 2, 1e-6, "auto", None, None,
                                   [torch.ones(1)] * 2, [q, q])
    qs = torch.empty(2, 3, 8, dtype=FP8)
    with pytest.raises(sollat.UnsupportedError, match="fp8_scale lies inside another rank's fp8_out"):
        _public(c, [x] * 2, [res, res.clone()], [w] * 2, 1e-6, "auto", None, None,
                                   [qs[1].view(-1)[:4].view(torch.float32), torch.ones(1)], [qs[0], qs[1]])
    # zero rows: nothing launched, the copies still returned (allocated, empty)
    x0, res0, w0 = args(0, 8)
    ys, rs, qs2 = _public(c, [x0] * 2, [res0, res0.clone()], [w0] * 2, 1e-6, "auto", None, None,
                                             [torch.ones(1)] * 2, None)
    assert [q.shape for q in qs2] == [(0, 8)] * 2 and all(q.dtype == FP8 for q in qs2)


def test_fp8_signature_marks_the_call_and_leaves_plain_calls_alone() -> None:
    dt = DTYPES[torch.bfloat16]
    plain = rmsnorm.signature_text("rmsnorm_oneshot_ll", dt, 4, 4096, 0x358637BD)
    assert plain == "rmsnorm_oneshot_ll|bf16|rows=4|hidden=4096|eps=0x358637bd"  # as before the FP8 copy
    assert rmsnorm.signature_text("rmsnorm_oneshot_ll", dt, 4, 4096, 0x358637BD, fp8=True) == plain + "|fp8"
    assert rmsnorm.signature("rmsnorm_oneshot_ll", dt, 4, 4096, 1) != rmsnorm.signature("rmsnorm_oneshot_ll", dt, 4,
                                                                                          4096, 1, fp8=True)


# e4m3fn in rational arithmetic: every finite code and its value (0x7F / 0xFF are NaN).
def _e4m3_value(code: int) -> Fraction:
    sign = -1 if code & 0x80 else 1
    exp, man = (code >> 3) & 0xF, code & 0x7
    mag = Fraction(man, 8) * Fraction(2) ** -6 if exp == 0 else (1 + Fraction(man, 8)) * Fraction(2) ** (exp - 7)
    return sign * mag


_E4M3 = [(c, _e4m3_value(c)) for c in range(256) if c & 0x7F != 0x7F]


def _exact_e4m3(v: float) -> int:
    """What the kernel writes for the float32 quotient ``v``: NaN -> 0x7F; else clamp to +-448
    (+-Inf included) and round to the nearest e4m3 value, ties to the even code (mantissa LSB 0);
    the sign of a zero result is the sign of v."""
    if math.isnan(v):
        return abi.FP8_E4M3_NAN
    c = max(-abi.FP8_E4M3_MAX, min(abi.FP8_E4M3_MAX, v))
    x = Fraction(c)
    best = min(_E4M3, key=lambda cv: (abs(cv[1] - x), cv[0] & 1, cv[0]))
    code = best[0]
    if best[1] == 0:
        code = 0x80 if math.copysign(1.0, v) < 0 else 0x00
    return code


def _f32(v: float) -> float:
    return float(np.float32(v))


@np.errstate(over="ignore")
def _boundary_values() -> list[float]:
    """Every e4m3 value and every midpoint between neighbours, each with its float32 neighbours;
    float32 denormals; the ends of the range (+-448, 464 = the tie above 448, 480); zeros, Inf, NaN."""
    mags = sorted({cv[1] for cv in _E4M3 if cv[1] >= 0})
    points = [float(m) for m in mags] + [float((a + b) / 2) for a, b in zip(mags, mags[1:], strict=False)]
    points += [448.0, 456.0, 464.0, 472.0, 480.0, 500.0, 1e30, float(np.finfo(np.float32).max), 2.0 ** -10,
               3 * 2.0 ** -11, 1e-40, 1.4e-45, np.finfo(np.float32).tiny]
    out: list[float] = []
    for p in points:
        f = np.float32(p)
        for v in (np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf))):  # max's: Inf
            out += [float(v), -float(v)]
    return out + [0.0, -0.0, math.inf, -math.inf, math.nan]


def test_fp8_conversion_is_round_to_nearest_even_saturating() -> None:
    """fp8_reference with scale 1 against rational arithmetic at every rounding boundary: ties to
    even (1.0625 -> 1.0, 1.1875 -> 1.25, 232 -> 224, 1.5 * 2^-9 -> 2^-8), e4m3 subnormals, float32
    denormals to +-0, -0.0 -> 0x80, 448 < |v| (464, 480, Inf) -> +-448, NaN -> 0x7F."""
    vals = _boundary_values()
    got = rmsnorm.fp8_reference(torch.tensor(vals, dtype=torch.float32), torch.ones(1)).view(torch.uint8).tolist()
    want = [_exact_e4m3(_f32(v)) for v in vals]
    bad = [(v, g, w) for v, g, w in zip(vals, got, want, strict=True) if g != w]
    assert not bad, bad[:10]
    spot = {1.0625: 0x38, 1.1875: 0x3A, 232.0: 0x76, 1.5 * 2.0 ** -9: 0x02, 0.5 * 2.0 ** -9: 0x00, -0.0: 0x80,
            464.0: 0x7E, -math.inf: 0xFE, 448.0: 0x7E, 2.0 ** -9: 0x01}
    for v, code in spot.items():
        assert rmsnorm.fp8_reference(torch.tensor([v]), torch.ones(1)).view(torch.uint8).item() == code, v


def test_fp8_nan_is_one_byte_whatever_its_sign_and_payload() -> None:
    bits = torch.tensor([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFBFFFFF], dtype=torch.int64).to(torch.int32)
    q = rmsnorm.fp8_reference(bits.view(torch.float32), torch.ones(1)).view(torch.uint8)
    assert q.tolist() == [abi.FP8_E4M3_NAN] * 4
    # torch keeps the sign (0xFF): the one place the reference departs from a plain .to(float8_e4m3fn)
    assert torch.tensor([-math.nan]).to(FP8).view(torch.uint8).item() == 0xFF


@pytest.mark.parametrize("dtype", rmsnorm.DTYPES_SUPPORTED, ids=str)
def test_fp8_division_is_correctly_rounded(dtype: torch.dtype) -> None:
    """float(y) / scale as the kernel's div.rn: the float32 nearest the exact quotient, then e4m3.
    Scales of every kind (not powers of two, so the quotient is rounded; tiny and huge; 0: +-Inf
    -> +-448 and 0 / 0 -> NaN; negative: the sign flips; Inf: +-0)."""
    gen = torch.Generator().manual_seed(5)
    y = (torch.randn(400, generator=gen) * torch.exp2(torch.randint(-20, 12, (400,), generator=gen).float()))
    y = torch.cat([y, torch.tensor([0.0, -0.0, 1e-40, -3e-39, 65504.0, float("inf"), float("-inf"),
                                    float("nan")])]).to(dtype)
    for scale in (1.0, 0.1, 3.0, 1 / 3, 7e-3, 2.5e4, 1e-30, 0.0, -0.37, float("inf")):
        s = torch.tensor([scale], dtype=torch.float32)
        got = rmsnorm.fp8_reference(y, s).view(torch.uint8).tolist()
        sf = Fraction(float(s.item())) if math.isfinite(s.item()) else None
        for v, g in zip(y.float().tolist(), got, strict=True):
            if sf is None or sf == 0 or not math.isfinite(v):  # IEEE special cases: numpy's float32 division
                with np.errstate(divide="ignore", invalid="ignore"):
                    quotient = _f32(np.float32(v) / np.float32(s.item())) if v == v else math.nan
            else:
                quotient = _nearest_float32(Fraction(v) / sf) if v != 0 else math.copysign(0.0, v) * math.copysign(
                    1.0, s.item())
                if abs(quotient) > float(np.finfo(np.float32).max):
                    quotient = math.copysign(math.inf, quotient)
            assert g == _exact_e4m3(quotient), (dtype, scale, v, g)


def test_fp8_reference_of_adversarial_rows() -> None:
    """Through the RMSNorm reference: a NaN row quantises to 0x7F everywhere, an Inf row to 0x7F
    and zeros, a zero row to zeros of y's signs."""
    x = torch.tensor([[1.0, float("nan"), 2.0], [float("inf"), 1.0, 1.0], [-0.0, -0.0, -0.0], [300.0, -1.0, 2.0]])
    neg0 = torch.full_like(x, -0.0)
    y, _ = rmsnorm.reference([x, neg0], neg0, torch.tensor([1.0, 2.0, -3.0]), 1e-6)
    q = rmsnorm.fp8_reference(y, torch.tensor([0.01])).view(torch.uint8)
    assert q[0].tolist() == [0x7F] * 3 and q[1].tolist() == [0x7F, 0x00, 0x80]
    assert q[2].tolist() == [0x80, 0x80, 0x00]  # -0 * rstd * w: the weight's sign
    assert rmsnorm.fp8_reference(y, torch.tensor([1e-3])).view(torch.uint8)[3, 0].item() == 0x7E  # 1732: 448
    assert q.shape == y.shape and rmsnorm.fp8_reference(y, torch.tensor(1.0)).dtype == FP8
    for v, g in zip(y.flatten().tolist(), q.flatten().tolist(), strict=True):
        assert g == _exact_e4m3(_nearest_float32(Fraction(v) / Fraction(_f32(0.01))) if math.isfinite(v) and v != 0
                                else (math.nan if v != v else math.copysign(0.0, v)))


def test_fp8_fake_functions() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(5, 7, dtype=torch.bfloat16)
        w = torch.empty(7, dtype=torch.bfloat16)
        s = torch.empty(1)
        y, r, q = torch.ops.sollat.all_reduce_rmsnorm_fp8([x], [x], [w], [s], 1, 1e-6, "auto")
        assert y.shape == r.shape == q.shape == (5, 7) and y.dtype == torch.bfloat16 and q.dtype == FP8
        flat = torch.ops.sollat.all_reduce_rmsnorm_fp8([x] * 3, [x] * 3, [w] * 3, [s] * 3, 1, 1e-6, "oneshot_ll")
        assert len(flat) == 9 and [t.dtype for t in flat] == [torch.bfloat16] * 6 + [FP8] * 3
        assert all(t.shape == (5, 7) for t in flat)


class _CpuFp8Stub(_CpuStub):
    """The plain stub plus the FP8 copy (the reference's y quantised by the reference)."""

    def _all_reduce_rmsnorm_ranks(self, xs, residuals, weights, eps, algo, outs, r_outs, fp8_outs=None,
                                  scales=None):
        got = super()._all_reduce_rmsnorm_ranks(xs, residuals, weights, eps, algo, outs, r_outs)
        if scales is None:
            return got
        qs = [rmsnorm.fp8_reference(y, s) for y, s in zip(got[0], scales, strict=True)]
        if fp8_outs is not None:
            qs = [o.copy_(q) for o, q in zip(fp8_outs, qs, strict=True)]
        return (*got, qs)


def test_fp8_compiled_calls_keep_one_graph() -> None:
    real, virt = _stub_communicators(_CpuFp8Stub(2))

    def step(x, res, w, scale, q_out):
        y, r, q = real.all_reduce_rmsnorm(x, res, w, 1e-5, residual_out=res, fp8_scale=scale, fp8_out=q_out)
        ys, rs, qs = virt.all_reduce_rmsnorm([x, y], [r, r.clone()], w, 1e-5, fp8_scale=scale)
        y2, r2 = real.all_reduce_rmsnorm(x, r, w, 1e-5)  # the plain call is unchanged: two results
        return ys[0] + rs[1] + y2 + r2, q.view(torch.uint8).int() + qs[1].view(torch.uint8).int()

    x, res, w = torch.randn(4, 16), torch.randn(4, 16), torch.randn(16)
    scale = torch.tensor([0.05])
    res_eager, q_eager = res.clone(), torch.empty(4, 16, dtype=FP8)
    expect = step(x, res_eager, w, scale, q_eager)
    compiled = torch.compile(step, fullgraph=True, backend="eager")
    res_c, q_c = res.clone(), torch.empty(4, 16, dtype=FP8)
    got = compiled(x, res_c, w, scale, q_c)
    assert torch.equal(got[0], expect[0]) and torch.equal(got[1], expect[1])
    assert torch.equal(res_c, res_eager) and torch.equal(q_c.view(torch.uint8), q_eager.view(torch.uint8))
    with pytest.raises(Exception, match="fp8_out was given without fp8_scale"):
        torch.compile(lambda a, b, c, d: real.all_reduce_rmsnorm(a, b, c, fp8_out=d), fullgraph=True,
                      backend="eager")(x, res, w, q_c)


def test_fp8_ops_module_exports() -> None:
    assert callable(ops.all_reduce_rmsnorm_fp8) and not hasattr(ops, "all_reduce_rmsnorm_fp8_virtual")


def test_fp8_instantiations_are_listed_and_only_for_the_fused_kernel() -> None:
    work = [d for f, d in instantiations.all_instantiations() if f == "allreduce_rmsnorm.cu"]
    fp8 = [d for d in work if d.get("SOLLAT_RMSNORM_FP8") == "1"]
    assert len(fp8) == len(work) // 2
    assert {tuple(sorted((k, v) for k, v in d.items() if k != "SOLLAT_RMSNORM_FP8")) for d in fp8} == {
        tuple(sorted(d.items())) for d in work if "SOLLAT_RMSNORM_FP8" not in d}
    alg = algorithms.ALGORITHMS["oneshot_ll"]
    with pytest.raises(ValueError, match="only the fused RMSNorm"):
        algorithms.kernel_defines(alg, DTYPES[torch.float32], "sum", 2, 1, False, True, fp8=True)
    plain = algorithms.kernel_defines(algorithms.RMSNORM_ALGORITHMS["rmsnorm_oneshot_ll"], DTYPES[torch.float32],
                                      "sum", 2, 1, False, True)
    assert "SOLLAT_RMSNORM_FP8" not in plain  # the plain module's defines, hence its cubin key, are unchanged


def test_a_rank_s_outputs_must_be_apart_from_other_ranks_tensors() -> None:
    """One launch serves every virtual rank: shared inputs are fine, a rank's out or residual_out
    sharing memory with another rank's tensors is refused, naming both."""
    dev = torch.device("cpu")
    x = [torch.zeros(2, 8) for _ in range(3)]
    w = torch.ones(8)
    res = torch.zeros(2, 8)

    def checked(outs: list[Any], routs: list[Any], residuals: list[Any]) -> list[tuple]:
        return [rmsnorm_checks.check_rank(x[r], residuals[r], w, outs[r], routs[r], dev, f"[{r}]") for r in range(3)]

    def suffix(r: int) -> str:
        return f"[{r}]"

    rmsnorm_checks.check_ranks_apart(checked([None] * 3, [None] * 3, [res] * 3), suffix)  # shared inputs
    rmsnorm_checks.check_ranks_apart(checked(x, [None] * 3, [res] * 3), suffix)  # out=x per rank
    with pytest.raises(sollat.UnsupportedError, match=r"residual\[0\] and residual_out\[1\] share memory|"
                                                      r"residual_out\[0\] and residual\[1\] share memory"):
        rmsnorm_checks.check_ranks_apart(checked([None] * 3, [res] * 3, [res] * 3), suffix)
    big = torch.zeros(4, 8)
    with pytest.raises(sollat.UnsupportedError, match=r"out\[0\] and out\[1\] share memory"):
        rmsnorm_checks.check_ranks_apart(checked([big[:2], big[1:3], None], [None] * 3, [res] * 3), suffix)
    with pytest.raises(sollat.UnsupportedError, match=r"x\[2\] and out\[1\] share memory|out\[1\] and x\[2\]"):
        rmsnorm_checks.check_ranks_apart(checked([None, x[2], None], [None] * 3, [res] * 3), suffix)
    rmsnorm_checks.check_ranks_apart(checked([None] * 3, [None] * 3, [res] * 3)[:1], suffix)  # one rank
