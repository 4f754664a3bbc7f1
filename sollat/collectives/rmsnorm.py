"""Fused AllReduce + residual add + RMSNorm (``all_reduce_rmsnorm``): argument checks, the
row geometry of ``csrc/kernels/allreduce_rmsnorm.cu``, the algorithm choice and the host reference.

Semantics (vLLM's ``fused_add_rms_norm`` after a tensor-parallel AllReduce), per row of
``hidden`` elements, accumulated in fp32, the same for every algorithm (docs/design.md,
"Arithmetic and batch invariance"; ``csrc/include/sollat/rmsnorm_math.h``)::

    s   = round(x_0 + x_1 + ... + x_{R-1})        # rank order, fp32: every sollat AllReduce's sum
    r   = round(float(s) + float(residual))       # two roundings, as the unfused path (one for fp32)
    ss  = pairwise tree over float(r_e)^2, e = 0..hidden-1, zero-padded to a power of two
    y   = round((float(r) * rstd) * float(weight)),  rstd = 1 / sqrt(ss / hidden + eps)

``residual_out`` receives ``r`` (``residual_out=residual`` updates the residual in place). With
``fp8_scale`` (vLLM's ``fused_add_rms_norm_static_fp8_quant``) the call also writes the float8_e4m3fn
copy (``fp8_reference`` replays it bit for bit)::

    q   = e4m3(clamp(float(y) / scale, -448, 448))   # the ROUNDED y (what vLLM quantises), div.rn,
                                                     # round to nearest even; every NaN -> 0x7F

None of it depends on the launch geometry (``RowGeometry``: rows, blocks, slots, threads, passes,
clusters), the protocol, the algorithm or the world size: every square is >= +0 (or +Inf, NaN) and
adding +0 to such a value changes no bit, so the zero-padded tree is the same tree however a kernel
cuts the row into power-of-two subtrees. Hence ``reference`` is ONE function for every algorithm
(the fused one-shots, the experimental two-shot, ``unfused``), and a row's bits do not depend on
the batch it travels in nor on which algorithm ``auto`` picks for that batch.

The experimental two-shot (``twoshot_sentinel``; sentinel only, sollat/collectives/algorithms.py says why)
cuts a row exactly as the one-shot of its protocol: rank ``row_owner(row)`` sums the row's partials
in rank order in fp32 and sends that sum to the others, and every rank rounds it, adds its own
residual and normalises, as in the one-shot.

The ``unfused`` hand-over runs sollat's AllReduce (rounded to the dtype: ``s``) and then
kernels/add_rmsnorm.cu (``auto`` follows the tuning table's rule: ``auto_choice``).
"""

from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass

import torch

from ..device import abi, layout
from ..device.dtypes import DTYPES, DType
from ..errors import UnsupportedError
from . import algorithms, rmsnorm_rules
from .algorithms import RMSNORM_ALGORITHMS, Algorithm, max_ranks_template, rmsnorm_block_threads

OPNAME = "all_reduce_rmsnorm"
MAX_HIDDEN = abi.RMSNORM_MAX_HIDDEN  # elements per row (the kernels loop over passes; above this a row is refused)
DTYPES_SUPPORTED = (torch.float32, torch.bfloat16, torch.float16)
FP8_DTYPE = torch.float8_e4m3fn  # the optional copy's type
# Public algorithm names (as for all_reduce) -> the registry's names (own scratch regions).
ALGOS: dict[str, str] = {"oneshot_ll": "rmsnorm_oneshot_ll", "oneshot_sentinel": "rmsnorm_oneshot_sentinel",
                         "twoshot_sentinel": "rmsnorm_twoshot_sentinel", "oneshot_ll_block": "rmsnorm_oneshot_ll_block",
                         "oneshot_ll_block_pipe": "rmsnorm_oneshot_ll_block_pipe"}
