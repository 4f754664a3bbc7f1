from __future__ import annotations

import pytest

from sollat import layout
from sollat.algorithms import ALGORITHMS


@pytest.mark.parametrize("lines", [1, 2, 31, 32, 33, 511, 512, 513, 4096, 8191, 65536, 10**6, 10**7])
@pytest.mark.parametrize("max_blocks", [1, 4, 16])
@pytest.mark.parametrize("max_slots", [1, 2, 3, 4])
def test_plan_covers_every_line(lines: int, max_blocks: int, max_slots: int) -> None:
    g = layout.plan(lines, max_blocks=max_blocks, max_slots=max_slots)
    assert 1 <= g.blocks <= max_blocks
    assert g.threads % 32 == 0 and g.threads <= layout.MAX_THREADS
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
    lps = alg.max_blocks * layout.MAX_SLOTS * layout.MAX_THREADS + layout.signature_lines(alg.max_blocks)
    per_region = 2 * nranks * lps * layout.LINE_BYTES
    assert alg.scratch_bytes(nranks) == alg.buffers * per_region
    assert alg.epoch_words() == alg.buffers * lps


@pytest.mark.parametrize("max_blocks", [1, 4, 16, 17, 32, 100, 128])
def test_signature_lines_follow_every_data_slot_and_keep_parts_aligned(max_blocks: int) -> None:
    lps = layout.lines_per_src(max_blocks)
    last_data = layout.slot_index(max_blocks - 1, layout.MAX_SLOTS - 1, layout.MAX_THREADS - 1)
    sig = [layout.signature_line(b, lps) + k for b in range(max_blocks) for k in range(layout.SIGNATURE_LINES_PER_BLOCK)]
    assert len(set(sig)) == len(sig), "two blocks share a signature line"
    assert min(sig) > last_data and max(sig) == lps - 1
    assert lps - layout.signature_lines(max_blocks) <= min(sig)  # inside the part's signature tail
    assert layout.SIGNATURE_LINES_PER_BLOCK * layout.LINE_BYTES == 32  # one 32-byte sector per block: one writer each
    assert (lps * layout.LINE_BYTES) % 512 == 0  # every (parity, source) part stays 512-byte aligned (LL128)


def test_message_lines_cover_each_line_once() -> None:
    for lines in (1, 77, 513, 70000):
        g = layout.plan(lines, max_blocks=4, max_slots=2)
        seen = [layout.message_line(g, it, b, i, t) for it in range(g.iterations) for b in range(g.blocks)
                for i in range(g.slots) for t in range(g.threads)]
        assert len(set(seen)) == len(seen) and set(range(lines)) <= set(seen)
