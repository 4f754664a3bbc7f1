"""The contract between host and device, declared once.

Every number, record word, struct field and kernel parameter that Python and the CUDA C++ must
agree on is written here, as plain data. ``layout.py``, ``dtypes.py``, ``faults.py`` and
``communicator.py`` read it; ``header_text()`` renders it as ``csrc/include/sollat/abi.h``, which
the device headers include (a CPU test checks that the committed header equals the rendering).

Regenerate the header after editing this file::

    python -m sollat.abi > sollat/csrc/include/sollat/abi.h

(``python -m sollat.abi_layout`` renders ``layout.h`` from the formulas in ``sollat/abi_layout.py``.)
"""

from __future__ import annotations

import re
import struct
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HEADER_PATH = Path(__file__).parent / "csrc" / "include" / "sollat" / "abi.h"
REGENERATE = "python -m sollat.abi > sollat/csrc/include/sollat/abi.h"

# ---- geometry limits --------------------------------------------------------------------------
MAX_RANKS = 72  # world size and the CommState scratch array (C++ kMaxWorld): an NVL72 domain
# Peers an LLBuffer keeps in registers and polls at once (C++ kPeerWindow): kernels built for at
# most this many ranks unroll every peer loop; wider ones walk the peers in windows of this many,
# in rank order, with the peers' scratch bases read from CommState (ll_buffer.h, "Wide groups").
PEER_WINDOW = 8
# The rank counts kernels are built for (SOLLAT_MAX_RANKS): a world of R ranks runs the smallest
# that holds it (algorithms.max_ranks_template).
RANK_CAPS: tuple[int, ...] = (2, 4, PEER_WINDOW, MAX_RANKS)
MAX_THREADS = 512  # threads per block; also every kernel's __launch_bounds__
MAX_SLOTS = 4  # lines per thread per iteration (C++ kMaxSlotsPerThread)
LINE_BYTES = 16  # one vector store
WARP = 32

PARITIES = 2  # copies of every line (double buffering by epoch parity)
# The bulk protocol (bulk_buffer.h): block b's area in every (parity, source) part of a region is
# the MAX_SLOTS * MAX_THREADS lines from slot_index(b, 0, 0) (its slot indices); all but the last
# carry data, the last holds the area's flag.
BULK_AREA_LINES = MAX_SLOTS * MAX_THREADS
BULK_DATA_LINES = BULK_AREA_LINES - 1

# Fused RMSNorm: most blocks that share one row (a thread-block cluster; 8 is the portable size),
# and most threads per block (its __launch_bounds__: at 512 threads, 128 registers per thread, the
# 16-bit sentinel 8-rank entries spilled up to 40 bytes; at 256 none spills).
RMSNORM_MAX_ROW_BLOCKS = 8
RMSNORM_MAX_THREADS = 256
# The longest row all_reduce_rmsnorm takes (elements; rmsnorm.MAX_HIDDEN): it bounds the chunk sums
# of a row's sum of squares that both RMSNorm kernels keep in shared memory (rmsnorm_math.h).
RMSNORM_MAX_HIDDEN = 65536

# Payload bytes per 16-byte line, per protocol (C++ ProtoLL / ProtoSentinel::kPayloadBytes; the bulk
# protocol's data lines are all payload, its completion is one flag per area: bulk_buffer.h).
PAYLOAD_BYTES: dict[str, int] = {"ll": 8, "sentinel": 16, "bulk": 16}
# The byte every scratch line of a protocol's region holds at rest (the host fills regions with it):
# LL and LL128 zero, sentinel all ones (every dtype's sentinel, checked below), bulk zero (its flags
# start at sequence number 0).
REST_BYTE: dict[str, int] = {"ll": 0x00, "sentinel": 0xFF, "bulk": 0x00}


# ---- kernels ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Kernel:
    name: str  # entry-point prefix: <name>_pg / <name>_vr (SOLLAT_DEFINE_ENTRY_POINTS)
    buffers: int  # LLBuffer regions (and epoch arrays) per rank; the kernel's kBuffers


KERNELS: dict[str, Kernel] = {k.name: k for k in (Kernel("oneshot", 1), Kernel("twoshot", 2), Kernel("ll128", 2),
                                                  Kernel("ar_rmsnorm", 1), Kernel("ar_rmsnorm_twoshot", 2),
                                                  Kernel("allgather", 1),
                                                  Kernel("reduce_scatter", 1), Kernel("twoshot_bulk", 2))}


def kernel_buffers_name(k: Kernel) -> str:
    """The C++ name of a kernel's buffer count in abi.h (``kOneshotBuffers``)."""
    return "k" + "".join(part.capitalize() for part in k.name.split("_")) + "Buffers"