# The kernel that takes a row in one block (kernels/allreduce_rmsnorm_block.cu: block_row_geometry).
BLOCK_KERNEL = "ar_rmsnorm_block"
# The hand-over (no scratch of its own, not in ALGOS): sollat's deterministic AllReduce (``auto``;
# library paths included unless the communicator is batch-invariant) into the output, then
# kernels/add_rmsnorm.cu on one GPU (the residual add and the norm with the fused kernel's
# arithmetic; its launch: ``unfused_geometry``).
UNFUSED = "unfused"
PUBLIC_ALGOS: tuple[str, ...] = (*ALGOS, UNFUSED)
# What ``algo="auto"`` chooses: the tuning table's rule (``rmsnorm_rules``: by rows and row bytes, a
# fused one-shot, the AllReduce table's LL / sentinel choice, or the unfused hand-over); a table that
# has not measured one gets rmsnorm_rules.rules_for's: on virtual ranks rmsnorm_rules.builtin (by the
# bytes every rank receives), on real ranks rmsnorm_rules.DEFAULT: a fused one-shot for at most
# AUTO_FUSED_MAX_ROWS rows of at least AUTO_FUSED_MIN_ROW_BYTES each. The latter measured on 2 H200s (docs/benchmarks.md, the fused
# RMSNorm on two GPUs; bf16, µs, best fused one-shot / unfused): 1 x 8192 5.08 / 5.21, 2 x 8192 5.27 / 5.34, 4 x 8192
# 5.48 / 5.44, 8 x 8192 5.73 / 5.63, 1 x 4096 4.81 / 4.49, 8 x 4096 5.41 / 4.90, 16 x 8192 10.1 /
# 6.14, 128 x 8192 47.2 / 12.4: the fused kernel's row clusters take the rows eight at a time, one
# exchange after another, while the AllReduce moves them all at once and the epilogue normalises
# every row in parallel. The fused two-shot measured slower than the one-shot at every shape there
# (2 ranks): auto never picks it.
AUTO_ALGOS: tuple[str, ...] = ("oneshot_ll", "oneshot_sentinel")
AUTO_FUSED_MAX_ROWS = 2
AUTO_FUSED_MIN_ROW_BYTES = 16 << 10


# Lines one block of a row takes at most before the row is split over more blocks of a cluster
# (up to abi.RMSNORM_MAX_ROW_BLOCKS): a row in one block waits on one SM's loads and polls.
ROW_LINES_PER_BLOCK = 256


@dataclass(frozen=True)
class RowGeometry:
    """How one call is cut: identical on every rank (a pure function of the call, the world size
    and the block limit). It decides the launch and which thread computes which subtree of a row's
    sum of squares, never the bits (``reference`` takes no geometry).

    A row belongs to one cluster of ``row_blocks`` blocks; cluster c takes rows c, c + clusters,
    ... (``blocks // row_blocks`` clusters). Line l of a row (``elems_per_line`` elements) belongs
    to pass ``l // (row_blocks * slots * threads)``, block ``l // (slots * threads) % row_blocks``
    of the cluster, slot ``l // threads % slots``, thread ``l % threads``. Warps and blocks that
    hold no line take no part in the row's exchange: ``row_exchange``."""

    blocks: int  # per rank, a multiple of row_blocks
    threads: int  # multiple of 32, <= abi.RMSNORM_MAX_THREADS
    slots: int  # lines per thread per pass (kernel template kSlots)
    passes: int  # exchanges per row, each one epoch of the thread's channels
    row_lines: int
    elems_per_line: int
    row_blocks: int = 1  # blocks per row: the launch's cluster width (1, 2, 4, 8)


