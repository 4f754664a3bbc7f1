"""The algorithm registry: which kernel implements each named algorithm and what it supports.

Adding an algorithm = one kernel file written with the LLBuffer API (or, for bulk transfers, the
BulkBuffer API) + one entry here.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import torch

from ..device import abi, environment, layout
from ..device.dtypes import DTYPES, OPS, DType
from ..errors import UnsupportedError
from .rmsnorm_block_build import RMSNORM_BLOCK_PIPELINED, rmsnorm_block_threads

_FLOATS = frozenset(DTYPES)

#: How the kernels of each protocol see a peer that made a different call (CallMismatchError on every
#: rank). Every algorithm, user-written ones included, runs on one of these (Algorithm refuses others).
MISMATCH_DETECTION: dict[str, str] = {
    "ll": "the call signature rides in both flag words of every line (LL128's counters also overshoot)",
    "sentinel": "signature words travel with the data lines and every receive that waits for one checks it "
                "(ll_buffer.h, \"Signature words\")",
    "bulk": "the call signature rides in every area's flag (bulk_buffer.h)",
}


@dataclass(frozen=True)
class Algorithm:
    name: str
    kernel_file: str
    kernel: str  # entry point (both communicators: collective.h), a key of abi.KERNELS
    proto: str  # "ll" | "sentinel" (LL128's all-gather is LL) | "bulk" (bulk_buffer.h: one flag per block area)
    max_blocks: int  # default blocks per rank (virtual ranks); a communicator may size its scratch for more
    deterministic: bool
    two_shot: bool
    dtypes: frozenset[torch.dtype] = _FLOATS
    ops: frozenset[str] = frozenset(OPS)
    # (rank cap, slots) instantiations that compile without register spills; the rank caps are
    # abi.RANK_CAPS, and the widest one listed is the most ranks the algorithm runs on (WIDE: the
    # windowed peer loops of ll_buffer.h, up to abi.MAX_RANKS)
    slot_choices: tuple[tuple[int, int], ...] = ((2, 1), (2, 2), (4, 1), (4, 2), (8, 1), (abi.MAX_RANKS, 1))
    # The fewest ranks it runs on (a kernel for wide groups only: abi.PEER_WINDOW + 1)
    min_world: int = 2
    # Its threads are (peer group, line) pairs (layout.plan_peer_groups), not lines (layout.plan)
    peer_groups: bool = False
    # LL128 atomic: a warp-unit (abi.LL128_UNIT_BYTES of scratch) carries this many user bytes (0: line-based)
    unit_user_bytes: int = 0
    # A hardware property its correctness on real ranks rests on, beyond what the PTX memory model
    # promises (empty: none; LL and sentinel lines need only single-copy atomic 8-byte accesses:
    # protocol_ll.h). `tune` never puts such an algorithm into a real-rank table; algo= still runs it.
    rests_on: str = ""
    doc: str = ""
    # Scratch region (and epoch array) it runs on: "" = its own, named after it. Kernels of one
    # protocol may share one (GATHER_SCATTER_ALGORITHMS): a channel then simply carries the next
    # epoch for whichever of them runs next, as one kernel's calls of different sizes do.
    region: str = ""

    def __post_init__(self) -> None:
        if self.proto not in MISMATCH_DETECTION:
            raise ValueError(f"algorithm {self.name!r}: protocol {self.proto!r} has no mismatch detection "
                             f"(MISMATCH_DETECTION: {', '.join(MISMATCH_DETECTION)})")

    @property
    def buffers(self) -> int:
        """LLBuffer regions (and epoch arrays) per rank: the kernel's, from the contract."""
        return abi.KERNELS[self.kernel].buffers

    @property
    def max_threads(self) -> int:  # its kernel's threads per block (abi.KERNELS; user-written: abi.MAX_THREADS)
        return abi.KERNELS[self.kernel].threads if self.kernel in abi.KERNELS else abi.MAX_THREADS

    @property
    def payload_bytes(self) -> int:
        return layout.PAYLOAD_BYTES[self.proto]

    def elems_per_line(self, dt: DType) -> int:
        return self.payload_bytes // dt.size

    def lines_per_rank(self, n: int, dt: DType, nranks: int) -> int:
        """Lines each thread-grid of one rank walks: the message (one-shot) or one chunk (two-shot)."""
        count = layout.chunk_count(n, nranks) if self.two_shot else n
        if self.unit_user_bytes:  # one lane (16-byte line) per thread of a warp-unit
            return layout.WARP * layout.ceil_div(count, self.unit_user_bytes // dt.size)
        return layout.ceil_div(count, self.elems_per_line(dt))

    @property
    def max_world(self) -> int:
        """The most ranks it runs on: its widest instantiation."""
        return max(r for r, _ in self.slot_choices)

    def max_slots(self, max_ranks: int) -> int:
        return max(s for r, s in self.slot_choices if r == max_ranks)

    def check_world(self, world_size: int, opname: str = "all_reduce") -> None:
        """Raise if this algorithm has no kernel for ``world_size`` ranks."""
        if not self.runs_on(world_size):
            raise UnsupportedError(f"{opname}: algorithm {self.name!r} runs on {self.min_world} to {self.max_world} "
                                   f"ranks, this communicator has {world_size}")

    def runs_on(self, world_size: int) -> bool:
        """Whether it has a kernel for ``world_size`` ranks (min_world .. max_world)."""
        return self.min_world <= world_size <= self.max_world

    def scratch_bytes(self, nranks: int, max_blocks: int | None = None) -> int:
        return self.buffers * layout.region_bytes(nranks, max_blocks or self.max_blocks)

    def epoch_words(self, max_blocks: int | None = None) -> int:
        return self.buffers * layout.lines_per_src(max_blocks or self.max_blocks)

    def check(self, dtype: torch.dtype, op: str, opname: str = "all_reduce") -> None:
        if dtype not in self.dtypes:
            ok = ", ".join(str(d).replace("torch.", "") for d in self.dtypes)
            raise UnsupportedError(f"{opname}: algorithm {self.name!r} does not support dtype {dtype}; it supports {ok}")
        if op not in self.ops:
            raise UnsupportedError(f"{opname}: algorithm {self.name!r} does not support op {op!r}; it supports {sorted(self.ops)}")


ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        Algorithm("oneshot_ll", "allreduce_oneshot.cu", "oneshot", "ll", 16, True, False,
                  doc="one-shot push, LL protocol (16 B lines: two 8 B words of 4 B payload + 4 B flag each)"),
        Algorithm("oneshot_sentinel", "allreduce_oneshot.cu", "oneshot", "sentinel", 16, True, False,
                  doc="one-shot push, sentinel protocol (16 B payload, receiver resets, a signature word per block)"),
        Algorithm("twoshot_ll", "allreduce_twoshot.cu", "twoshot", "ll", 16, True, True,
                  slot_choices=((2, 1), (2, 2), (4, 1), (8, 1), (abi.MAX_RANKS, 1)),
                  doc="two-shot (reduce-scatter + all-gather), LL protocol in both phases"),
        Algorithm("twoshot_sentinel", "allreduce_twoshot.cu", "twoshot", "sentinel", 16, True, True,
                  slot_choices=((2, 1), (2, 2), (4, 1), (8, 1), (abi.MAX_RANKS, 1)),
                  doc="two-shot (reduce-scatter + all-gather), sentinel protocol in both phases"),
        Algorithm("ll128", "allreduce_ll128.cu", "ll128", "ll", 16, False, True,
                  dtypes=frozenset({torch.float32, torch.bfloat16, torch.float16}), ops=frozenset({"sum"}),
                  slot_choices=((2, 1), (4, 1), (8, 1)), unit_user_bytes=abi.LL128_UNIT_USER_BYTES,
                  rests_on="NVLink delivering each 128-byte line atomically (the fused counter, SOLLAT_LL128_SPLIT=0)",
                  doc="two-shot LL128 atomic: 128 B line atomic adds with a counter element, LL all-gather; "
                      "not deterministic, fp32 atomics flush denormals"),
        Algorithm("twoshot_bulk", "allreduce_bulk.cu", "twoshot_bulk", "bulk", 16, True, True,
                  slot_choices=((2, 1), (4, 1), (8, 1)), doc="two-shot (reduce-scatter + all-gather) for large messages: block-sized areas copied "
                      "straight from the input, one flag per area (bulk protocol), rank-order reduction"),
        # Last: the other algorithms' regions keep their offsets. Scratch: one LL region like oneshot_ll's.
        Algorithm("oneshot_ll_wide", "allreduce_oneshot_wide.cu", "oneshot_wide", "ll", 16, True, False,
                  slot_choices=((abi.WIDE_UNROLLED_RANKS, 1), (abi.MAX_RANKS, 1)), min_world=abi.PEER_WINDOW + 1,
                  peer_groups=True, doc="one-shot push for wide groups (9..72 ranks), LL: a line's peers spread over the "
                  "block's threads (one per peer group of 8), rank-order sum from shared memory"),
    )
}


