"""The fused RMSNorm's row exchange at every row geometry, without a GPU.

In a row cluster (k > 1 blocks per row) the blocks share the row's chunk sums through st.async
stores counted on one mbarrier per row parity in every receiving block (csrc/kernels/
allreduce_rmsnorm.cu, "Row exchange"). A row buffer (a parity's slots and mbarrier phase) is
reused two rows on, and what holds a fast sibling back is that it waits, in its own block, for
the next row's stores of every warp that reads this block's slots. So the invariant the kernel
rests on is: every warp that waits on a block's row phase stores into every receiving block in
every row. The cut can leave warps, and whole blocks, without a line of the row (2880 bf16 on LL:
warp 5 of block 3; 5376 bf16 on LL: block 7 of 8); those leave the kernel at entry, so they
neither wait nor read, and nothing is sent to a block none of whose warps has a line.

``rmsnorm.row_exchange`` states who takes part (the kernel's ``takes_part`` and ``receivers``);
these tests check it, and the invariant, against the line rule of ``RowGeometry`` for every hidden
size 1 .. 65536 of every dtype and algorithm (protocol), at every slot limit and cluster width."""

from __future__ import annotations

import itertools
from functools import cache

import numpy as np
import pytest
import torch

from sollat.collectives import rmsnorm
from sollat.collectives.algorithms import RMSNORM_ALGORITHMS, Algorithm
from sollat.device import abi, build, layout
from sollat.device.dtypes import DTYPES

WARP = layout.WARP
HIDDEN_MAX = 65536
# The cluster widths row_geometry can reach: its `widest` bound (rows and the algorithm's blocks,
# or a wide virtual group's widest_blocks) is one of these after rounding down to a power of two.
WIDEST = (1, 2, 4, 8)
KEY = tuple[int, int, int, int, int]  # (row_lines, row_blocks, slots, threads, passes)


def _key(g: rmsnorm.RowGeometry) -> KEY:
    return g.row_lines, g.row_blocks, g.slots, g.threads, g.passes


