"""The protocol rules the model executes, each taken from :mod:`sollat.device.layout` where it lives there.

Every function names the device code that implements the same rule. Slot mapping, line
addresses and launch geometry are *imported* from ``sollat/device/layout.py`` (the single source of
truth); only the model's own bundling is written here.

Bundles
-------
The real kernels run 32..512 threads per block; the model cannot interleave that many processes.
``plan()`` only ever chooses thread counts that are multiples of a warp, and the line a thread
handles is ``((it * blocks + b) * slots + i) * threads + t`` (consecutive threads, consecutive
lines). So if a call's size is a multiple of ``g = MAX_THREADS // model_threads`` real lines
(``g`` a multiple of ``WARP``), every group of ``g`` consecutive real threads is active in exactly
the same iterations, has the same epochs, and talks only to the same group on the peers. The model
runs one representative thread per group (a *bundle*). Its line-channel index is the real
``layout.slot_index`` of the group's first thread.
"""

from __future__ import annotations

import zlib
from typing import Any

from sollat.device import layout
from sollat.device.layout import Geometry

from .config import EPOCH_FIELD_BITS, Config, Mutation

#: A reader's tag that matches every tag (``Mutation.LL_TAG_IGNORED``); protocols.py checks it.
ANY_TAG = -1

# Device files the rules below are implemented in (linked from docstrings and the docs).
DEVICE_LL = "sollat/device/csrc/include/sollat/protocol_ll.h"
DEVICE_SENTINEL = "sollat/device/csrc/include/sollat/protocol_sentinel.h"
DEVICE_LLBUFFER = "sollat/device/csrc/include/sollat/ll_buffer.h"
DEVICE_LLBUFFER_FUNCS = "sollat/device/csrc/include/sollat/impl/ll_buffer__funcs.h"
DEVICE_LL128 = "sollat/device/csrc/include/sollat/ll128.h"
DEVICE_ONESHOT = "sollat/device/csrc/kernels/allreduce_oneshot.cu"
DEVICE_TWOSHOT = "sollat/device/csrc/kernels/allreduce_twoshot.cu"
DEVICE_LL128_KERNEL = "sollat/device/csrc/kernels/allreduce_ll128.cu"
DEVICE_RMSNORM = "sollat/device/csrc/kernels/allreduce_rmsnorm.cu"
DEVICE_WIDE = "sollat/device/csrc/kernels/allreduce_oneshot_wide.cu"
DEVICE_LAYOUT = "sollat/device/abi_layout.py"


def bundle(cfg: Config) -> int:
    """Real threads per model thread (``g``)."""
    if cfg.threads < 1 or layout.MAX_THREADS % cfg.threads:
        raise ValueError(f"model threads must divide {layout.MAX_THREADS}, got {cfg.threads}")
    g = layout.MAX_THREADS // cfg.threads
    if g % layout.WARP:
        raise ValueError(f"model threads must be <= {layout.MAX_THREADS // layout.WARP} (a bundle is >= one warp)")
    return g