# Fused AllReduce + residual add + RMSNorm (``all_reduce_rmsnorm``; sollat/collectives/rmsnorm.py): one-shot or
# two-shot, a cluster of blocks per token row. Not AllReduce algorithms (``algo="auto"`` of
# all_reduce never sees them), but each has its own scratch region and epochs in every
# communicator, like those, of RMSNORM_MAX_BLOCKS blocks per rank: 8 decode rows of 4 blocks each
# (rmsnorm.row_geometry). The two-shot (one module define of the same kernel file: two buffers, the
# reduce-scatter of x to each row's owner and the all-gather of the fp32 sums): ``algo="auto"``
# never picks it (rmsnorm.AUTO_ALGOS; measured slower, below).
RMSNORM_MAX_BLOCKS = 32
# The two-shot is opt-in: a communicator gives it scratch regions (and accepts algo="twoshot_sentinel")
# only when this variable is "1" in its process at construction, on every rank alike (part of the
# setup agreement); without it the layout and scratch size are those verified on GPUs. It is
# slower than the one-shot at every measured shape, sentinel only (an LL slot written only in the
# passes whose row its destination owns can hold a line older than protocol_ll.h's no-reset
# argument allows: the protocol model's planted owner-only-slots/rmsnorm-twoshot-ll-bits2), and a
# fault may name the waiting row owner instead of the absent rank: docs/design.md, "Two-shot".
RMSNORM_TWOSHOT_ENV = "SOLLAT_EXPERIMENTAL_RMSNORM_TWOSHOT"
RMSNORM_EXPERIMENTAL = frozenset({"rmsnorm_twoshot_sentinel"})