# ---- LL128 warp-unit (csrc/include/sollat/ll128.h) --------------------------------------------
# A warp's unit is LL128_LINES_PER_UNIT lines of LL128_LINE_BYTES; each lane (thread) holds one
# 16-byte piece. Element 0 of every line carries its counter; lane LL128_DISPLACED_LANE carries
# the elements the counters displaced, so the other lanes carry user data.
LL128_LINE_BYTES = 128  # one line-atomic add: 8 lanes
LL128_LINES_PER_UNIT = 4
LL128_UNIT_BYTES = LL128_LINES_PER_UNIT * LL128_LINE_BYTES  # 512: one lane per thread of a warp
LL128_DISPLACED_LANE = WARP - 1
LL128_DATA_LANES = WARP - 1
LL128_UNIT_USER_BYTES = LL128_DATA_LANES * LINE_BYTES  # 496

# ---- control block and fault record -----------------------------------------------------------
# Every rank's scratch starts with a control block of CONTROL_BYTES; it holds the rank's fault
# record (FAULT_RECORD_WORDS u32 words at FAULT_RECORD_OFFSET), zero while healthy.
CONTROL_BYTES = 512
FAULT_RECORD_OFFSET = 0
FAULT_RECORD_WORDS: tuple[str, ...] = ("code", "rank", "peer", "block", "thread", "slot", "epoch", "seen",
                                       "collective")
FAULT_WORDS = len(FAULT_RECORD_WORDS)
# Word 0's values; CLAIMED: a writer is filling words 1..FAULT_WORDS-1.
FAULT_CODES: dict[str, int] = {"ok": 0, "timeout": 1, "mismatch": 2, "claimed": 0xFFFFFFFF}
# The "collective" word: which public call the kernel that wrote the record serves. Every build
# gets its code as SOLLAT_COLLECTIVE (algorithms.kernel_defines); 0 in a build without it.
COLLECTIVES: dict[str, int] = {"unknown": 0, "all_reduce": 1, "all_gather": 2, "reduce_scatter": 3,
                               "all_reduce_rmsnorm": 4, "run": 5}


# ---- C types ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class CType:
    builtin: str  # the C++ type (abi.h typedefs the short names to it)
    fmt: str  # struct module code
    np_type: type  # numpy scalar a kernel argument of this type is passed as


CTYPES: dict[str, CType] = {
    "u64": CType("unsigned long long", "Q", np.uint64),
    "u32": CType("unsigned int", "I", np.uint32),
    "u16": CType("unsigned short", "H", np.uint16),
    "int": CType("int", "i", np.int32),
}
_POINTER = CType("", "Q", np.uint64)  # every pointer is 8 bytes


def ctype(name: str) -> CType:
    return _POINTER if name.endswith("*") else CTYPES[name]


# ---- CommState: written once by the host, read by every kernel --------------------------------
@dataclass(frozen=True)
class Field:
    name: str
    ctype: str
    count: int = 1
    doc: str = ""


# The scalars first: with them, the first 128-byte line (the one the prologue prefetches) holds
# the scratch bases of ranks 0..12.
COMM_STATE: tuple[Field, ...] = (
    Field("err_host", "u64", doc="host-mapped fault flag (u32), or 0"),
    Field("timeout_ns", "u64", doc="bound of every spin"),
    Field("absent_rank", "int", doc="test hook: this rank's blocks return at once (-1: none)"),
    Field("mismatch_rank", "int", doc="test hook: this rank flips a bit of its call signature (-1: none)"),
    Field("scratch", "u64", MAX_RANKS, "base of each rank's symmetric scratch, as mapped in this process"),
)
STATE_FORMAT = "<" + "".join(f"{f.count if f.count > 1 else ''}{ctype(f.ctype).fmt}" for f in COMM_STATE)
STATE_BYTES = struct.calcsize(STATE_FORMAT)


def pack_state(values: Mapping[str, Any]) -> bytes:
    """The CommState bytes: ``values`` keyed by field name (an array field takes a sequence)."""
    flat: list[int] = []
    for f in COMM_STATE:
        v = values[f.name]
        flat.extend(v if f.count > 1 else [v])
    if set(values) != {f.name for f in COMM_STATE}:
        raise KeyError(f"CommState fields: {sorted(set(values) ^ {f.name for f in COMM_STATE})}")
    return struct.pack(STATE_FORMAT, *flat)


# ---- kernel parameters --------------------------------------------------------------------------
@dataclass(frozen=True)
class Param:
    name: str
    ctype: str


