"""The host/device contract (sollat/device/abi.py) and the header generated from it (abi.h)."""

from __future__ import annotations

import re
import struct

import numpy as np
import pytest

from sollat.collectives import algorithms
from sollat.collectives.algorithms import ALGORITHMS
from sollat.device import abi, abi_header, build, layout
from sollat.device.dtypes import DTYPES


def test_header_is_in_the_cubin_cache_key() -> None:
    assert abi_header.HEADER_PATH.parent.parent == build.INCLUDE_DIR  # _headers_digest hashes every file here
    assert abi_header.HEADER_PATH in set(build.INCLUDE_DIR.rglob("*"))


def test_contract_literals_live_only_in_abi_h() -> None:
    declared = ("constexpr int kMaxThreads", "constexpr int kMaxSlotsPerThread", "constexpr int kMaxWorld",
                "constexpr int kFaultWords", "enum FaultCode", "struct CommState {", "__launch_bounds__(512")
    for h in list(build.CSRC.rglob("*.h")) + list(build.CSRC.rglob("*.cu")):
        if h != abi_header.HEADER_PATH:
            text = h.read_text()
            assert not [d for d in declared if d in text], h


def test_state_block_is_the_one_the_kernels_read() -> None:
    # the scalars first (the prefetched first line holds them and ranks 0..12's bases), then 72 bases
    assert abi.STATE_FORMAT == "<QQii72Q" and abi.STATE_BYTES == 600
    raw = abi.pack_state({"scratch": list(range(1, 73)), "err_host": 90, "timeout_ns": 91, "absent_rank": -1,
                          "mismatch_rank": 3})
    assert struct.unpack("<QQii72Q", raw) == (90, 91, -1, 3, *range(1, 73))
    assert "static_assert(sizeof(CommState) == 600" in abi_header.header_text()
    with pytest.raises(KeyError):
        abi.pack_state({"scratch": [0] * 72})


def test_kernel_tail_is_packed_in_declared_order() -> None:
    values = {"n": 96, "st": 0x7000_0000_1000, "region_off": 4096, "lines_per_src": 64, "epochs": 0x7000_0000_2000,
              "sig": 0xDEADBEEF, "rank_base": -1, "nranks": 8, "rec0": 0x7000_0000_3000, "rank_stride": 1 << 20}
    tail = abi.kernel_tail(values)
    assert [p.name for p in abi.TAIL_PARAMS] == list(values)
    assert [int(v) for v in tail] == list(values.values())
    assert [np.dtype(type(v)).itemsize for v in tail] == [8, 8, 8, 4, 8, 4, 4, 4, 8, 8]
    with pytest.raises(KeyError):
        abi.kernel_tail({k: v for k, v in values.items() if k != "sig"})


def test_entry_points_take_the_rank_table_then_the_tail() -> None:
    assert [p.name for p in abi.TAIL_PARAMS] == [
        "n", "st", "region_off", "lines_per_src", "epochs", "sig", "rank_base", "nranks", "rec0", "rank_stride"]
    text = abi_header.header_text()
    assert "#define SOLLAT_PARAMS \\\n    const __grid_constant__ sollat::RankTable<sollat::kListsCollective> ptrs, " \
           "sollat::u64 n," in text
    assert "enum RankTableCollective : int { kListsCollective = 2 };" in text
    # one table size rule for every family: lists x launch ranks (1 on real ranks, the cap on virtual)
    assert abi.table_size("collective", 1) == 2 and abi.table_size("collective", 72) == 144
    assert abi.table_size("rmsnorm_fp8", 8) == 56


def test_fused_rmsnorm_entry_points_take_pointers_then_one_tail() -> None:
    """The FP8 variant adds two pointer lists (the e4m3 copy, then its float32 scale) after the
    plain kernel's five and takes the same tail; the header declares the list indices and the e4m3 facts."""
    plain = [n for n, _ in abi.POINTER_LISTS["rmsnorm"]]
    fp8 = [n for n, _ in abi.POINTER_LISTS["rmsnorm_fp8"]]
    assert fp8[:5] == plain and fp8[5:] == ["fp8_out", "fp8_scale"]
    assert abi.POINTER_LISTS["rmsnorm_fp8"][6][1] == "const float*"
    assert abi.POINTER_LISTS["collective"] == abi.POINTER_LISTS["rmsnorm"][:2]  # in, out: kListIn, kListOut everywhere
    assert abi.RMSNORM_TAIL_PARAMS[:len(abi.TAIL_PARAMS)] == abi.TAIL_PARAMS
    text = abi_header.header_text()
    assert "#define SOLLAT_RMSNORM_FP8_PARAMS" in text and "RankTable<sollat::kListsRmsnormFp8> ptrs" in text
    assert "kListFp8Out = 5, kListFp8Scale = 6" in text
    assert f"kFp8E4M3Max = {abi.FP8_E4M3_MAX}, kFp8E4M3NaN = {abi.FP8_E4M3_NAN}" in text
    assert (abi.FP8_E4M3_MAX, abi.FP8_E4M3_NAN) == (448, 0x7F)
    import torch

    assert torch.finfo(torch.float8_e4m3fn).max == abi.FP8_E4M3_MAX  # torch's format is the kernel's
    assert torch.tensor(float("nan")).to(torch.float8_e4m3fn).view(torch.uint8).item() == abi.FP8_E4M3_NAN
    # every entry the host asks for (abi.rmsnorm_entry of the one- and two-shot kernels, and of the
    # one-block-per-row kernel) is named in its kernel file and declared with its parameter list
    kernels = {a.kernel: a.kernel_file for a in algorithms.RMSNORM_ALGORITHMS.values()}
    assert kernels == {"ar_rmsnorm": "allreduce_rmsnorm.cu", "ar_rmsnorm_twoshot": "allreduce_rmsnorm.cu",
                       "ar_rmsnorm_block": "allreduce_rmsnorm_block.cu"}
    for kernel, kernel_file in kernels.items():
        src = build.kernel_source(kernel_file)
        for fp8 in (False, True):
            tag = "FP8_" if fp8 else ""
            assert f"#define SOLLAT_RMSNORM_{tag}ENTRY {abi.rmsnorm_entry(kernel, fp8)}\n" in src
            assert f"SOLLAT_RMSNORM_{tag}ENTRY(SOLLAT_RMSNORM_{tag}PARAMS)" in src