def rmsnorm_twoshot_enabled() -> bool:
    return environment.flag(RMSNORM_TWOSHOT_ENV)


RMSNORM_ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        Algorithm("rmsnorm_oneshot_ll", "allreduce_rmsnorm.cu", "ar_rmsnorm", "ll", RMSNORM_MAX_BLOCKS, True, False,
                  dtypes=frozenset({torch.float32, torch.bfloat16, torch.float16}), ops=frozenset({"sum"}),
                  doc="fused AllReduce + residual add + RMSNorm, one-shot LL, a cluster of blocks per token row"),
        # 16-bit sentinel packs with 2 slots spill (40-172 bytes, ptxas -v): one slot only.
        Algorithm("rmsnorm_oneshot_sentinel", "allreduce_rmsnorm.cu", "ar_rmsnorm", "sentinel", RMSNORM_MAX_BLOCKS,
                  True, False,
                  dtypes=frozenset({torch.float32, torch.bfloat16, torch.float16}), ops=frozenset({"sum"}),
                  slot_choices=((2, 1), (4, 1), (8, 1), (abi.MAX_RANKS, 1)),
                  doc="fused AllReduce + residual add + RMSNorm, one-shot sentinel, a cluster of blocks per token row"),
        # Sentinel only: an LL two-shot is not sound (RMSNORM_TWOSHOT_ENV's comment).
        Algorithm("rmsnorm_twoshot_sentinel", "allreduce_rmsnorm.cu", "ar_rmsnorm_twoshot", "sentinel",
                  RMSNORM_MAX_BLOCKS, True, False,
                  dtypes=frozenset({torch.float32, torch.bfloat16, torch.float16}), ops=frozenset({"sum"}),
                  slot_choices=((2, 1), (4, 1), (8, 1), (abi.MAX_RANKS, 1)),
                  doc="fused AllReduce + residual add + RMSNorm, two-shot sentinel (reduce-scatter to the row's "
                      "owner, all-gather of the fp32 sums), a cluster of blocks per token row"),
        # One block per row (rmsnorm.block_row_geometry; kernels/allreduce_rmsnorm_block.cu), LL only.
        # It runs on rmsnorm_oneshot_ll's region and epochs (same protocol and blocks: a channel
        # carries the next epoch for whichever runs next, each call's lines its own signature), so
        # it costs no scratch.
        Algorithm("rmsnorm_oneshot_ll_block", "allreduce_rmsnorm_block.cu", "ar_rmsnorm_block", "ll",
                  RMSNORM_MAX_BLOCKS, True, False,
                  dtypes=frozenset({torch.float32, torch.bfloat16, torch.float16}), ops=frozenset({"sum"}),
                  slot_choices=((2, 1), (2, 2), (2, 4), (4, 1), (4, 2), (4, 4), (8, 1), (8, 2), (abi.MAX_RANKS, 1)),
                  region="rmsnorm_oneshot_ll",
                  doc="fused AllReduce + residual add + RMSNorm, one-shot LL, one block per token row"),
        # Pipelined passes (SOLLAT_RMSNORM_BLOCK_PIPE=1: two sets of channels, each pass's lines out
        # before the previous pass's are received; one receive group per pass, no 4-slot build at 4
        # or 8 ranks).
        Algorithm("rmsnorm_oneshot_ll_block_pipe", "allreduce_rmsnorm_block.cu", "ar_rmsnorm_block", "ll",
                  RMSNORM_MAX_BLOCKS, True, False,
                  dtypes=frozenset({torch.float32, torch.bfloat16, torch.float16}), ops=frozenset({"sum"}),
                  slot_choices=((2, 1), (2, 2), (2, 4), (4, 1), (4, 2), (8, 1), (8, 2), (abi.MAX_RANKS, 1)),
                  region="rmsnorm_oneshot_ll",
                  doc="fused AllReduce + residual add + RMSNorm, one-shot LL, one block per token row, "
                      "pipelined passes"),
    )
}
RMSNORM_KERNELS = frozenset(a.kernel for a in RMSNORM_ALGORITHMS.values())  # ar_rmsnorm[_twoshot, _block]


