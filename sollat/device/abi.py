"""The contract between host and device, declared once.

Every number, record word, struct field and kernel parameter that Python and the CUDA C++ must
agree on is written here, as plain data. ``layout.py``, ``dtypes.py``, ``faults.py`` and
``comm/real.py`` read it; ``sollat/device/abi_header.py`` renders it as ``csrc/include/sollat/abi.h``,
which the device headers include (a CPU test checks that the committed header equals the rendering).

Regenerate the header after editing this file::

    python -m sollat.device.abi_header > sollat/device/csrc/include/sollat/abi.h

(``python -m sollat.device.abi_layout`` renders ``layout.h`` from the formulas in ``sollat/device/abi_layout.py``.)
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# ---- geometry limits --------------------------------------------------------------------------
MAX_RANKS = 72  # world size and the CommState scratch array (C++ kMaxWorld): an NVL72 domain
# Peers an LLBuffer keeps in registers and polls at once (C++ kPeerWindow): kernels built for at
# most this many ranks unroll every peer loop; wider ones walk the peers in windows of this many,
# in rank order, with the peers' scratch bases read from CommState (ll_buffer.h, "Wide groups").
PEER_WINDOW = 8
# The rank counts kernels are built for (SOLLAT_MAX_RANKS): a world of R ranks runs the smallest
# that holds it (algorithms.max_ranks_template).
RANK_CAPS: tuple[int, ...] = (2, 4, PEER_WINDOW, MAX_RANKS)
# The wide one-shot's narrower cap (C++ kWideUnrolledRanks): groups of PEER_WINDOW + 1 .. 16 ranks
# run its build for this cap, whose rank-order sum is unrolled over every rank
# (kernels/allreduce_oneshot_wide.cu; algorithms.rank_cap; the communicator's other kernels keep
# their RANK_CAPS cap). Kernels built for at most PEER_WINDOW ranks hold every peer's scratch base
# in registers; wider ones read a peer's base from CommState (ll_buffer__types.h BufferDesc).
WIDE_UNROLLED_RANKS = 2 * PEER_WINDOW
# Threads per block the scratch layout reserves slot indices for (layout.slot_index), and the most any
# kernel launches with: its __launch_bounds__ unless its KERNELS entry names fewer.
MAX_THREADS = 512
# The wide one-shot (kernels/allreduce_oneshot_wide.cu) keeps one pass's (line, rank) packs of a
# block in shared memory, 8 bytes each (C++ kPeerGroupPacks: 32 KiB). Its blocks hold
# layout.peer_group_lines(R) lines of ceil(R / PEER_WINDOW) threads each, at most MAX_THREADS
# threads, so lines x R never exceeds this (abi_layout.py, "peer groups").
PEER_GROUP_PACKS = MAX_THREADS * PEER_WINDOW
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
    name: str  # the entry point (SOLLAT_DEFINE_ENTRY_POINTS, both communicators)
    buffers: int  # LLBuffer regions (and epoch arrays) per rank; the kernel's kBuffers
    # Most threads per block: the __launch_bounds__ of a collective.h entry point (module define
    # SOLLAT_BLOCK_THREADS where it is below MAX_THREADS) and layout.plan's cap. The fused RMSNorm
    # kernels have their own (RMSNORM_MAX_THREADS, rmsnorm_block_build).
    threads: int = MAX_THREADS


# A kernel that keeps a poll set of every peer's lines, the peers' scratch bases and a batch of
# inputs in registers at once is capped at SPILL_FREE_THREADS threads per block: ptxas then has 255
# registers per thread instead of 128 (65536 per SM at one block), and no build spills for sm_90 or
# sm_100 (tests/cpu/test_spills.py; at 512 threads the sentinel and LL128 builds spilled up to 780
# bytes). Small messages run fewer threads per block than that anyway (layout.plan).
SPILL_FREE_THREADS = 256
KERNELS: dict[str, Kernel] = {k.name: k for k in (
    Kernel("oneshot", 1, SPILL_FREE_THREADS), Kernel("twoshot", 2, SPILL_FREE_THREADS),
    Kernel("ll128", 2, SPILL_FREE_THREADS), Kernel("ar_rmsnorm", 1), Kernel("ar_rmsnorm_twoshot", 2),
    Kernel("allgather", 1), Kernel("reduce_scatter", 1, SPILL_FREE_THREADS), Kernel("twoshot_bulk", 2),
    Kernel("oneshot_wide", 1), Kernel("ar_rmsnorm_block", 1))}


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
# peers. Its pointers are a rank table of the FP8 variant's lists (ADD_RMSNORM_LISTS; fp8_out and
# fp8_scale 0 without the FP8 copy), so that one launch serves every virtual rank (grid.y); then
# the tail. One block of at most ADD_RMSNORM_MAX_THREADS threads per row (its __launch_bounds__);
# a pass of the block covers ADD_RMSNORM_PASS_ELEMS elements of the row, whatever the dtype: each
# thread takes add_rmsnorm_slots(element bytes) 16-byte lines per pass (4 for fp32, 2 for 16-bit
# types). Four 16-bit lines a thread (three loads each: x, the residual, the weight) need more
# than the 128 registers 512 threads leave (sm_100 spilled); two hold the same row of 8192.
ADD_RMSNORM_ENTRY = "add_rmsnorm"
ADD_RMSNORM_MAX_THREADS = 512
ADD_RMSNORM_PASS_ELEMS = 8192
ADD_RMSNORM_LISTS = "rmsnorm_fp8"
ADD_RMSNORM_TAIL_PARAMS: tuple[Param, ...] = (Param("rows", "u64"), Param("hidden", "u64"), Param("eps_bits", "u32"))


def add_rmsnorm_slots(elem_bytes: int) -> int:
    """16-byte lines per thread and pass of kernels/add_rmsnorm.cu for elements of ``elem_bytes``
    (C++: the same expression over kAddRmsnormPassElems, kLineBytes and kAddRmsnormMaxThreads)."""
    return ADD_RMSNORM_PASS_ELEMS * elem_bytes // (LINE_BYTES * ADD_RMSNORM_MAX_THREADS)


assert add_rmsnorm_slots(4) == 4 and add_rmsnorm_slots(2) == 2
# float8_e4m3fn (OCP E4M3, torch.float8_e4m3fn): the largest finite value (0x7E; the copy is
# clamped to +-FP8_E4M3_MAX) and the one NaN byte the kernel writes for every NaN (0x7F: no
# infinities in this format; 0xFF, the negative NaN, is never written).
FP8_E4M3_MAX = 448
FP8_E4M3_NAN = 0x7F


def kernel_tail(values: Mapping[str, int], params: Sequence[Param] = TAIL_PARAMS) -> tuple[Any, ...]:
    """The arguments after the tensor pointers, in declared order, each as its C type's numpy
    scalar: ``values`` keyed by ``params`` name (RMSNORM_TAIL_PARAMS for the
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