# Every collective kernel has one entry point (SOLLAT_DEFINE_ENTRY_POINTS, collective.h) for both
# communicators. Its first parameter is the rank table: the call's tensor pointers, list by list
# (POINTER_LISTS), each list one pointer per launch rank: SOLLAT_TABLE_RANKS of them (1 on real
# ranks, where the launch is this rank; the kernel's rank cap on virtual ranks, rank = rank_base +
# blockIdx.y, the unused tail zero). The table travels as a __grid_constant__ parameter, so a block
# reads its rank's pointers with one indexed constant load. The tail follows (host:
# kernel_tail, keyed by name): `rec0` is launch rank 0's fault record, launch rank y's lies
# `rank_stride` bytes further (virtual ranks' scratches are back to back).
TAIL_PARAMS: tuple[Param, ...] = (
    Param("n", "u64"),
    Param("st", "const CommState*"),
    Param("region_off", "u64"),
    Param("lines_per_src", "int"),
    Param("epochs", "u32*"),
    Param("sig", "u32"),
    Param("rank_base", "int"),
    Param("nranks", "int"),
    Param("rec0", "u32*"),
    Param("rank_stride", "u64"),
)
_RMSNORM_PTRS: tuple[tuple[str, str], ...] = (("in", "const void*"), ("out", "void*"), ("res", "const void*"),
                                              ("res_out", "void*"), ("weight", "const void*"))
_RMSNORM_FP8_PTRS = _RMSNORM_PTRS + (("fp8_out", "void*"), ("fp8_scale", "const float*"))
# The rank table's lists, by entry-point family: (name, C type of each pointer) in table order.
POINTER_LISTS: dict[str, tuple[tuple[str, str], ...]] = {
    "collective": (("in", "const void*"), ("out", "void*")),
    # Fused AllReduce + residual add + RMSNorm (kernels/allreduce_rmsnorm.cu): x (in), y (out), the
    # residual, the updated residual and the weight; its FP8 variant (module define
    # SOLLAT_RMSNORM_FP8=1) adds the e4m3 copy of y and the float32 per-tensor scale it divides by.
    "rmsnorm": _RMSNORM_PTRS,
    "rmsnorm_fp8": _RMSNORM_FP8_PTRS,
}
# The fused RMSNorm's tail: the common one, then the row length and eps (its float32 bits: every
# parameter is packed as an integer, driver_launch.py).
RMSNORM_TAIL_PARAMS: tuple[Param, ...] = TAIL_PARAMS + (Param("hidden", "u64"), Param("eps_bits", "u32"))
RMSNORM_FP8_ENTRY = "ar_rmsnorm_fp8"


def table_size(family: str, table_ranks: int) -> int:
    """Pointers in the rank table of an entry point of ``family`` (a POINTER_LISTS key) built for
    ``table_ranks`` launch ranks."""
    return len(POINTER_LISTS[family]) * table_ranks


def rmsnorm_entry(kernel: str, fp8: bool) -> str:
    """The entry point of a fused RMSNorm kernel (a KERNELS name: ``ar_rmsnorm`` or its two-shot
    ``ar_rmsnorm_twoshot``), with the FP8 copy ``<kernel>_fp8``; same tail for both."""
    return f"{kernel}_fp8" if fp8 else kernel


assert rmsnorm_entry("ar_rmsnorm", True) == RMSNORM_FP8_ENTRY
# Residual add + RMSNorm on one GPU (kernels/add_rmsnorm.cu): the epilogue of all_reduce_rmsnorm's
# "unfused" algorithm, after the AllReduce. Its input is the AllReduce's output; no scratch, no
# peers. fp8_out / fp8_scale are 0 without the FP8 copy. One block of at most
# ADD_RMSNORM_MAX_THREADS threads per row.
ADD_RMSNORM_ENTRY = "add_rmsnorm"
ADD_RMSNORM_MAX_THREADS = 1024
ADD_RMSNORM_TAIL_PARAMS: tuple[Param, ...] = (Param("rows", "u64"), Param("hidden", "u64"), Param("eps_bits", "u32"))
ADD_RMSNORM_PARAMS: tuple[Param, ...] = tuple(Param(n, t) for n, t in _RMSNORM_FP8_PTRS) + ADD_RMSNORM_TAIL_PARAMS
# float8_e4m3fn (OCP E4M3, torch.float8_e4m3fn): the largest finite value (0x7E; the copy is
# clamped to +-FP8_E4M3_MAX) and the one NaN byte the kernel writes for every NaN (0x7F: no
# infinities in this format; 0xFF, the negative NaN, is never written).
FP8_E4M3_MAX = 448
FP8_E4M3_NAN = 0x7F