@dataclass(frozen=True)
class GatherScatterAlgorithm(Algorithm):
    """Built-in AllGather / ReduceScatter (``comm.all_gather`` / ``comm.reduce_scatter``;
    sollat/collectives/gather_scatter.py): one-shot push kernels on a region shared by both collectives of a
    protocol, sized for ``max_blocks`` blocks (not the communicator's)."""

    opname: str = "all_gather"  # the public call, for messages

    @property
    def gathers(self) -> bool:
        return self.opname == "all_gather"


# Built-in AllGather and ReduceScatter: one shared region per protocol, sized for
# GATHER_SCATTER_BLOCKS blocks per rank (2 x nranks MiB of scratch per rank for both regions).
GATHER_SCATTER_BLOCKS = 16
GATHER_SCATTER_ALGORITHMS: dict[str, GatherScatterAlgorithm] = {
    a.name: a
    for a in (
        GatherScatterAlgorithm("all_gather_ll", "allgather.cu", "allgather", "ll", GATHER_SCATTER_BLOCKS, True, False,
                               ops=frozenset({""}), region="gather_scatter_ll",
                               doc="AllGather, one-shot push, LL protocol"),
        GatherScatterAlgorithm("all_gather_sentinel", "allgather.cu", "allgather", "sentinel", GATHER_SCATTER_BLOCKS,
                               True, False, ops=frozenset({""}), region="gather_scatter_sentinel",
                               doc="AllGather, one-shot push, sentinel protocol"),
        GatherScatterAlgorithm("reduce_scatter_ll", "reduce_scatter.cu", "reduce_scatter", "ll",
                               GATHER_SCATTER_BLOCKS, True, True, region="gather_scatter_ll", opname="reduce_scatter",
                               doc="ReduceScatter, one-shot push of each chunk to its owner, LL, rank-order reduction"),
        GatherScatterAlgorithm("reduce_scatter_sentinel", "reduce_scatter.cu", "reduce_scatter", "sentinel",
                               GATHER_SCATTER_BLOCKS, True, True, region="gather_scatter_sentinel", opname="reduce_scatter",
                               doc="ReduceScatter, one-shot push of each chunk to its owner, sentinel, rank-order reduction"),
    )
}


