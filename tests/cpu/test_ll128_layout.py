"""LL128 atomic lane/element mapping (sollat/device/csrc/include/sollat/ll128.h), mirrored in pure Python.

A warp-unit is 32 lanes x E elements (E = 4 for fp32, 8 for 16-bit) = 4 lines of 128 B. Lane l < 31
carries user elements [l E, l E + E); lanes 8k put the line-k counter in element 0 and lane 31
carries the displaced elements (element k = user element 8k E; the rest zero). The test packs
random units the way the kernel does, sums R contributions into a zero accumulator (as the atomics
do, with the split or fused counter), checks the counters read R, restores, and compares with the
plain sum. Values are small integers, so every order of float addition gives the exact sum.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from sollat.device import abi

LANES = abi.WARP
LANES_PER_LINE = abi.LL128_LINE_BYTES // abi.LINE_BYTES
LINES = abi.LL128_LINES_PER_UNIT
DISPLACED_LANE = abi.LL128_DISPLACED_LANE
HEADER = Path(__file__).resolve().parents[2] / "sollat" / "device" / "csrc" / "include" / "sollat" / "ll128.h"


def elems_per_lane(elem_bytes: int) -> int:
    return abi.LINE_BYTES // elem_bytes


def unit_elems(elem_bytes: int) -> int:
    return (LANES - 1) * elems_per_lane(elem_bytes)


def pack_unit(user: list[float], elem_bytes: int, *, split: bool) -> list[list[float]]:
    """One rank's 32 lane vectors for one unit (as the kernel builds them before its vector adds)."""
    E = elems_per_lane(elem_bytes)
    assert len(user) == unit_elems(elem_bytes)
    lanes = [list(user[lane * E:(lane + 1) * E]) for lane in range(LANES - 1)] + [[0.0] * E]
    for k in range(LINES):
        lanes[DISPLACED_LANE][k] = lanes[LANES_PER_LINE * k][0]
        lanes[LANES_PER_LINE * k][0] = 0.0 if split else 1.0
    return lanes


def add_counters(acc: list[list[float]]) -> None:
    """Split mode: lane 8k's separate counter add."""
    for k in range(LINES):
        acc[LANES_PER_LINE * k][0] += 1.0


def counters(acc: list[list[float]]) -> list[float]:
    return [acc[LANES_PER_LINE * k][0] for k in range(LINES)]


def restore_unit(acc: list[list[float]], elem_bytes: int) -> list[float]:
    """The owner's read: element 0 of lanes 8k from lane 31, then the 31 data lanes in order."""
    lanes = [list(v) for v in acc]
    for k in range(LINES):
        lanes[LANES_PER_LINE * k][0] = lanes[DISPLACED_LANE][k]
    return [x for lane in range(LANES - 1) for x in lanes[lane]]


def chunk_geometry(n: int, nranks: int, elem_bytes: int) -> tuple[int, int]:
    """(units per chunk, chunk elements), as in allreduce_ll128.cu."""
    ue = unit_elems(elem_bytes)
    units = (-(-n // nranks) + ue - 1) // ue
    return units, units * ue


def element_of(chunk: int, unit: int, lane: int, k: int, *, n: int, nranks: int, elem_bytes: int) -> int:
    """Message element carried at (chunk, unit, lane, element k) for lanes < 31."""
    _, ce = chunk_geometry(n, nranks, elem_bytes)
    return chunk * ce + unit * unit_elems(elem_bytes) + lane * elems_per_lane(elem_bytes) + k


@pytest.mark.parametrize("elem_bytes", [4, 2])
@pytest.mark.parametrize("nranks", [2, 4, 8])
@pytest.mark.parametrize("split", [False, True])
def test_pack_sum_restore(elem_bytes: int, nranks: int, split: bool) -> None:
    rng = random.Random(elem_bytes * 100 + nranks * 10 + split)
    E = elems_per_lane(elem_bytes)
    for _ in range(20):
        users = [[float(rng.randint(-64, 64)) for _ in range(unit_elems(elem_bytes))] for _ in range(nranks)]
        acc = [[0.0] * E for _ in range(LANES)]  # zero at rest
        order = list(range(nranks))
        rng.shuffle(order)  # atomics land in any order
        for r in order:
            lanes = pack_unit(users[r], elem_bytes, split=split)
            for lane in range(LANES):
                for k in range(E):
                    acc[lane][k] += lanes[lane][k]
        if split:
            # Before the counter adds the owner must not see R (the counters read 0).
            assert counters(acc) == [0.0] * LINES
            for _ in range(nranks):
                add_counters(acc)
        assert counters(acc) == [float(nranks)] * LINES
        got = restore_unit(acc, elem_bytes)
        want = [sum(u[i] for u in users) for i in range(unit_elems(elem_bytes))]
        assert got == want
        # 16-bit: lane 31 elements 4..7 are padding and stay zero.
        assert all(x == 0.0 for x in acc[DISPLACED_LANE][LINES:])


@pytest.mark.parametrize("elem_bytes", [4, 2])
def test_counter_never_reaches_output(elem_bytes: int) -> None:
    # A unit whose user elements are all distinct markers: the restored unit holds exactly them.
    user = [float(i + 1000) for i in range(unit_elems(elem_bytes))]
    acc = pack_unit(user, elem_bytes, split=False)
    assert counters(acc) == [1.0] * LINES
    assert restore_unit(acc, elem_bytes) == user
    assert 1.0 not in restore_unit(acc, elem_bytes)


@pytest.mark.parametrize("elem_bytes", [4, 2])
@pytest.mark.parametrize("nranks", [2, 4, 8])
@pytest.mark.parametrize("n", [1, 123, 124, 125, 248, 249, 1000, 4097, 65536 + 3])
def test_chunks_cover_message_once(elem_bytes: int, nranks: int, n: int) -> None:
    units, ce = chunk_geometry(n, nranks, elem_bytes)
    assert ce * nranks >= n and ce % elems_per_lane(elem_bytes) == 0  # 16-byte aligned lanes
    seen = set()
    for c in range(nranks):
        for j in range(units):
            for lane in range(LANES - 1):
                for k in range(elems_per_lane(elem_bytes)):
                    e = element_of(c, j, lane, k, n=n, nranks=nranks, elem_bytes=elem_bytes)
                    assert e not in seen
                    seen.add(e)
    assert set(range(n)) <= seen  # elements >= n are zero padding, never written


def test_counter_exact_in_every_type() -> None:
    # Counter values 0..8 are exact in fp32, bf16 (8 mantissa bits) and fp16 (11).
    import struct

    for r in range(9):
        assert struct.unpack("<e", struct.pack("<e", float(r)))[0] == r  # fp16 round trip
        bits = struct.unpack("<I", struct.pack("<f", float(r)))[0]
        assert bits & 0xFFFF == 0  # bf16 = top half of fp32: exact
    # Bits the kernel adds (ll128.h CounterBits): 1.0 in fp32, bf16, fp16.
    text = HEADER.read_text()
    assert "0x3F800000u" in text and "0x3F80u" in text and "0x3C00u" in text



def test_unit_geometry_is_the_contracts() -> None:
    assert (LANES, LANES_PER_LINE, LINES, DISPLACED_LANE) == (32, 8, 4, 31)
    assert LANES_PER_LINE * LINES == LANES and abi.LL128_DATA_LANES == LANES - 1
    assert abi.LL128_UNIT_USER_BYTES == 496 and unit_elems(4) == 124 and unit_elems(2) == 248