def kernel_tail(values: Mapping[str, int], params: Sequence[Param] = TAIL_PARAMS) -> tuple[Any, ...]:
    """The arguments after the tensor pointers, in declared order, each as its C type's numpy
    scalar: ``values`` keyed by ``params`` name (the ``_pg`` names; RMSNORM_TAIL_PARAMS for the
    fused RMSNorm kernel)."""
    if set(values) != {p.name for p in params}:
        raise KeyError(f"kernel tail parameters: {sorted(set(values) ^ {p.name for p in params})}")
    return tuple(ctype(p.ctype).np_type(values[p.name]) for p in params)


assert LL128_UNIT_BYTES == WARP * LINE_BYTES, "a warp-unit is one 16-byte lane per thread"
assert CONTROL_BYTES % LL128_UNIT_BYTES == 0, "regions after the control block stay unit-aligned"


# ---- element bit patterns ---------------------------------------------------------------------
@dataclass(frozen=True)
class Bits:
    short: str  # dtype short name (dtypes.DType.short)
    width: int  # bits per element
    sentinel: int  # an empty sentinel slot (a NaN of this dtype)
    canonical_nan: int  # every NaN is sent as this (a NaN, never the sentinel)


BITS: dict[str, Bits] = {b.short: b for b in (
    Bits("f32", 32, 0xFFFFFFFF, 0x7FC00000),
    Bits("bf16", 16, 0xFFFF, 0x7FC0),
    Bits("f16", 16, 0xFFFF, 0x7E00),
    Bits("f64", 64, 0xFFFFFFFFFFFFFFFF, 0x7FF8000000000000),
)}
assert all(b.sentinel == int.from_bytes(bytes([REST_BYTE["sentinel"]]) * (b.width // 8), "little") for b in BITS.values()), \
    "a sentinel region at rest is empty in every dtype"


# ---- the header ---------------------------------------------------------------------------------
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
        "// Buffers per kernel (sollat/abi.py KERNELS): each kernel's kBuffers is its k<Name>Buffers.",
        _enum("KernelBuffers", [(kernel_buffers_name(k), k.buffers) for k in KERNELS.values()]),
        _enum("Parity", [("kParities", PARITIES)]),
        "// Fused RMSNorm (allreduce_rmsnorm.cu, one- and two-shot): the widest row cluster, the most threads per block;"
        " the longest row (both RMSNorm kernels).",
        _enum("RmsnormGeometry", [("kRmsnormMaxRowBlocks", RMSNORM_MAX_ROW_BLOCKS),
                                   ("kRmsnormMaxThreads", RMSNORM_MAX_THREADS),
                                   ("kRmsnormMaxHidden", RMSNORM_MAX_HIDDEN)]),
        "// Its one-GPU epilogue (add_rmsnorm.cu, the \"unfused\" algorithm): the most threads per block (one row).",
        _enum("AddRmsnormGeometry", [("kAddRmsnormMaxThreads", ADD_RMSNORM_MAX_THREADS)]),
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
    out.append(f'static_assert(sizeof(CommState) == {STATE_BYTES}, "CommState: sollat/abi.py STATE_FORMAT");')
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
    lines = [
        f"// GENERATED by sollat/abi.py - do not edit. Regenerate: {REGENERATE}",
        "// sollat/abi.h - the host/device contract: limits, control block, fault record, CommState,",
        "// entry-point parameters and element bit patterns (sollat/abi.py declares each once).",
        "#ifndef SOLLAT_ABI_H_",
        "#define SOLLAT_ABI_H_",
        "",
        f"#define SOLLAT_MAX_THREADS {MAX_THREADS}  // __launch_bounds__ of every entry point",
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
        "// Written once by the host (communicator.py, abi.pack_state), read by every kernel.",
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
        *_params_macro("SOLLAT_ADD_RMSNORM_PARAMS", ADD_RMSNORM_PARAMS),
        "",
        "#endif  // SOLLAT_ABI_H_",
    ]
    return "\n".join(lines) + "\n"


def write_header(path: Path = HEADER_PATH) -> None:
    path.write_text(header_text())


def header_is_current(path: Path = HEADER_PATH) -> bool:
    """Whether ``path`` is byte for byte what ``header_text()`` renders."""
    return path.read_bytes() == header_text().encode()


# `python -m sollat.abi` writes abi.h; `python -m sollat.abi_layout` writes layout.h, rendered from
# the layout formulas that sollat/abi_layout.py declares (sollat.layout evaluates the same ones).
if __name__ == "__main__":
    sys.stdout.write(header_text())
