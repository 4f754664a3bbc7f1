"""The one-block-per-row fused AllReduce + RMSNorm (``oneshot_ll_block``,
kernels/allreduce_rmsnorm_block.cu): its registry entry, its cut (rmsnorm.block_row_geometry) and
its instantiations, without a GPU. Its bits are checked on GPUs (tests/gpu/test_rmsnorm.py,
test_batch_invariance.py)."""

from __future__ import annotations

import io
import re

import pytest
import torch

from sollat.collectives import algorithms, instantiations, rmsnorm, rmsnorm_block_build, rmsnorm_epilogue
from sollat.device import abi, build, layout
from sollat.device.dtypes import DTYPES

BLOCK = "oneshot_ll_block"
ALG = algorithms.RMSNORM_ALGORITHMS[rmsnorm.internal_name(BLOCK)]
BLOCKS = ("oneshot_ll_block", "oneshot_ll_block_pipe")  # the same kernel, its passes pipelined or not
PIPE = algorithms.RMSNORM_ALGORITHMS[rmsnorm.internal_name("oneshot_ll_block_pipe")]


def test_registered_as_an_explicit_fused_algorithm() -> None:
    assert rmsnorm.internal_name(BLOCK) == "rmsnorm_oneshot_ll_block" and rmsnorm.public_name(ALG.name) == BLOCK
    assert (ALG.kernel_file, ALG.kernel, ALG.proto, ALG.buffers) == ("allreduce_rmsnorm_block.cu", "ar_rmsnorm_block",
                                                                      "ll", 1)
    assert ALG.kernel in algorithms.RMSNORM_KERNELS and algorithms.collective_name(ALG) == rmsnorm.OPNAME
    assert BLOCK not in rmsnorm.AUTO_ALGOS  # auto never picks it until it is measured
    assert ALG.name not in algorithms.RMSNORM_EXPERIMENTAL
    # it runs on rmsnorm_oneshot_ll's region and epochs: no scratch of its own
    host = algorithms.RMSNORM_ALGORITHMS[ALG.region]
    assert (host.proto, host.buffers, host.max_blocks) == (ALG.proto, ALG.buffers, ALG.max_blocks)
    names = {r.name for r in algorithms.regions(("oneshot_ll",), 16)}
    assert ALG.region in names and ALG.name not in names
    # the pipelined build: the same kernel, file and region, one define more
    assert (PIPE.kernel_file, PIPE.kernel, PIPE.region, PIPE.name in names) == (ALG.kernel_file, ALG.kernel,
                                                                                 ALG.region, False)
    assert "oneshot_ll_block_pipe" not in rmsnorm.AUTO_ALGOS
    assert frozenset({PIPE.name}) == algorithms.RMSNORM_BLOCK_PIPELINED
    dt = DTYPES[torch.bfloat16]
    plain = algorithms.kernel_defines(ALG, dt, "sum", 4, 1, False, False)
    assert "SOLLAT_RMSNORM_BLOCK_PIPE" not in plain
    assert algorithms.kernel_defines(PIPE, dt, "sum", 4, 1, False, False) == {**plain, "SOLLAT_RMSNORM_BLOCK_PIPE": "1"}
    assert (8, 4) not in PIPE.slot_choices  # one receive group per pipelined pass
    # LL only: a sentinel buffer's signature word is one per (block, thread), which its receive
    # groups would share
    assert all(a.proto == "ll" for a in algorithms.RMSNORM_ALGORITHMS.values() if a.kernel == ALG.kernel)


def test_block_threads_define_only_for_the_block_kernel() -> None:
    dt = DTYPES[torch.bfloat16]
    for alg in (ALG, PIPE):
        for rmax, slots in alg.slot_choices:
            d = algorithms.kernel_defines(alg, dt, "sum", rmax, slots, False, False)
            want = algorithms.rmsnorm_block_threads(rmax, slots, alg is PIPE)
            assert int(d["SOLLAT_RMSNORM_BLOCK_THREADS"]) == want
            assert want in (rmsnorm_block_build.RMSNORM_BLOCK_NARROW_THREADS, abi.MAX_THREADS)
    for other in (*algorithms.ALGORITHMS.values(), *algorithms.RMSNORM_ALGORITHMS.values()):
        if other.kernel != ALG.kernel:
            rmax, slots = other.slot_choices[0]
            assert "SOLLAT_RMSNORM_BLOCK_THREADS" not in algorithms.kernel_defines(other, dt, "sum", rmax, slots,
                                                                                   False, True)