@dataclass(frozen=True)
class CustomAlgorithm(Algorithm):
    """A user-written collective (``sollat.custom.Collective``) as the planner sees it: its source
    is compiled instead of a file of csrc/kernels, its buffer count is the user's (not abi.KERNELS),
    and it takes no reduction op (its kernel brings its own)."""

    source: str = ""
    n_buffers: int = 1
    gathers: bool = False  # the output is world_size times the input (rank r's data at r * n)

    @property
    def buffers(self) -> int:
        return self.n_buffers

    @property
    def opname(self) -> str:
        return f"run({self.kernel!r})"

    def check(self, dtype: torch.dtype, op: str, opname: str = "") -> None:
        if dtype not in self.dtypes:
            ok = ", ".join(sorted(str(d).replace("torch.", "") for d in self.dtypes))
            raise UnsupportedError(f"{opname or self.opname}: collective {self.kernel!r} does not support dtype "
                                   f"{dtype}; it was registered with dtypes {ok}")


@dataclass(frozen=True)
class Region:
    """One scratch region (and epoch array) of a communicator."""

    name: str  # key of _region_off / _epochs
    alg: Algorithm
    blocks: int  # blocks per rank it is sized for


def regions(names: tuple[str, ...], max_blocks: int, customs: tuple[Algorithm, ...] = (),
            gather_scatter: bool = False, fused_blocks: int | None = None) -> tuple[Region, ...]:
    """Every scratch region of a communicator, in layout order: the enabled AllReduce algorithms
    (``max_blocks`` blocks), every fused RMSNorm algorithm (its own blocks; the experimental two-shot
    only with RMSNORM_TWOSHOT_ENV), with ``gather_scatter`` the built-in AllGather/ReduceScatter regions
    (one per protocol, at most GATHER_SCATTER_BLOCKS blocks), then the user-written collectives
    registered at construction (``max_blocks``).
    ``fused_blocks`` caps the fused RMSNorm regions' blocks (virtual ranks: what R ranks can run at
    once on one GPU, layout.virtual_block_cap)."""
    shared: dict[str, Region] = {}
    for a in GATHER_SCATTER_ALGORITHMS.values() if gather_scatter else ():
        shared.setdefault(a.region, Region(a.region, a, min(max_blocks, a.max_blocks)))
    return (tuple(Region(n, ALGORITHMS[n], max_blocks) for n in names)
            + tuple(Region(n, a, min(a.max_blocks, fused_blocks or a.max_blocks)) for n, a in RMSNORM_ALGORITHMS.items()
                    if (n not in RMSNORM_EXPERIMENTAL or rmsnorm_twoshot_enabled()) and not a.region)
            + tuple(shared.values())
            + tuple(Region(a.name, a, max_blocks) for a in customs))


def rank_cap(alg: Any, nranks: int) -> int:
    """The rank cap (SOLLAT_MAX_RANKS) ``alg``'s kernel runs at for ``nranks`` ranks: the smallest of
    its instantiations that holds them (the wide one-shot's abi.WIDE_UNROLLED_RANKS cap below the widest
    one), else the communicator's (``max_ranks_template``)."""
    caps = [r for r, _ in getattr(alg, "slot_choices", ()) if r >= nranks]
    return min(caps) if caps else max_ranks_template(nranks)


def max_ranks_template(nranks: int) -> int:
    """The rank cap (SOLLAT_MAX_RANKS) a world of ``nranks`` runs: the smallest of abi.RANK_CAPS that holds it."""
    for r in abi.RANK_CAPS:
        if nranks <= r:
            return r
    raise UnsupportedError(f"sollat supports at most {layout.MAX_RANKS} ranks, got {nranks}")


_PROTO_CLASSES = {"ll": "ProtoLL", "sentinel": "ProtoSentinel"}  # protocol_ll.h, protocol_sentinel.h


def collective_name(alg: Algorithm) -> str:
    """The public call an algorithm's kernel serves (a key of abi.COLLECTIVES; the fault record names it)."""
    if isinstance(alg, CustomAlgorithm):
        return "run"
    if isinstance(alg, GatherScatterAlgorithm):
        return alg.opname
    if alg.kernel in RMSNORM_KERNELS:
        return "all_reduce_rmsnorm"
    return "all_reduce"


