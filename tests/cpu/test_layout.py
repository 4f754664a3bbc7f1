from __future__ import annotations

import itertools
import re

import pytest

from sollat.collectives.algorithms import ALGORITHMS
from sollat.device import abi, abi_header, abi_layout, formula, layout


@pytest.mark.parametrize("lines", [1, 2, 31, 32, 33, 511, 512, 513, 4096, 8191, 65536, 10**6, 10**7])
@pytest.mark.parametrize("max_blocks", [1, 4, 16])
@pytest.mark.parametrize("max_slots", [1, 2, 3, 4])
@pytest.mark.parametrize("max_threads", [abi.SPILL_FREE_THREADS, layout.MAX_THREADS])
def test_plan_covers_every_line(lines: int, max_blocks: int, max_slots: int, max_threads: int) -> None:
    g = layout.plan(lines, max_blocks=max_blocks, max_slots=max_slots, max_threads=max_threads)
    assert 1 <= g.blocks <= max_blocks
    assert g.threads % 32 == 0 and g.threads <= max_threads
    assert g.slots <= max_slots
    assert g.lines_per_iteration * g.iterations >= lines
    assert g.lines_per_iteration * (g.iterations - 1) < lines  # no empty iteration


def test_plan_spreads_over_blocks_before_widening_them() -> None:
    bt = layout.BLOCK_THREADS
    assert layout.plan(bt, max_blocks=16) == layout.Geometry(1, bt, 1, 1)  # one block of just enough warps
    assert layout.plan(40, max_blocks=16) == layout.Geometry(1, 64, 1, 1)
    assert layout.plan(bt + 1, max_blocks=16) == layout.Geometry(2, bt, 1, 1)
    assert layout.plan(16 * bt, max_blocks=16) == layout.Geometry(16, bt, 1, 1)
    # all blocks in use: widen in steps of bt, then more lines per thread
    assert layout.plan(16 * bt + 1, max_blocks=16) == layout.Geometry(16, 2 * bt, 1, 1)
    assert layout.plan(16 * 512 * 2, max_blocks=16, max_slots=4) == layout.Geometry(16, 512, 2, 1)
    assert layout.plan(2048, max_blocks=16, block_threads=512) == layout.Geometry(4, 512, 1, 1)
    # a kernel capped below MAX_THREADS: more lines per thread instead of wider blocks
    assert layout.plan(16 * 512 * 2, max_blocks=16, max_slots=4, max_threads=256) == layout.Geometry(16, 256, 4, 1)


def test_every_kernel_launches_within_its_launch_bounds() -> None:
    """An algorithm's plan never gives its kernel more threads than the __launch_bounds__ its build
    gets (SOLLAT_BLOCK_THREADS below abi.MAX_THREADS, collective.h's default otherwise)."""
    from sollat.collectives import algorithms
    from sollat.device.dtypes import DTYPES

    capped = {k.name for k in abi.KERNELS.values() if k.threads < layout.MAX_THREADS}
    assert capped == {"oneshot", "twoshot", "ll128", "reduce_scatter"}
    for alg in (*ALGORITHMS.values(), *algorithms.GATHER_SCATTER_ALGORITHMS.values()):
        rmax, slots = alg.slot_choices[0]
        d = algorithms.kernel_defines(alg, DTYPES[next(iter(alg.dtypes))], next(iter(alg.ops)), rmax, slots, False, True)
        bound = int(d.get("SOLLAT_BLOCK_THREADS", layout.MAX_THREADS))
        assert bound == alg.max_threads == abi.KERNELS[alg.kernel].threads
        assert (alg.kernel in capped) == ("SOLLAT_BLOCK_THREADS" in d)
        if alg.peer_groups:
            continue
        for lines in (1, 129, 4096, 10**5, 10**7):
            g = layout.plan(lines, max_blocks=alg.max_blocks, max_slots=alg.max_slots(rmax), max_threads=alg.max_threads)
            assert g.threads <= bound, (alg.name, lines, g)


def test_slot_indices_are_unique_and_fit() -> None:
    max_blocks = 16
    seen = set()
    for b in range(max_blocks):
        for i in range(layout.MAX_SLOTS):
            for t in (0, 1, 255, 511):
                s = layout.slot_index(b, i, t)
                assert s not in seen
                assert 0 <= s < layout.lines_per_src(max_blocks)
                seen.add(s)