@pytest.mark.parametrize("algo", BLOCKS)
@pytest.mark.parametrize("dtype", rmsnorm.DTYPES_SUPPORTED, ids=str)
@pytest.mark.parametrize("r", [2, 3, 4, 8, 9, 72])
def test_block_geometry_covers_each_line_of_a_row_once(algo: str, dtype: torch.dtype, r: int) -> None:
    """One block per row, up to the instantiation's threads, every line of a row in exactly one
    (pass, slot, thread), no empty pass, the fewest passes the slot choices allow; pipelined rows of
    several passes leave half the blocks' channels to every other pass."""
    rmax = algorithms.max_ranks_template(r)
    alg = algorithms.RMSNORM_ALGORITHMS[rmsnorm.internal_name(algo)]
    pipelined = alg.name in algorithms.RMSNORM_BLOCK_PIPELINED
    for rows in (1, 3, 8, 17, 64):
        for hidden in (1, 7, 1000, 4096, 5000, 5120, 8192, 16384, rmsnorm.MAX_HIDDEN):
            g = rmsnorm.geometry(algo, dtype, rows, hidden, r)
            most = alg.max_blocks // 2 if pipelined and g.passes > 1 else alg.max_blocks
            assert g.row_blocks == 1 and g.blocks == min(rows, most)
            assert (rmax, g.slots) in alg.slot_choices
            assert g.threads % layout.WARP == 0
            assert g.threads <= algorithms.rmsnorm_block_threads(rmax, g.slots, pipelined)
            lines = [(p * g.slots + i) * g.threads + t for p in range(g.passes) for i in range(g.slots)
                     for t in range(g.threads)]
            assert len(set(lines)) == len(lines) and set(range(g.row_lines)) <= set(lines)
            assert g.row_lines > (g.passes - 1) * g.slots * g.threads  # no empty pass
            # the kernel's own count of passes (allreduce_rmsnorm_block.cu) is the geometry's
            assert g.passes == layout.ceil_div(g.row_lines, g.threads * g.slots)
            fewest = min(layout.ceil_div(g.row_lines, s * algorithms.rmsnorm_block_threads(rmax, s, pipelined))
                         for q, s in alg.slot_choices if q == rmax)
            assert g.passes == fewest
    # fewer blocks at once (a virtual communicator's retry): more rows per block, the same cut of a row
    full = rmsnorm.row_geometry(alg, DTYPES[dtype], 8, 8192, 2)
    for limit in (2, 6, 14):
        g = rmsnorm.row_geometry(alg, DTYPES[dtype], 8, 8192, 2, limit)
        assert g.blocks == min(8, limit // 2 if pipelined and g.passes > 1 else limit)
        assert (g.threads, g.slots, g.passes) == (full.threads, full.slots, full.passes)


def test_block_decode_rows() -> None:
    """A decode row of 4096 16-bit elements is one block: one pass at 2 ranks, two at 8 (whose
    builds have at most 2 slots: 4 spilled at 255 registers for sm_100); the pipelined build takes
    8192 in passes of 512 lines at 8 ranks."""
    for r, passes in ((2, 1), (8, 2)):
        g = rmsnorm.geometry(BLOCK, torch.bfloat16, 1, 4096, r)
        assert (g.blocks, g.passes, g.row_blocks) == (1, passes, 1)
    assert rmsnorm.geometry(BLOCK, torch.bfloat16, 1, 4096, 8).slots == 2
    g = rmsnorm.geometry("oneshot_ll_block_pipe", torch.bfloat16, 16, 8192, 8)
    assert (g.blocks, g.threads, g.slots, g.passes) == (16, 256, 2, 4)


def test_block_instantiations_are_listed() -> None:
    work = [d for f, d in instantiations.all_instantiations() if f == ALG.kernel_file]
    # real/virtual x plain/FP8, both builds
    assert len(work) == sum(len(a.dtypes) * len(a.slot_choices) * 2 * 2 for a in (ALG, PIPE))
    assert {d["SOLLAT_PROTO"] for d in work} == {"ProtoLL"}


def test_epilogue_variants_change_only_their_builds_and_cut() -> None:
    """The default epilogue adds no define (its build is the one measured); a variant's slots go to
    both its build and its geometry (one pass for rows up to 8192 16-bit elements at 2 slots), inside its context only."""
    dt = DTYPES[torch.bfloat16]
    plain = rmsnorm_epilogue.defines(dt, 8)
    assert plain == {"SOLLAT_T": dt.cxx, "SOLLAT_TABLE_RANKS": "8"}
    v = rmsnorm_epilogue.Variant(2, True)
    with rmsnorm_epilogue.variant(v):
        assert rmsnorm_epilogue.defines(dt, 8) == {**plain, "SOLLAT_ADD_RMSNORM_SLOTS": "2",
                                                   "SOLLAT_ADD_RMSNORM_POW2_MEAN": "1"}
    assert rmsnorm_epilogue.defines(dt, 8) == plain
    for hidden in (4096, 8192):
        g = rmsnorm.unfused_geometry(dt, 4, hidden, 2)
        assert (g.slots, g.passes) == (2, 1) and g.threads * 2 * layout.WARP >= g.row_lines
    assert rmsnorm.unfused_geometry(dt, 4, 8192) == rmsnorm.unfused_geometry(dt, 4, 8192, abi.add_rmsnorm_slots(dt.size))
    with pytest.raises(ValueError, match="slots must be 1, 2 or 4"), rmsnorm_epilogue.variant(rmsnorm_epilogue.Variant(3)):
        pass


cuda_core = pytest.importorskip("cuda.core")


def _ptxas(defines: dict[str, str]) -> tuple[str, bytes]:
    from cuda.core import Program, ProgramOptions

    opts = build._options("sm_90", defines)
    o = ProgramOptions(**{**{f: getattr(opts, f) for f in opts.__dataclass_fields__}, "ptxas_options": "-v"})
    log = io.StringIO()
    cubin = Program(build.kernel_source(ALG.kernel_file), code_type="c++", options=o).compile("cubin", logs=log)
    return log.getvalue(), bytes(cubin.code)


def _spills(report: str) -> dict[str, int]:
    return dict(zip(re.findall(r"Function properties for (\w+)", report),
                    (int(s) for s in re.findall(r"(\d+) bytes spill stores", report)), strict=True))


@pytest.mark.parametrize("algo,dtype,rmax,slots,fp8,real", [(BLOCK, torch.bfloat16, 8, 2, False, False),  # 2 groups
                                                            (BLOCK, torch.float32, 2, 2, True, True),
                                                            (BLOCK, torch.float16, 72, 1, True, False),  # wide
                                                            ("oneshot_ll_block_pipe", torch.bfloat16, 8, 2, True, False),
                                                            ("oneshot_ll_block_pipe", torch.float16, 2, 4, False, True)])
def test_block_kernel_compiles_one_entry_without_spills(algo: str, dtype: torch.dtype, rmax: int, slots: int,
                                                        fp8: bool, real: bool) -> None:
    alg = algorithms.RMSNORM_ALGORITHMS[rmsnorm.internal_name(algo)]
    d = algorithms.kernel_defines(alg, DTYPES[dtype], "sum", rmax, slots, False, real, fp8=fp8)
    report, cubin = _ptxas(d)
    entry = abi.rmsnorm_entry(ALG.kernel, fp8)
    assert _spills(report) == {entry: 0}
    assert f"{entry}\0".encode() in cubin and f"{abi.rmsnorm_entry(ALG.kernel, not fp8)}\0".encode() not in cubin


@pytest.mark.parametrize("variant", [rmsnorm_epilogue.Variant(1, True), rmsnorm_epilogue.Variant(2)], ids=str)
def test_epilogue_variants_compile_without_spills(variant: rmsnorm_epilogue.Variant) -> None:
    from cuda.core import Program, ProgramOptions

    for dtype in rmsnorm.DTYPES_SUPPORTED:
        with rmsnorm_epilogue.variant(variant):
            d = rmsnorm_epilogue.defines(DTYPES[dtype], 8)
        opts = build._options("sm_90", d)
        o = ProgramOptions(**{**{f: getattr(opts, f) for f in opts.__dataclass_fields__}, "ptxas_options": "-v"})
        log = io.StringIO()
        Program(build.kernel_source(rmsnorm_epilogue.KERNEL_FILE), code_type="c++", options=o).compile("cubin", logs=log)
        assert _spills(log.getvalue()) == {abi.ADD_RMSNORM_ENTRY: 0}, d