def _geometries(alg: Algorithm, dtype: torch.dtype) -> dict[KEY, rmsnorm.RowGeometry]:
    """Every distinct cut of ``alg`` for ``dtype``: hidden 1 .. HIDDEN_MAX, every rank cap the
    algorithm has (its slot limit), every cluster width. hidden enters the cut only as row_lines
    (test_the_cut_depends_on_hidden_only_through_its_lines), so one hidden per row_lines covers
    them all: the largest, row_lines * elems_per_line (HIDDEN_MAX is a multiple of it)."""
    dt = DTYPES[dtype]
    caps = sorted({cap for cap, _ in alg.slot_choices})
    epl = alg.elems_per_line(dt)
    assert HIDDEN_MAX % epl == 0
    seen: dict[KEY, rmsnorm.RowGeometry] = {}
    for row_lines in range(1, HIDDEN_MAX // epl + 1):
        for cap, widest in itertools.product(caps, WIDEST):
            g = rmsnorm.row_geometry(alg, dt, 1, row_lines * epl, cap, widest_blocks=widest)
            seen.setdefault(_key(g), g)
    return seen


@cache
def _all_geometries() -> dict[KEY, tuple[rmsnorm.RowGeometry, str]]:
    out: dict[KEY, tuple[rmsnorm.RowGeometry, str]] = {}
    for (name, alg), dtype in itertools.product(RMSNORM_ALGORITHMS.items(), rmsnorm.DTYPES_SUPPORTED):
        for key, g in _geometries(alg, dtype).items():
            out.setdefault(key, (g, f"{name} {dtype}"))
    return out


def _stores_per_warp(g: rmsnorm.RowGeometry) -> np.ndarray:
    """[block, warp]: the chunks a warp stores per row, from the kernel's put_chunk: chunk_line(p,
    i) = p * pass_lines + (j * slots + i) * threads + 32 * warp, stored when it is in the row."""
    warps = g.threads // WARP
    pass_lines = g.row_blocks * g.slots * g.threads
    p = np.arange(g.passes).reshape(-1, 1, 1, 1)
    j = np.arange(g.row_blocks).reshape(1, -1, 1, 1)
    i = np.arange(g.slots).reshape(1, 1, -1, 1)
    w = np.arange(warps).reshape(1, 1, 1, -1)
    first = p * pass_lines + (j * g.slots + i) * g.threads + w * WARP
    return (first < g.row_lines).sum(axis=(0, 2))


def _check_exchange(g: rmsnorm.RowGeometry, what: str) -> None:
    ex = rmsnorm.row_exchange(g)
    warps = g.threads // WARP
    block_lines = g.slots * g.threads
    n_chunks = layout.ceil_div(g.row_lines, WARP)
    assert len(ex.warps) == g.row_blocks and all(0 <= n <= warps for n in ex.warps), what
    # The kernel's rule, warp by warp: takes_part = chunk_line(0, 0) < row_lines.
    takes = np.arange(g.row_blocks)[:, None] * block_lines + np.arange(warps)[None, :] * WARP < g.row_lines
    assert (takes == (np.arange(warps)[None, :] < np.array(ex.warps)[:, None])).all(), what
    # Receiving blocks: exactly those with a warp that takes part, a prefix 0 .. receivers - 1, at
    # least one; warp 0 of each takes part (its thread 0 declares the row's bytes).
    assert 1 <= ex.receivers <= g.row_blocks, what
    assert [n > 0 for n in ex.warps] == [j < ex.receivers for j in range(g.row_blocks)], what
    # The invariant: a warp that takes part (waits, reads) stores into every receiver in every row;
    # one that does not stores nothing (it has left). Every chunk is stored by one warp, so each
    # receiver gets n_chunks sums and fault words: the kernel's row_bytes_in.
    stores = _stores_per_warp(g)
    assert ((stores > 0) == takes).all(), f"{what}: a warp that waits stores nothing in some row"
    assert int(stores.sum()) == n_chunks, what
    # Several passes only when pass 0 is full: then every warp of every block takes part.
    if g.passes > 1:
        assert ex.receivers == g.row_blocks and all(n == warps for n in ex.warps), what


def _check_by_lines(g: rmsnorm.RowGeometry, what: str) -> None:
    """The same, from RowGeometry's line rule line by line: line l is pass l // (k * slots *
    threads), block l // (slots * threads) % k, slot l // threads % slots, thread l % threads."""
    ex = rmsnorm.row_exchange(g)
    line = np.arange(g.row_lines)
    block = line // (g.slots * g.threads) % g.row_blocks
    warp = line % g.threads // WARP
    owners = set(zip(block.tolist(), warp.tolist(), strict=True))
    assert owners == {(j, w) for j, n in enumerate(ex.warps) for w in range(n)}, what
    # Each chunk (32 lines) has one owner warp, pass and slot: the kernel's butterfly covers it.
    pass_ = line // (g.row_blocks * g.slots * g.threads)
    slot = line // g.threads % g.slots
    holder = ((pass_ * g.row_blocks + block) * g.slots + slot) * (g.threads // WARP) + warp
    chunk = line // WARP
    first = np.searchsorted(chunk, np.arange(chunk[-1] + 1))
    assert (holder == holder[first][chunk]).all(), what


def test_every_warp_that_waits_stores_in_every_row_at_every_hidden_size() -> None:
    geos = _all_geometries()
    assert len(geos) > 1000
    for g, what in geos.values():
        _check_exchange(g, f"{what} {g}")


def test_line_rule_agrees_on_every_small_row_and_the_named_sizes() -> None:
    named = {2880, 5376, 6144, 7168, 8192, 12288, 16384, abi.RMSNORM_MAX_HIDDEN}
    for g, what in _all_geometries().values():
        if g.row_lines <= 2048 or any(layout.ceil_div(h, g.elems_per_line) == g.row_lines for h in named):
            _check_by_lines(g, f"{what} {g}")


def test_the_cut_depends_on_hidden_only_through_its_lines() -> None:
    """Every hidden 1 .. HIDDEN_MAX gives the cut of the largest hidden with its row_lines (what
    _geometries enumerates), for every dtype and algorithm, at the widest cluster and most slots."""
    for (name, alg), dtype in itertools.product(RMSNORM_ALGORITHMS.items(), rmsnorm.DTYPES_SUPPORTED):
        dt = DTYPES[dtype]
        epl = alg.elems_per_line(dt)
        cap = max(alg.slot_choices, key=lambda c: (c[1], -c[0]))[0]
        for hidden in range(1, HIDDEN_MAX + 1, 1 if name == "rmsnorm_oneshot_ll" else 7):
            g = rmsnorm.row_geometry(alg, dt, 1, hidden, cap)
            assert g == rmsnorm.row_geometry(alg, dt, 1, layout.ceil_div(hidden, epl) * epl, cap), (name, dtype, hidden)


@pytest.mark.parametrize(("hidden", "dtype", "idle"), [
    (2880, torch.bfloat16, (6, 6, 6, 5)),  # gpt-oss: warp 5 of block 3 holds no line
    (5376, torch.bfloat16, (6, 6, 6, 6, 6, 6, 6, 0)),  # block 7 of 8 holds none
])
def test_real_hidden_sizes_leave_warps_and_blocks_empty(hidden: int, dtype: torch.dtype, idle: tuple[int, ...]) -> None:
    """The cut the kernel must survive exists at real sizes (so the kernel, not the cut, carries the
    invariant): one row, 2 ranks, LL."""
    g = rmsnorm.geometry("oneshot_ll", dtype, 1, hidden, 2)
    ex = rmsnorm.row_exchange(g)
    assert ex.warps == idle and ex.receivers == sum(n > 0 for n in idle)
    assert g.row_blocks == len(idle) and g.threads // WARP == max(idle)


def test_kernel_leaves_idle_warps_and_sends_only_to_receivers() -> None:
    """The kernel's side of row_exchange, as written (the GPU tests exercise it; this keeps the
    two spelled the same): the rule, the exit, and the stores to receivers only."""
    src = build.kernel_source("allreduce_rmsnorm.cu")
    assert "const bool takes_part = chunk_line(0, 0) < row_lines;" in src
    assert "if (!takes_part) return;" in src
    assert "} else if (lane < receivers) {" in src
    assert "lane < k)" not in src