def row_geometry(alg: Algorithm, dt: DType, rows: int, hidden: int, world_size: int,
                 max_blocks: int | None = None, widest_blocks: int | None = None) -> RowGeometry:
    """Blocks per row: the fewest (a power of two) that leave each at most ROW_LINES_PER_BLOCK
    lines, but no more than abi.RMSNORM_MAX_ROW_BLOCKS and no more than leave every row its own
    cluster within the algorithm's blocks: rows that wait for each other cost a round trip each,
    more lines per block do not. Then, for one block's share, the fewest slots that hold it in one
    pass of at most abi.RMSNORM_MAX_THREADS threads, else the algorithm's most slots and several
    passes. As many row clusters as rows, up to ``max_blocks`` blocks in all (default the
    algorithm's; a VirtualCommunicator passes fewer when not all fit at once), at least one.
    ``widest_blocks`` (default the algorithm's blocks) bounds the cluster width instead: a wide
    group of virtual ranks whose clusters cannot all be resident passes fewer (same bits:
    rmsnorm_math.h)."""
    if alg.kernel == BLOCK_KERNEL:
        return block_row_geometry(alg, dt, rows, hidden, world_size, max_blocks)
    limit = alg.max_blocks if max_blocks is None else max_blocks
    epl = alg.elems_per_line(dt)
    row_lines = layout.ceil_div(hidden, epl)
    # From the algorithm's blocks, not `limit`: a virtual communicator that cannot fit them all
    # launches fewer clusters (more rows each), not narrower ones (the bits would be the same
    # either way: the tree's order does not depend on the cut).
    widest = min(abi.RMSNORM_MAX_ROW_BLOCKS, max(1, (widest_blocks or alg.max_blocks) // max(1, rows)))
    row_blocks = 1
    while 2 * row_blocks <= widest and layout.ceil_div(row_lines, row_blocks) > ROW_LINES_PER_BLOCK:
        row_blocks *= 2
    share = layout.ceil_div(row_lines, row_blocks)
    max_slots = alg.max_slots(max_ranks_template(world_size))
    slots = 1
    while 2 * slots <= max_slots and share > slots * abi.RMSNORM_MAX_THREADS:
        slots *= 2
    threads = min(abi.RMSNORM_MAX_THREADS, layout.ceil_div(layout.ceil_div(share, slots), layout.WARP) * layout.WARP)
    passes = layout.ceil_div(row_lines, row_blocks * threads * slots)
    clusters = max(1, min(rows, limit // row_blocks))
    return RowGeometry(clusters * row_blocks, threads, slots, passes, row_lines, epl, row_blocks)


@dataclass(frozen=True)
class RowExchange:
    """Who takes part in a row cluster's exchange of chunk sums (``row_exchange``)."""

    receivers: int  # blocks 0 .. receivers - 1 of the cluster hold a line of a row and receive every chunk
    warps: tuple[int, ...]  # per block of the cluster: warps 0 .. warps[j] - 1 hold a line and take part


def row_exchange(g: RowGeometry) -> RowExchange:
    """The kernel's ``takes_part`` and ``receivers`` (csrc/kernels/allreduce_rmsnorm.cu, "Row
    exchange"): warp w of block j holds a line of a row iff its first one, line
    ``j * slots * threads + 32 * w`` (pass 0, slot 0), is in the row; then it stores that chunk in
    every row. The cut can leave warps, and whole blocks, without a line (threads round up to whole
    warps, so the last block gets what remains); those leave the kernel at entry and receive
    nothing, so every warp that waits on a block's row phase stores into every receiving block in
    every row (tests/cpu/test_rmsnorm_geometry.py)."""
    block_lines = g.slots * g.threads
    warps = g.threads // layout.WARP
    per_block = tuple(min(warps, max(0, layout.ceil_div(g.row_lines - j * block_lines, layout.WARP)))
                      for j in range(g.row_blocks))
    return RowExchange(min(g.row_blocks, layout.ceil_div(g.row_lines, block_lines)), per_block)


def block_row_geometry(alg: Algorithm, dt: DType, rows: int, hidden: int, world_size: int,
                       max_blocks: int | None = None) -> RowGeometry:
    """The cut of kernels/allreduce_rmsnorm_block.cu: one block per row (``row_blocks`` 1; block b
    takes rows b, b + blocks, ...). Of the algorithm's slot counts for the world size (lines per
    thread per pass, each instantiation with its own most threads:
    algorithms.rmsnorm_block_threads), the one that takes the row in the fewest passes, the fewest
    slots among those; then as few threads (whole warps) as a pass needs. As many blocks as rows,
    up to ``max_blocks`` (default the algorithm's), at least one; with pipelined passes
    (algorithms.RMSNORM_BLOCK_PIPELINED) and more than one pass, up to half of them (the second
    half's channels carry every other pass)."""
    limit = alg.max_blocks if max_blocks is None else max_blocks
    epl = alg.elems_per_line(dt)
    row_lines = layout.ceil_div(hidden, epl)
    rmax = max_ranks_template(world_size)
    choices = sorted(s for r, s in alg.slot_choices if r == rmax)
    pipelined = alg.name in algorithms.RMSNORM_BLOCK_PIPELINED

    def most_threads(s: int) -> int:
        return rmsnorm_block_threads(rmax, s, pipelined)

    def passes_of(s: int) -> int:
        return layout.ceil_div(row_lines, s * most_threads(s))

    slots = min(choices, key=lambda s: (passes_of(s), s))
    passes = passes_of(slots)
    per_pass = layout.ceil_div(row_lines, passes * slots)  # lines per slot and pass: the threads
    threads = min(most_threads(slots), layout.ceil_div(per_pass, layout.WARP) * layout.WARP)
    passes = layout.ceil_div(row_lines, threads * slots)
    if passes > 1 and pipelined:
        limit //= 2
    return RowGeometry(max(1, min(rows, limit)), threads, slots, passes, row_lines, epl, 1)


def geometry(algo: str, dtype: torch.dtype, rows: int, hidden: int, world_size: int) -> RowGeometry:
    """``row_geometry`` by public algorithm name (``oneshot_ll``, ``twoshot_sentinel`` ...), with the
    algorithm's block limit (a VirtualCommunicator may launch fewer blocks when they do not fit at
    once, never a narrower row cluster); ``unfused``: its epilogue's ``unfused_geometry``."""
    if algo == UNFUSED:
        return unfused_geometry(DTYPES[dtype], rows, hidden)
    return row_geometry(RMSNORM_ALGORITHMS[internal_name(algo)], DTYPES[dtype], rows, hidden, world_size)


UNFUSED_MAX_GRID = 1 << 16  # blocks of the epilogue; more rows loop (block b: rows b, b + grid, ...)


def unfused_geometry(dt: DType, rows: int, hidden: int, slots: int | None = None) -> RowGeometry:
    """The cut of kernels/add_rmsnorm.cu per launch rank: one block per row (up to UNFUSED_MAX_GRID
    blocks; more rows loop), 16-byte lines in chunks of 32, abi.add_rmsnorm_slots chunks per warp
    and pass (chunk ``(pass * slots + slot) * warps + warp``, as ``row_geometry``'s cut of one
    block), as many warps as that takes up to abi.ADD_RMSNORM_MAX_THREADS threads (more lines: more
    passes). A row of up to abi.ADD_RMSNORM_PASS_ELEMS elements (8192) is one pass, in every dtype.
    ``slots``: another build's chunks per warp and pass (rmsnorm_epilogue.variant; the same bits)."""
    slots = slots or abi.add_rmsnorm_slots(dt.size)
    epl = layout.LINE_BYTES // dt.size
    row_lines = layout.ceil_div(hidden, epl)
    chunks = layout.ceil_div(row_lines, layout.WARP)
    threads = min(abi.ADD_RMSNORM_MAX_THREADS, layout.ceil_div(chunks, slots) * layout.WARP)
    passes = layout.ceil_div(row_lines, threads * slots)
    return RowGeometry(max(1, min(rows, UNFUSED_MAX_GRID)), threads, slots, passes, row_lines, epl, 1)


def auto_choice(rows: int, nbytes: int, fused: str, rules: rmsnorm_rules.Rules | None = None) -> str:
    """``algo="auto"``'s public name for a call of ``rows`` rows and ``nbytes`` bytes, ``fused``
    being the one-shot the AllReduce table names for its size, under a table's ``rules`` (None:
    rmsnorm_rules.DEFAULT)."""
    rows = max(1, rows)
    return rmsnorm_rules.choose(rules, rows, nbytes // rows, fused)


def row_owner(row: int, world_size: int) -> int:
    """The rank that reduces row ``row`` in the two-shot (``row % world_size``, the kernel's
    rule): strided, so consecutive rows go to different ranks and, with fewer rows than ranks,
    ranks ``rows..world_size-1`` own none. Which rank owns a row changes no bit of any output
    (every rank adds its own residual to the owner's fp32 sum, which is the one-shot's sum)."""
    return row % world_size


def rows_owned(rows: int, world_size: int, rank: int) -> range:
    """The rows ``rank`` reduces in a two-shot call of ``rows`` rows."""
    return range(rank, rows, world_size)


def internal_name(algo: str) -> str:
    """The registry's name of a public algorithm name (``unfused`` is its own)."""
    if algo in ALGOS:
        return ALGOS[algo]
    if algo in RMSNORM_ALGORITHMS or algo == UNFUSED:
        return algo
    raise UnsupportedError(f"{OPNAME}: unknown algorithm {algo!r}; known: {', '.join(PUBLIC_ALGOS)} or 'auto'")


def public_name(name: str) -> str:
    """The public name of an internal one (``internal_name``'s inverse)."""
    return next((public for public, internal in ALGOS.items() if internal == name), name)


def eps_bits(eps: object) -> int:
    """The float32 bits of ``eps`` (a real number >= 0, finite as a float32)."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise UnsupportedError(f"{OPNAME}: eps must be a real number, got {eps!r}")
    value = float(eps)
    if not math.isfinite(value) or value < 0:
        raise UnsupportedError(f"{OPNAME}: eps must be finite and >= 0, got {eps!r}")
    try:
        raw = struct.pack("<f", value)
    except OverflowError:
        raise UnsupportedError(f"{OPNAME}: eps {eps!r} does not fit a float32") from None
    return struct.unpack("<I", raw)[0]


def signature_text(name: str, dt: DType, rows: int, hidden: int, bits: int, fp8: bool = False) -> str:
    # "|fp8" only with the FP8 copy: a plain call's text (and LL signature) is what it was before.
    return f"{name}|{dt.short}|rows={rows}|hidden={hidden}|eps={bits:#010x}" + ("|fp8" if fp8 else "")


def signature(name: str, dt: DType, rows: int, hidden: int, bits: int, fp8: bool = False) -> int:
    """Odd 32-bit hash of the call, carried in every LL flag (a peer's differing call is reported;
    the FP8 copy is part of the call, so every rank asks for it or none does)."""
    return zlib.crc32(signature_text(name, dt, rows, hidden, bits, fp8).encode()) | 1


def eps_float32(eps: float) -> float:
    """``eps`` as the kernel sees it (rounded to float32)."""
    return struct.unpack("<f", struct.pack("<I", eps_bits(eps)))[0]


def row_rstd(total: torch.Tensor, hidden: int, eps: float) -> torch.Tensor:
    """The kernel's ``1 / sqrt(total / hidden + eps)`` (div.rn, add.rn, sqrt.rn, div.rn): each
    step done in float64 and rounded to float32 at once, which is the correctly rounded float32
    result (53 >= 2 * 24 + 2 bits, so rounding twice is harmless for + - * / and sqrt). torch's
    float32 sqrt on the CPU is not correctly rounded on every machine (an AVX2 build is off by one
    bit in about one row of four), so it is not used here."""
    def f32(t: torch.Tensor) -> torch.Tensor:
        return t.to(torch.float32).double()

    mean = f32(total.double() / float(hidden))
    root = f32(torch.sqrt(f32(mean + eps_float32(eps))))
    return (1.0 / root).to(torch.float32)


def rank_order_sum(xs: list[torch.Tensor]) -> torch.Tensor:
    """``s``: the AllReduce's output as every sollat AllReduce algorithm computes it, the rank-order
    fp32 sum rounded once to the dtype (on the CPU)."""
    acc = xs[0].detach().cpu().to(torch.float32)
    for x in xs[1:]:
        acc = acc + x.detach().cpu().to(torch.float32)
    return acc.to(xs[0].dtype)


def residual_add(s: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """``r = round(float(s) + float(residual))`` (s already rounded to the dtype), on the CPU."""
    return (s.detach().cpu().to(torch.float32) + residual.detach().cpu().to(torch.float32)).to(s.dtype)


def next_pow2(n: int) -> int:
    """The least power of two >= ``n`` (1 for n <= 1)."""
    return 1 << max(0, n - 1).bit_length()


def sum_of_squares(v: torch.Tensor, width: int | None = None) -> torch.Tensor:
    """``ss`` of every row of ``v`` (float32, ``[rows, hidden]``): the pairwise tree over the squares,
    zero-padded to ``width`` (a power of two >= hidden; default the least one). Any such ``width``
    gives the same bits (tests/cpu/test_batch_invariant.py): every square is >= +0 (or +Inf, NaN),
    and ``x + 0 == x`` bitwise for those, so the kernels' subtrees (a pack, a warp's 32 packs, the
    chunks' tree) are this tree. Each step is one IEEE float32 operation, as in the kernels."""
    rows, hidden = v.shape
    width = next_pow2(hidden) if width is None else width
    if width < hidden or width & (width - 1):
        raise ValueError(f"sum_of_squares: width must be a power of two >= {hidden}, got {width}")
    tree = torch.zeros(rows, width, dtype=torch.float32)
    tree[:, :hidden] = v * v
    while tree.shape[1] > 1:
        tree = tree[:, 0::2] + tree[:, 1::2]
    return tree[:, 0]


def _check_reference_inputs(xs: list[torch.Tensor], residual: torch.Tensor, weight: torch.Tensor) -> None:
    ok = ", ".join(str(d).replace("torch.", "") for d in DTYPES_SUPPORTED)
    if isinstance(xs, torch.Tensor) or not isinstance(xs, (list, tuple)) or not xs:
        raise UnsupportedError(f"rmsnorm.reference: xs must be a non-empty list of tensors (one per rank), "
                               f"got {type(xs).__name__}")
    for what, t in [*((f"xs[{r}]", x) for r, x in enumerate(xs)), ("residual", residual), ("weight", weight)]:
        if not isinstance(t, torch.Tensor):
            raise UnsupportedError(f"rmsnorm.reference: {what} must be a tensor, got {type(t).__name__}")
        if t.dtype not in DTYPES_SUPPORTED:
            raise UnsupportedError(f"rmsnorm.reference: {what} is {t.dtype}; supported dtypes: {ok}")
    if any(t.dtype != xs[0].dtype for t in (*xs, residual)):
        got = sorted({str(t.dtype) for t in (*xs, residual)})
        raise UnsupportedError(f"rmsnorm.reference: xs and residual must share one dtype, got {', '.join(got)}")


def reference(xs: list[torch.Tensor], residual: torch.Tensor, weight: torch.Tensor,
              eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The arithmetic of every ``all_reduce_rmsnorm`` algorithm, step by step on the CPU:
    ``(y, residual_out)`` with the bits every rank computes (NaN payloads aside) from every rank's
    ``xs`` (rank order), whatever the algorithm, the batch and the launch. Every step is one IEEE
    float32 operation per element, as in the kernels (add.rn, mul.rn, div.rn and sqrt.rn, none
    contracted into an FMA). ``xs`` (one tensor per rank, at least one) and ``residual`` must have
    one of all_reduce_rmsnorm's dtypes (float32, bfloat16, float16), the same for all; ``weight`` a
    floating dtype of those; anything else raises UnsupportedError."""
    _check_reference_inputs(xs, residual, weight)
    dtype, shape = xs[0].dtype, xs[0].shape
    hidden = int(shape[-1])
    f32 = torch.float32
    r = residual_add(rank_order_sum(xs).reshape(-1, hidden), residual.reshape(-1, hidden))
    v = r.to(f32)
    rstd = row_rstd(sum_of_squares(v), hidden, eps)
    y = ((v * rstd[:, None]) * weight.detach().cpu().to(f32).reshape(1, hidden)).to(dtype)
    return y.reshape(shape), r.reshape(shape)


def algo_reference(algo: str, xs: list[torch.Tensor], residual: torch.Tensor, weight: torch.Tensor,
                   eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``reference`` for a call of public algorithm ``algo`` (checked: a known name): the same
    function for every algorithm, kept for callers that name the algorithm they ran."""
    internal_name(algo)
    return reference(xs, residual, weight, eps)


def fp8_reference(y: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The kernel's FP8 copy of ``y`` (the output as stored, in its dtype) for the float32 scale
    ``scale`` (one element): ``float(y) / scale`` correctly rounded to float32 (the kernel's div.rn:
    float64 then one rounding, exact as in ``row_rstd``; torch's own division is not used so that
    no CPU vector path can differ), clamped to +-abi.FP8_E4M3_MAX, converted by torch to
    float8_e4m3fn (round to nearest even; tests/cpu/test_rmsnorm.py checks that conversion against
    rational arithmetic), then every NaN as the byte abi.FP8_E4M3_NAN (torch keeps a NaN's sign:
    0xFF for a negative one; the kernel always writes 0x7F). Returns a float8_e4m3fn tensor of y's
    shape, on the CPU."""
    s = scale.detach().cpu().reshape(()).to(torch.float32)
    v = (y.detach().cpu().to(torch.float32).double() / s.double()).to(torch.float32)
    q = v.clamp(-abi.FP8_E4M3_MAX, abi.FP8_E4M3_MAX).to(FP8_DTYPE).view(torch.uint8)
    q = torch.where(torch.isnan(v), torch.tensor(abi.FP8_E4M3_NAN, dtype=torch.uint8), q)
    return q.view(FP8_DTYPE)