def test_host_modules_derive_from_the_contract() -> None:
    assert (layout.MAX_RANKS, layout.MAX_THREADS, layout.MAX_SLOTS, layout.LINE_BYTES, layout.WARP) == (72, 512, 4, 16, 32)
    assert abi.RANK_CAPS == (2, 4, abi.PEER_WINDOW, abi.MAX_RANKS) and abi.PEER_WINDOW == 8
    assert layout.PAYLOAD_BYTES == abi.PAYLOAD_BYTES == {"ll": 8, "sentinel": 16, "bulk": 16}
    assert (layout.CONTROL_BYTES, layout.FAULT_RECORD_OFFSET, layout.FAULT_WORDS) == (512, 0, 9)
    assert abi.FAULT_RECORD_WORDS[-1] == "collective" and 4 * layout.FAULT_WORDS <= layout.CONTROL_BYTES
    assert (layout.FAULT_OK, layout.FAULT_TIMEOUT, layout.FAULT_MISMATCH, layout.FAULT_CLAIMED) == (0, 1, 2, 0xFFFFFFFF)
    for d in DTYPES.values():
        b = abi.BITS[d.short]
        assert (d.size, d.sentinel, d.canonical_nan) == (b.width // 8, b.sentinel, b.canonical_nan)


# Device-only constants a header may spell as a literal: bit tricks, masks and the spin cadence,
# which the host never sees. Any other `constexpr ... kName = <number>` outside abi.h is a
# contract fact written a second time.
DEVICE_ONLY = {"kPollsPerCheck", "kFull", "kLow", "kHigh", "kExpMask", "kManMask", "kOne", "kMask", "kUnroll",
               # LLBuffer's own bookkeeping and the LL flag's epoch field (protocol_ll.h)
               "kSigReceivedShift", "kSigBad", "kEpochField", "kEmpty"}
_CONSTEXPR = re.compile(r"constexpr[^;{]*;")
_LITERAL = re.compile(r"\b(k\w+)\s*=\s*(?:0x[0-9A-Fa-f]+|\d+)[uUlL]*\s*[,;]")
_ENTRY = re.compile(r"SOLLAT_DEFINE_ENTRY_POINTS\((\w+),")


def test_no_contract_constant_is_spelled_as_a_literal_in_csrc() -> None:
    for f in list(build.CSRC.rglob("*.h")) + list(build.CSRC.rglob("*.cu")):
        if f == abi_header.HEADER_PATH:
            continue
        code = "\n".join(line.split("//")[0] for line in f.read_text().splitlines())
        names = {n for decl in _CONSTEXPR.findall(code) for n in _LITERAL.findall(decl)}
        assert names <= DEVICE_ONLY, f"{f.name}: {sorted(names - DEVICE_ONLY)} belong in sollat/device/abi.py"


def test_every_kernel_reads_its_buffer_count_from_abi_h() -> None:
    defined = set()
    for f in build.KERNEL_DIR.glob("*.cu"):
        text = f.read_text()
        for name in _ENTRY.findall(text):
            kernel = abi.KERNELS[name]  # every entry point is a kernel of the contract
            defined.add(name)
            assert f"constexpr int kBuffers = {abi.kernel_buffers_name(kernel)};" in text, f.name
    # The fused kernel defines its own entry points, the one- or the two-shot's by a module define.
    one, two = (abi.kernel_buffers_name(abi.KERNELS[k]) for k in ("ar_rmsnorm", "ar_rmsnorm_twoshot"))
    for alg in algorithms.RMSNORM_ALGORITHMS.values():
        text = build.kernel_source(alg.kernel_file)
        own = abi.kernel_buffers_name(abi.KERNELS[alg.kernel])
        buffers = f"SOLLAT_RMSNORM_TWOSHOT ? {two} : {one}" if alg.kernel_file == "allreduce_rmsnorm.cu" else own
        assert f"constexpr int kBuffers = {buffers};" in text, alg.kernel_file
        assert f"#define SOLLAT_RMSNORM_ENTRY {alg.kernel}\n" in text, alg.kernel_file
        defined.add(alg.kernel)
    assert defined == set(abi.KERNELS)
    for alg in ALGORITHMS.values():
        assert alg.buffers == abi.KERNELS[alg.kernel].buffers
        assert f"SOLLAT_DEFINE_ENTRY_POINTS({alg.kernel}," in build.kernel_source(alg.kernel_file)


def test_per_kernel_and_ll128_facts_are_in_the_header() -> None:
    text = abi_header.header_text()
    for k in abi.KERNELS.values():
        assert f"{abi.kernel_buffers_name(k)} = {k.buffers}" in text
    assert f"kLL128LineBytes = {abi.LL128_LINE_BYTES}," in text and f"kParities = {abi.PARITIES}" in text
    assert ALGORITHMS["ll128"].unit_user_bytes == abi.LL128_UNIT_USER_BYTES == abi.LL128_DATA_LANES * abi.LINE_BYTES
    assert abi.REST_BYTE == {"ll": 0, "sentinel": 0xFF, "bulk": 0}
