"""The protocol rules the model executes, each taken from :mod:`sollat.layout` where it lives there.

Every function names the device code that implements the same rule. Slot mapping, line
addresses and launch geometry are *imported* from ``sollat/layout.py`` (the single source of
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

from sollat import layout
from sollat.layout import Geometry

from .config import Config, Mutation

# Device files the rules below are implemented in (linked from docstrings and the docs).
DEVICE_LL = "sollat/csrc/include/sollat/protocol_ll.h"
DEVICE_SENTINEL = "sollat/csrc/include/sollat/protocol_sentinel.h"
DEVICE_LLBUFFER = "sollat/csrc/include/sollat/ll_buffer.h"
DEVICE_LLBUFFER_FUNCS = "sollat/csrc/include/sollat/impl/ll_buffer__funcs.h"
DEVICE_LL128 = "sollat/csrc/include/sollat/ll128.h"
DEVICE_ONESHOT = "sollat/csrc/kernels/allreduce_oneshot.cu"
DEVICE_TWOSHOT = "sollat/csrc/kernels/allreduce_twoshot.cu"
DEVICE_LL128_KERNEL = "sollat/csrc/kernels/allreduce_ll128.cu"


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

    Calls ``layout.plan`` (host: ``Communicator._plan``) on the real line count and divides the
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
    """``kEpochMask`` of ``protocol_ll.h`` (``SOLLAT_EPOCH_BITS``)."""
    return 0xFFFFFFFF if cfg.epoch_bits >= 32 else (1 << cfg.epoch_bits) - 1


def ll_flag(cfg: Config, sig: int, epoch: int) -> tuple[int, int]:
    """``ProtoLL::flag``: (signature, epoch & mask), i.e. the 64-bit ``sig << 32 | epoch``."""
    if cfg.has(Mutation.REUSED_FLAG):
        return (sig, 0)
    return (sig, epoch & epoch_mask(cfg))


def signature(cfg: Config, call_lines: int) -> int:
    """Odd 32-bit hash of the call's arguments (host: ``sollat.algorithms.signature``)."""
    return zlib.crc32(f"model|{cfg.algorithm}|{cfg.protocol}|{call_lines}".encode()) | 1


def chunk_lines(cfg: Config, call_lines: int) -> int:
    """Two-shot: the message is cut in ``nranks`` chunks of ``ceil(n / nranks)`` lines; rank c owns chunk c.

    Host: ``Algorithm.lines_per_rank`` (``sollat/algorithms.py``); device: ``chunk_lines`` in
    ``allreduce_twoshot.cu`` (``units`` in ``allreduce_ll128.cu``). Lines of a chunk past the end of
    the message are sent as zero padding (``load_pack`` is bounded by ``n``), so every (sender,
    receiver) pair carries data in every iteration in which the channel does.
    """
    return layout.chunk_count(call_lines, cfg.nranks)