def model_geometry(cfg: Config, model_lines: int) -> Geometry:
    """Geometry of a call of ``model_lines`` lines per rank, at bundle granularity.

    Calls ``layout.plan`` (host: ``comm.plan.Kernels.plan``) on the real line count and divides the
    thread count by the bundle size; every other field is the real one. Bundles wider than
    ``layout.BLOCK_THREADS`` (1 or 2 model threads per block) plan with blocks of at least one
    bundle, the geometry ``plan(block_threads=g)`` would give a real call.
    """
    g = bundle(cfg)
    real = layout.plan(model_lines * g, max_blocks=cfg.max_blocks, max_slots=cfg.max_slots,
                       block_threads=max(layout.BLOCK_THREADS, g))
    if real.threads % g:
        raise AssertionError(f"plan() chose {real.threads} threads, not a multiple of the bundle {g}")
    return Geometry(real.blocks, real.threads // g, real.slots, real.iterations)


message_line = layout.message_line


def channel(cfg: Config, block: int, slot: int, thread: int) -> int:
    """Line-channel index of a model thread: ``layout.slot_index`` of its bundle's first thread."""
    return layout.slot_index(block, slot, thread * bundle(cfg))


def parity(cfg: Config, epoch: int) -> int:
    """``epoch & 1`` selects the copy (double buffering); device: ``LLBuffer::line``."""
    return 0 if cfg.has(Mutation.SINGLE_BUFFER) else epoch & 1


def line_address(cfg: Config, par: int, src: int, slot: int) -> int:
    """Line of (parity, src, slot) in a receiver's region: ``layout.line_index``."""
    return layout.line_index(par, src, slot, nranks=cfg.nranks, lines_per_src=layout.lines_per_src(cfg.max_blocks))


acc_slot = layout.ll128_acc_slot


def acc_line_address(cfg: Config, par: int, slot: int, line: int) -> int:
    """16-byte line of lane 0 of 128-byte line ``line`` of the warp whose lane 0 has ``slot``.

    Device (``allreduce_ll128.cu``): ``(parity * nranks + 0) * lines_per_src + acc_slot``, i.e.
    ``layout.line_index(parity, 0, acc_slot)``; lanes of a warp are consecutive 16-byte lines.
    """
    return layout.line_index(par, 0, slot + line * cfg.ll128_lanes, nranks=cfg.nranks,
                             lines_per_src=layout.lines_per_src(cfg.max_blocks))


def epoch_mask(cfg: Config) -> int:
    """``kEpochMask`` of ``protocol_ll.h``: SOLLAT_EPOCH_BITS bits of the 16-bit epoch field."""
    return (1 << min(cfg.epoch_bits, EPOCH_FIELD_BITS)) - 1


def ll_tags(sig: int) -> tuple[int, int]:
    """The two 16-bit tags of an LL line (``ll_flag0``/``ll_flag1``): tag_0 = sig & 0xFFFF (odd,
    because the signature is), tag_1 = (sig >> 16) | 1; neither is ever 0, the rest value."""
    return sig & 0xFFFF, (sig >> 16) | 1


def ll_flag(cfg: Config, sig: int, epoch: int) -> Any:
    """What an LL sender writes. Two-flag line (``protocol_ll.h``): ((tag_0, e), (tag_1, e)), one
    flag per 8-byte word, ``flag_h = tag_h << 16 | (epoch & mask)``. ``SINGLE_FLAG_LINE``: one
    64-bit flag ``sig << 32 | epoch`` for the whole line: (sig, e)."""
    e = 0 if cfg.has(Mutation.REUSED_FLAG) else epoch & epoch_mask(cfg)
    if cfg.has(Mutation.SINGLE_FLAG_LINE):
        return (sig, e)
    t0, t1 = ll_tags(sig)
    return ((t0, e), (t1, e))


def ll_want(cfg: Config, sig: int, epoch: int) -> Any:
    """What an LL reader waits for: the flag its own call writes (``ProtoLL::check``: both words
    carry it). ``LL_TAG_IGNORED``: only the epoch is compared (``protocols.ANY_TAG``)."""
    flag = ll_flag(cfg, sig, epoch)
    if not cfg.has(Mutation.LL_TAG_IGNORED):
        return flag
    if cfg.has(Mutation.SINGLE_FLAG_LINE):
        return (ANY_TAG, flag[1])
    return tuple((ANY_TAG, e) for _, e in flag)


def ll_rest(cfg: Config) -> Any:
    """An LL line at rest (``comm.state.DeviceMemory.init_scratch`` fills LL regions with 0)."""
    return (0, (0, 0)) if cfg.has(Mutation.SINGLE_FLAG_LINE) else (0, ((0, 0), (0, 0)))


def sig_word(sig: int) -> tuple[int, None]:
    """A sentinel buffer's signature word as a flag: the 32-bit signature and no epoch field
    (``protocol_sentinel.h``, ``SentinelSignature``; ``ll_buffer.h``, "Signature words"). The
    sender stores it, the reader accepts it when equal to its own, reports a call mismatch when it
    is neither that nor 0 (empty, ``scratch.SENTINEL_SIG_REST``: ``protocols.ll_check_flag``) and
    polls on at 0; once accepted, the reader stores 0 back."""
    return sig, None


def ll128_sig_word(cfg: Config, sig: int, epoch: int) -> tuple[int, int]:
    """LL128's reduce-scatter signature word as (high 32 bits, low 32 bits): ``sig << 32 | epoch``
    (``ll128.h``, ``ll128::SignatureWord``), the epoch masked to ``Config.sig_epoch_bits`` (the
    device: all 32). The reader accepts it when equal, reports a call mismatch when the low half is
    its epoch and the high half neither 0 nor its signature (``protocols.ll_check_flag``), and polls
    on otherwise; nobody clears it."""
    return sig, epoch & ((1 << cfg.sig_epoch_bits) - 1)


#: The 4-byte word, counted from the start of a receiver's (parity, source) part, of thread
#: ``thread`` of block ``block``: the layout's one formula (``abi_layout.py``, rendered into
#: ``layout.h``): the first quarter of the block's ``layout.SIGNATURE_SLOT`` lines, four words a line.
signature_word = layout.signature_word

#: Signature words per 16-byte line: a sentinel buffer's words are 4 bytes, LL128's 8.
SIG_WORDS_PER_LINE = {"sentinel": 4, "ll128": 2}


def signature_address(cfg: Config, par: int, src: int, word: int, kind: str) -> int:
    """Word index, in a receiver's region of a buffer, of in-part word ``word`` of the (parity, src)
    part, in words of the ``kind``'s width (``SIG_WORDS_PER_LINE``): a sentinel buffer's words sit
    in their sender's part; LL128's reduce-scatter words (``ll128_signature_slot``) in the
    accumulator buffer's source-1 part, which holds no accumulator line."""
    lps = layout.lines_per_src(cfg.max_blocks)
    return SIG_WORDS_PER_LINE[kind] * layout.line_index(par, src, 0, nranks=cfg.nranks, lines_per_src=lps) + word


def ll128_signature_slot(cfg: Config, block: int, warp: int, src: int) -> int:
    """In-part 8-byte word of LL128's reduce-scatter signature word from ``src`` for warp ``warp``
    of ``block``: ``ll128_signature_word(block, warp * WARP + src)``, one word per (owner, source,
    warp)."""
    return layout.ll128_signature_word(block, warp * layout.WARP + src)


def peer_scope(cfg: Config) -> str:
    """``memory.h`` ``peer_scope()``: the scope of the threads that write this GPU's scratch."""
    return "sys" if cfg.ranks == "real" else "gpu"


def fence_scope(cfg: Config) -> str:
    """The scope of every protocol fence: the peer scope (``GPU_FENCE``: ``.gpu`` literals)."""
    return "gpu" if cfg.has(Mutation.GPU_FENCE) else peer_scope(cfg)


def fence_orders_peers(cfg: Config, scope: str) -> bool:
    """Whether a fence of ``scope`` orders anything a peer observes. PTX (ISA 9.1 §8.5 Scope, §8.7
    Morally strong operations, §8.9.4 Memory synchronization): two fences synchronise only when each
    one's scope includes the other's thread, and a peer of a real rank runs on another GPU. The
    strong model treats every fence as global."""
    return not cfg.ptx or scope == "sys" or cfg.ranks == "virtual"


def signature(cfg: Config, call_lines: int) -> int:
    """Odd 32-bit hash of the call's arguments (host: ``sollat.collectives.algorithms.signature``)."""
    return zlib.crc32(f"model|{cfg.algorithm}|{cfg.protocol}|{call_lines}".encode()) | 1


def chunk_lines(cfg: Config, call_lines: int) -> int:
    """Two-shot: the message is cut in ``nranks`` chunks of ``ceil(n / nranks)`` lines; rank c owns chunk c.

    Host: ``Algorithm.lines_per_rank`` (``sollat/collectives/algorithms.py``); device: ``chunk_lines`` in
    ``allreduce_twoshot.cu`` (``units`` in ``allreduce_ll128.cu``). Lines of a chunk past the end of
    the message are sent as zero padding (``load_pack`` is bounded by ``n``), so every (sender,
    receiver) pair carries data in every iteration in which the channel does.
    """
    return layout.chunk_count(call_lines, cfg.nranks)


# ---- the wide one-shot (allreduce_oneshot_wide.cu; abi_layout.py's peer-group formulas) -----------
def wide_groups(cfg: Config) -> int:
    """``peer_groups``: ceil(R / window) groups of ``Config.peer_window`` ranks (device: 8)."""
    return layout.ceil_div(cfg.nranks, cfg.peer_window)


def peer_group_plan(lines: int, lb: int, groups: int, max_blocks: int) -> Geometry:
    """``layout.plan_peer_groups`` for ``lb`` lines per block and ``groups`` groups: a block is
    ``groups`` threads for each of its ``lb`` lines, blocks up to ``max_blocks``, then passes."""
    blocks = min(max_blocks, layout.ceil_div(max(lines, 1), lb))
    return Geometry(blocks, lb * groups, 1, layout.ceil_div(max(lines, 1), blocks * lb))


def wide_geometry(cfg: Config, lines: int) -> Geometry:
    """The cut of a call of ``lines`` lines: ``Config.threads`` lines per block whatever the
    message (``peer_group_lines`` depends on the world size alone). ``WIDE_FITTED_LINES``: as few
    lines per block as the message needs over as many blocks (``min(lb, ceil(lines / blocks))``)."""
    geo = peer_group_plan(lines, cfg.threads, wide_groups(cfg), cfg.max_blocks)
    if not cfg.has(Mutation.WIDE_FITTED_LINES):
        return geo
    lb = min(cfg.threads, layout.ceil_div(max(lines, 1), geo.blocks))
    return Geometry(geo.blocks, lb * wide_groups(cfg), 1, layout.ceil_div(max(lines, 1), geo.blocks * lb))


def wide_channel(block: int, group: int, line: int, lb: int) -> int:
    """``peer_group_slot``: the channel of thread (group, line) of ``block``, whose threadIdx.x is
    ``group * lb + line``: ``slot_index(block, 0, group * lb + line)``."""
    return layout.slot_index(block, 0, group * lb + line)


def out_lines(cfg: Config, lines: int) -> int:
    """Output lines the model checks per call of ``lines`` lines: one per line, and in the wide
    one-shot one per (line, group): the sum over a group's ranks, the part of the line's rank-order
    sum that the thread of that group receives (the block's reduction from shared memory is local
    arithmetic)."""
    return lines * wide_groups(cfg) if cfg.algorithm == "oneshot_wide" else lines