def kernel_defines(alg: Algorithm, dt: DType, op: str, max_ranks: int, slots: int, test_hooks: bool,
                   real_ranks: bool, fp8: bool = False) -> dict[str, str]:
    """NVRTC defines of one instantiation. ``real_ranks``: one rank per GPU (a Communicator: a rank
    table of one launch rank), else virtual ranks sharing one GPU (a table of ``max_ranks``). ``fp8``: the fused RMSNorm's
    variant that also writes an e4m3 copy of y (entry points abi.rmsnorm_entry)."""
    d = {
        "SOLLAT_T": dt.cxx,
        "SOLLAT_MAX_RANKS": str(max_ranks),
        "SOLLAT_SLOTS": str(slots),
        # Launch ranks in the rank table (collective.h RankTable): this rank, or every virtual rank.
        # A cap that is no communicator's (abi.WIDE_UNROLLED_RANKS) keeps the communicator's table: the
        # smallest of abi.RANK_CAPS that holds it (VirtualRanks.table_ranks).
        "SOLLAT_TABLE_RANKS": "1" if real_ranks else str(max_ranks_template(max_ranks)),
        # Fences that order a store to the own scratch before a peer may write it again: the peer
        # is another GPU on real ranks (system scope), this GPU on virtual ranks (memory.h).
        "SOLLAT_FENCE_SYS": "1" if real_ranks else "0",
        # What a fault record this kernel writes names as the collective (fault.h, abi.COLLECTIVES).
        "SOLLAT_COLLECTIVE": str(abi.COLLECTIVES[collective_name(alg)]),
    }
    if alg.proto in _PROTO_CLASSES:  # the bulk protocol's kernels take no line protocol
        d["SOLLAT_PROTO"] = _PROTO_CLASSES[alg.proto]
    if op:  # a user-written collective takes none (op ""): its kernel brings its own operator
        d["SOLLAT_OP"] = {"sum": "OpSum", "max": "OpMax", "min": "OpMin"}[op]
    if isinstance(alg, CustomAlgorithm):
        d["SOLLAT_BUFFERS"] = str(alg.buffers)  # the kernel's kBuffers (the epoch stride per launch rank)
    if alg.max_threads < abi.MAX_THREADS:  # its __launch_bounds__ (collective.h; absent: abi.MAX_THREADS)
        d["SOLLAT_BLOCK_THREADS"] = str(alg.max_threads)
    if alg.unit_user_bytes:
        # 1: data adds, fence, then counter add (model-correct on one GPU, used by virtual ranks);
        # 0: the paper's fused counter, relying on NVLink's 128-byte line atomicity (real ranks).
        d["SOLLAT_LL128_SPLIT"] = "0" if real_ranks else "1"
    if fp8:
        if alg.kernel not in RMSNORM_KERNELS:
            raise ValueError(f"only the fused RMSNorm has an FP8 variant, not {alg.name!r}")
        d["SOLLAT_RMSNORM_FP8"] = "1"  # absent otherwise: the plain module's defines (and cubin) stay as they were
    if alg.kernel == "ar_rmsnorm_block":  # its __launch_bounds__ (absent for every other kernel)
        d["SOLLAT_RMSNORM_BLOCK_THREADS"] = str(rmsnorm_block_threads(max_ranks, slots,
                                                                     alg.name in RMSNORM_BLOCK_PIPELINED))
        if alg.name in RMSNORM_BLOCK_PIPELINED:
            d["SOLLAT_RMSNORM_BLOCK_PIPE"] = "1"
    if alg.kernel == "ar_rmsnorm_twoshot":
        d["SOLLAT_RMSNORM_TWOSHOT"] = "1"  # absent for the one-shot: its defines (and cubin) stay as they were
    if test_hooks:
        d["SOLLAT_TEST_HOOKS"] = "1"
    return d


def signature(alg: Algorithm, dt: DType, op: str, n: int, call: str = "") -> int:
    """Odd 32-bit hash of the call's arguments (never 0): its two 16-bit halves ride in every LL
    word's flag (bit 16 is not carried there), the whole of it in bulk flags and sentinel
    signature words. ``call``: the arguments of the public call this AllReduce serves beyond its
    own (``all_reduce_rmsnorm``'s ``unfused`` algorithm passes ``rmsnorm.signature_text``: rows,
    hidden, eps, the FP8 copy), so that peers whose calls differ only there see a mismatch; ""
    for an ``all_reduce`` call (its signature is what it was without the argument)."""
    return zlib.crc32((f"{alg.name}|{dt.short}|{op}|{n}" + (f"|{call}" if call else "")).encode()) | 1


def get(name: str) -> Algorithm:
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise UnsupportedError(f"all_reduce: unknown algorithm {name!r}; known: {', '.join(ALGORITHMS)} or 'auto'") from None
