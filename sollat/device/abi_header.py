"""Renders sollat/device/abi.py's contract as C++: ``csrc/include/sollat/abi.h``, which the device headers
include (a CPU test checks that the committed header equals ``header_text()``). Regenerate it
after editing abi.py::

    python -m sollat.device.abi_header > sollat/device/csrc/include/sollat/abi.h

(``python -m sollat.device.abi_layout`` renders ``layout.h`` from the formulas of ``sollat/device/abi_layout.py``.)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from .abi import (
    ADD_RMSNORM_LISTS,
    ADD_RMSNORM_MAX_THREADS,
    ADD_RMSNORM_PASS_ELEMS,
    ADD_RMSNORM_TAIL_PARAMS,
    BITS,
    BULK_AREA_LINES,
    BULK_DATA_LINES,
    COLLECTIVES,
    COMM_STATE,
    CONTROL_BYTES,
    CTYPES,
    FAULT_CODES,
    FAULT_RECORD_OFFSET,
    FAULT_RECORD_WORDS,
    FAULT_WORDS,
    FP8_E4M3_MAX,
    FP8_E4M3_NAN,
    KERNELS,
    LINE_BYTES,
    LL128_DATA_LANES,
    LL128_DISPLACED_LANE,
    LL128_LINE_BYTES,
    LL128_LINES_PER_UNIT,
    MAX_RANKS,
    MAX_SLOTS,
    MAX_THREADS,
    PARITIES,
    PAYLOAD_BYTES,
    PEER_GROUP_PACKS,
    PEER_WINDOW,
    POINTER_LISTS,
    RMSNORM_MAX_HIDDEN,
    RMSNORM_MAX_ROW_BLOCKS,
    RMSNORM_MAX_THREADS,
    RMSNORM_TAIL_PARAMS,
    STATE_BYTES,
    TAIL_PARAMS,
    WARP,
    WIDE_UNROLLED_RANKS,
    Param,
    kernel_buffers_name,
)
from .generated_header import GeneratedHeader, framed

HEADER_PATH = Path(__file__).parent / "csrc" / "include" / "sollat" / "abi.h"
REGENERATE = "python -m sollat.device.abi_header > sollat/device/csrc/include/sollat/abi.h"


_UINT = {16: ("u16", ""), 32: ("u32", "u"), 64: ("u64", "ull")}  # C++ type and literal suffix by width


def _hex(v: int, width: int) -> str:
    return f"0x{v:0{width // 4}X}{_UINT[width][1]}"


def _typedefs() -> list[str]:
    return [f"typedef {c.builtin} {name};" for name, c in CTYPES.items() if name != c.builtin]


def _constants() -> list[str]:
    ints = (("kMaxWorld", MAX_RANKS), ("kPeerWindow", PEER_WINDOW), ("kMaxThreads", MAX_THREADS), ("kMaxSlotsPerThread", MAX_SLOTS),
            ("kLineBytes", LINE_BYTES), ("kWarpSize", WARP), ("kPayloadBytesLL", PAYLOAD_BYTES["ll"]),
            ("kPayloadBytesSentinel", PAYLOAD_BYTES["sentinel"]), ("kControlBytes", CONTROL_BYTES),
            ("kFaultRecordOffset", FAULT_RECORD_OFFSET), ("kFaultWords", FAULT_WORDS))
    return [f"constexpr int {n} = {v};" for n, v in ints]


def _enum(name: str, items: Sequence[tuple[str, int]]) -> str:
    return f"enum {name} : int {{ " + ", ".join(f"{k} = {v}" for k, v in items) + " };"


def _per_kernel_lines() -> list[str]:
    # Enumerators, not constexpr variables: they have no storage, so a kernel that does not use
    # them carries no symbol of them (the PTX of the others is unchanged by adding one).
    return [
        "// Buffers per kernel (sollat/device/abi.py KERNELS): each kernel's kBuffers is its k<Name>Buffers.",
        _enum("KernelBuffers", [(kernel_buffers_name(k), k.buffers) for k in KERNELS.values()]),
        _enum("Parity", [("kParities", PARITIES)]),
        "// The wide one-shot's shared memory (allreduce_oneshot_wide.cu): (line, rank) packs of one block and pass;"
        " its narrower rank cap, whose rank-order sum is unrolled.",
        _enum("PeerGroups", [("kPeerGroupPacks", PEER_GROUP_PACKS), ("kWideUnrolledRanks", WIDE_UNROLLED_RANKS)]),
        "// Fused RMSNorm (allreduce_rmsnorm.cu, one- and two-shot): the widest row cluster, the most threads per block;"
        " the longest row (both RMSNorm kernels).",
        _enum("RmsnormGeometry", [("kRmsnormMaxRowBlocks", RMSNORM_MAX_ROW_BLOCKS),
                                   ("kRmsnormMaxThreads", RMSNORM_MAX_THREADS),
                                   ("kRmsnormMaxHidden", RMSNORM_MAX_HIDDEN)]),
        "// Its one-GPU epilogue (add_rmsnorm.cu, the \"unfused\" algorithm): the most threads per block (one row),"
        " the elements of a row per pass (abi.add_rmsnorm_slots: lines per thread and pass).",
        _enum("AddRmsnormGeometry", [("kAddRmsnormMaxThreads", ADD_RMSNORM_MAX_THREADS),
                                     ("kAddRmsnormPassElems", ADD_RMSNORM_PASS_ELEMS)]),
        "// The bulk protocol's area per block, (parity, source) part and region: lines, and those that carry data.",
        _enum("BulkArea", [("kBulkAreaLines", BULK_AREA_LINES), ("kBulkDataLines", BULK_DATA_LINES)]),
        "// float8_e4m3fn, the fused RMSNorm's optional FP8 copy: largest finite value, the NaN byte written.",
        _enum("Fp8E4M3", [("kFp8E4M3Max", FP8_E4M3_MAX), ("kFp8E4M3NaN", FP8_E4M3_NAN)]),
        "// LL128 warp-unit (ll128.h names them in namespace ll128).",
        _enum("LL128Unit", [("kLL128LineBytes", LL128_LINE_BYTES), ("kLL128LinesPerUnit", LL128_LINES_PER_UNIT),
                            ("kLL128DisplacedLane", LL128_DISPLACED_LANE), ("kLL128DataLanes", LL128_DATA_LANES)]),
    ]


def collective_enumerator(name: str) -> str:
    """The C++ name of a COLLECTIVES code in abi.h (``kCollAllReduce``)."""
    return "kColl" + "".join(part.capitalize() for part in name.split("_"))


def _fault_lines() -> list[str]:
    codes = ", ".join(f"k{k.capitalize()} = {_hex(v, 32) if v > 255 else v}" for k, v in FAULT_CODES.items())
    words = ", ".join(f"kWord{w.capitalize()} = {i}" for i, w in enumerate(FAULT_RECORD_WORDS))
    colls = ", ".join(f"{collective_enumerator(k)} = {v}" for k, v in COLLECTIVES.items())
    return [f"enum FaultCode : unsigned int {{ {codes} }};", f"enum FaultWord : int {{ {words} }};",
            "// The fault record's collective word (SOLLAT_COLLECTIVE of the build).",
            f"enum Collective : unsigned int {{ {colls} }};"]


def _bits_lines() -> list[str]:
    out = []
    for b in BITS.values():
        t = _UINT[b.width][0]
        tag = b.short.capitalize()
        out.append(f"constexpr {t} kSentinel{tag} = {_hex(b.sentinel, b.width)};")
        out.append(f"constexpr {t} kCanonicalNaN{tag} = {_hex(b.canonical_nan, b.width)};")
    return out


def _state_lines() -> list[str]:
    out = ["struct CommState {"]
    for f in COMM_STATE:
        dim = "[kMaxWorld]" if f.count == MAX_RANKS and f.count > 1 else (f"[{f.count}]" if f.count > 1 else "")
        out.append(f"  {f.ctype} {f.name}{dim};  // {f.doc}")
    out.append("};")
    out.append(f'static_assert(sizeof(CommState) == {STATE_BYTES}, "CommState: sollat/device/abi.py STATE_FORMAT");')
    return out


def _cxx_param(p: Param) -> str:
    """``type name`` as written outside namespace sollat (the entry points are extern "C")."""
    t = re.sub(r"\b(CommState|RankTable|kLists\w*|u64|u32|u16)\b", r"sollat::\1", p.ctype)
    return f"{t} {p.name}"


def _params_macro(name: str, params: Sequence[Param]) -> list[str]:
    per_line = 4
    chunks = [", ".join(_cxx_param(p) for p in params[i:i + per_line]) for i in range(0, len(params), per_line)]
    body = ", \\\n    ".join(chunks)
    return [f"#define {name} \\\n    {body}"]


def _list_enumerator(family: str, name: str) -> str:
    """The C++ name of a rank-table list's index (``kListIn``, ``kListFp8Scale``)."""
    return "kList" + "".join(part.capitalize() for part in name.split("_"))