def test_line_index_regions_do_not_overlap() -> None:
    nranks, lps = 4, layout.lines_per_src(2)
    lines = {layout.line_index(p, src, s, nranks=nranks, lines_per_src=lps)
             for p in (0, 1) for src in range(nranks) for s in (0, lps - 1)}
    assert len(lines) == 2 * nranks * 2
    assert max(lines) < 2 * nranks * lps


@pytest.mark.parametrize("name", list(ALGORITHMS))
@pytest.mark.parametrize("nranks", [2, 3, 4, 8])
def test_scratch_sizing(name: str, nranks: int) -> None:
    alg = ALGORITHMS[name]
    lps = alg.max_blocks * layout.MAX_SLOTS * layout.MAX_THREADS
    per_region = 2 * nranks * lps * layout.LINE_BYTES
    assert alg.scratch_bytes(nranks) == alg.buffers * per_region
    assert alg.epoch_words() == alg.buffers * lps


@pytest.mark.parametrize("max_blocks", [1, 4, 16, 17, 32, 100, 128])
def test_signature_words_fill_the_signature_slot_and_no_data_channel(max_blocks: int) -> None:
    """One 4-byte word per (block, thread) of a (parity, source) part, inside the part, each once,
    in the SIGNATURE_SLOT lines of its own block (their first quarter); a warp's 32 words are one
    aligned 128-byte line; the data channels of a sentinel buffer (slots below SIGNATURE_SLOT) never
    reach them. LL128's 8-byte words: the first half of the same lines, each once."""
    lps = layout.lines_per_src(max_blocks)
    words = [layout.signature_word(b, t) for b in range(max_blocks) for t in range(layout.MAX_THREADS)]
    assert len(set(words)) == len(words), "two threads share a signature word"
    assert max(words) < 4 * lps  # inside the part
    for b in (0, max_blocks - 1):
        first = layout.slot_index(b, layout.SIGNATURE_SLOT, 0)
        lines = {layout.signature_word(b, t) // 4 for t in range(layout.MAX_THREADS)}
        assert lines == set(range(first, first + layout.MAX_THREADS // 4))
        data = {layout.slot_index(b, i, t) for i in range(layout.SIGNATURE_SLOT) for t in range(layout.MAX_THREADS)}
        assert not lines & data
        ll128 = {layout.ll128_signature_word(b, t) // 2 for t in range(layout.MAX_THREADS)}
        assert ll128 == set(range(first, first + layout.MAX_THREADS // 2))
    assert [layout.signature_word(0, t) for t in range(32)] == list(range(words[0], words[0] + 32))
    assert all(layout.signature_word(b, w * layout.WARP) * 4 % 128 == 0 for b in range(max_blocks) for w in range(16))
    assert layout.SIGNATURE_SLOT == layout.MAX_SLOTS - 1
    assert (lps * layout.LINE_BYTES) % 512 == 0  # every (parity, source) part stays 512-byte aligned (LL128)


def test_message_lines_cover_each_line_once() -> None:
    for lines in (1, 77, 513, 70000):
        g = layout.plan(lines, max_blocks=4, max_slots=2)
        seen = [layout.message_line(g, it, b, i, t) for it in range(g.iterations) for b in range(g.blocks)
                for i in range(g.slots) for t in range(g.threads)]
        assert len(set(seen)) == len(seen) and set(range(lines)) <= set(seen)


# ---- the formulas' one declaration (sollat/device/abi_layout.py) and the two sides derived from it ----
def test_layout_functions_are_the_declared_formulas() -> None:
    """sollat.device.layout writes no formula itself: each function is the one compiled from its declaration."""
    assert set(layout.DERIVED) == set(abi_layout.BY_NAME)
    for name, fn in abi_layout.FUNCTIONS.items():
        assert getattr(layout, name) is fn, f"layout.{name} is not abi_layout's {name}"
        assert fn.__code__.co_filename == f"<sollat.device.abi_layout {name}>"
    assert layout.SIGNATURE_SLOT == abi_layout.SIGNATURE_SLOT == 3


def test_layout_spot_values() -> None:
    assert layout.slot_index(1, 2, 3) == (1 * 4 + 2) * 512 + 3 == 3075
    assert layout.ll128_acc_slot(3, 5) == 3 * 512 + 5
    assert layout.signature_word(0, 0) == 4 * 3 * 512 and layout.signature_word(1, 7) == 4 * (4 + 3) * 512 + 7
    assert layout.ll128_signature_word(0, 0) == 2 * 3 * 512 and layout.ll128_signature_word(1, 7) == 2 * (4 + 3) * 512 + 7
    assert layout.line_base(1, 2, 4, 10) == 60 and layout.line_index(1, 2, 3, nranks=4, lines_per_src=10) == 63
    assert layout.lines_per_src(16) == 16 * 4 * 512
    assert layout.region_bytes_of_lines(4, 10) == 2 * 4 * 10 * 16
    assert layout.region_bytes(4, 16) == 2 * 4 * (16 * 4 * 512) * 16


def test_device_signatures_and_precisions() -> None:
    """The C++ the kernels call: these signatures, and line_base's two precisions (a cast only where
    the operands are narrower than the result)."""
    text = abi_layout.header_text()
    for line in ("__device__ __forceinline__ int slot_index(int block, int slot, int thread) {",
                 "__device__ __forceinline__ int signature_word(int block, int thread) {",
                 "__device__ __forceinline__ int ll128_signature_word(int block, int thread) {",
                 "__device__ __forceinline__ int ll128_acc_slot(int block, int thread) {",
                 "__device__ __forceinline__ long long line_base(int parity, int src, int nranks, int lines_per_src) {",
                 "  return (long long)(parity * nranks + src) * lines_per_src;",
                 "__device__ __forceinline__ u64 line_base(u64 parity, int src, int nranks, u64 lines_per_src) {",
                 "  return (parity * nranks + src) * lines_per_src;",
                 "__device__ __forceinline__ u64 region_bytes(int nranks, int lines_per_src) {",
                 "  return (u64)kParities * nranks * lines_per_src * kLineBytes;"):
        assert line + "\n" in text, line


def test_constants_have_their_header_spelling() -> None:
    for name, (cxx, value) in abi_layout.CONSTANTS.items():
        text = abi_layout.header_text() if name in abi_layout.LAYOUT_CONSTANTS else abi_header.header_text()
        assert re.search(rf"\b{cxx} = {value}\b", text), (name, cxx)
        assert getattr(abi_layout if name in abi_layout.LAYOUT_CONSTANTS else abi, name) == value


def _limits(name: str) -> list[int]:
    top = {"block": layout.MAX_BLOCKS_LIMIT - 1, "slot": layout.MAX_SLOTS - 1, "thread": layout.MAX_THREADS - 1,
           "parity": layout.PARITIES - 1, "src": layout.MAX_RANKS - 1, "nranks": layout.MAX_RANKS,
           "lines_per_src": layout.lines_per_src(layout.MAX_BLOCKS_LIMIT),
           "group": layout.peer_groups(layout.MAX_RANKS) - 1, "line": layout.MAX_THREADS - 1}[name]
    return [0 if name != "nranks" else 1, 1, top // 3, top]


@pytest.mark.parametrize("name", [f.name for f in abi_layout.FORMULAS if f.device])
def test_device_arithmetic_equals_python_up_to_the_limits(name: str) -> None:
    """Every C++ overload, in C's fixed-width integers, gives the Python value with no intermediate
    overflow over the parameters' whole range (MAX_BLOCKS_LIMIT blocks, MAX_RANKS ranks)."""
    f = abi_layout.BY_NAME[name]
    tree = formula.parse(f, list(abi_layout.CONSTANTS) + list(abi_layout.BY_NAME))
    for sig in f.device:
        for args in itertools.product(*(_limits(p) for p in f.names)):
            kw = dict(zip(f.names, args, strict=True))
            assert formula.eval_c(tree, sig, abi_layout.ENV, kw) == abi_layout.FUNCTIONS[name](*args), (sig, kw)
    with pytest.raises(OverflowError):  # the check bites: 2**31 lines overflow int
        formula.eval_c(formula.parse(abi_layout.BY_NAME["slot_index"], abi_layout.CONSTANTS), abi_layout.BY_NAME[
            "slot_index"].device[0], abi_layout.ENV, {"block": 2**20, "slot": 0, "thread": 0})


@pytest.mark.parametrize("expr", ["a / b", "a ** 2", "a % 2", "-a", "abs(a)", "a * 1.5", "a << 1", "b + c", "a if a else b"])
def test_the_subset_rejects_everything_else(expr: str) -> None:
    with pytest.raises(ValueError):
        formula.parse(formula.Formula("f", ("a", "b"), expr, ""), ())