def _lists_lines() -> list[str]:
    out = []
    for family, lists in POINTER_LISTS.items():
        tag = "".join(part.capitalize() for part in family.split("_"))
        items = [(f"kLists{tag}", len(lists))]
        if family == "rmsnorm_fp8":  # the superset: every list's index once
            items += [(_list_enumerator(family, n), i) for i, (n, _) in enumerate(lists)]
        out.append(f"enum RankTable{tag} : int {{ " + ", ".join(f"{k} = {v}" for k, v in items) + " };")
    return ["namespace sollat {", *out, "}  // namespace sollat"]


def _table_param(family: str) -> Param:
    tag = "".join(part.capitalize() for part in family.split("_"))
    return Param("ptrs", f"const __grid_constant__ RankTable<kLists{tag}>")


def header_text() -> str:
    """``csrc/include/sollat/abi.h``: this module's contract as C++."""
    banner = [
        f"// GENERATED by sollat/device/abi_header.py from sollat/device/abi.py - do not edit. Regenerate: {REGENERATE}",
        "// sollat/abi.h - the host/device contract: limits, control block, fault record, CommState,",
        "// entry-point parameters and element bit patterns (sollat/device/abi.py declares each once).",
    ]
    body = [
        f"#define SOLLAT_MAX_THREADS {MAX_THREADS}  // the most threads per block of any kernel (abi.py MAX_THREADS)",
        "",
        "namespace sollat {",
        "",
        *_typedefs(),
        "",
        *_constants(),
        "",
        *_per_kernel_lines(),
        "",
        *_fault_lines(),
        "",
        *_bits_lines(),
        "",
        "// Written once by the host (comm/real.py, abi.pack_state), read by every kernel.",
        *_state_lines(),
        "",
        "}  // namespace sollat",
        "",
        "// Entry-point parameters: the rank table (collective.h RankTable, POINTER_LISTS), then the tail",
        "// (host: abi.kernel_tail packs it in this order).",
        *_lists_lines(),
        *_params_macro("SOLLAT_PARAMS", (_table_param("collective"),) + TAIL_PARAMS),
        *_params_macro("SOLLAT_RMSNORM_PARAMS", (_table_param("rmsnorm"),) + RMSNORM_TAIL_PARAMS),
        *_params_macro("SOLLAT_RMSNORM_FP8_PARAMS", (_table_param("rmsnorm_fp8"),) + RMSNORM_TAIL_PARAMS),
        *_params_macro("SOLLAT_ADD_RMSNORM_PARAMS", (_table_param(ADD_RMSNORM_LISTS),) + ADD_RMSNORM_TAIL_PARAMS),
    ]
    return framed(banner, "SOLLAT_ABI_H_", body)


HEADER = GeneratedHeader(HEADER_PATH, header_text)

if __name__ == "__main__":
    HEADER.print()
