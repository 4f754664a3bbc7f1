"""Scratch layout, line-channels, epochs and launch geometry: the single source of truth.

The CUDA headers (``csrc/include/sollat/layout.h``, ``ll_buffer.h``) and the protocol model
(``sollat.model``) follow exactly these rules; each function names the device code that implements
it. The constants are the host/device contract's (``sollat/device/abi.py``); the line-address formulas
are declared once in ``sollat/device/abi_layout.py``, which renders ``layout.h`` from them, and this
module exports the Python functions compiled from the same declarations.

Vocabulary
----------
line          16 bytes moved by one vector store. LL carries 8 B of payload + 8 B flag in a line,
              sentinel 16 B of payload.
line-channel  (block b, slot i, thread t): the path from one sender thread to the same thread
              index on one receiver. It owns one line per (receiver, parity, source) and has its
              own epoch counter on every rank. The counter advances only when the channel carries
              data, so every rank's counter for a channel is equal at the same call.
slot index    s = (b * MAX_SLOTS + i) * MAX_THREADS + t   (consecutive threads: consecutive lines)
parity        epoch & 1: two copies of every line (double buffering, no barrier).
line address  in receiver d's region of a buffer:
              line = (parity * nranks + src) * lines_per_src + s
signature     sentinel buffers: one 4-byte word per (receiver, parity, source, block, thread), in the
words         lines of slot SIGNATURE_SLOT of the thread's block, four words a line (``signature_word``);
              0 at rest, written by the sender with line 0, reset to 0 by the receiver that read it
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import abi, abi_layout

_F = abi_layout.FUNCTIONS

# The contract's numbers (declared in abi.py; aliases for existing users).
LINE_BYTES = abi.LINE_BYTES
MAX_RANKS = abi.MAX_RANKS
MAX_THREADS = abi.MAX_THREADS
MAX_SLOTS = abi.MAX_SLOTS  # lines per thread per iteration (the kernel's kSlots is 1, 2 or 4)
WARP = abi.WARP
PARITIES = abi.PARITIES  # parity = epoch & 1
# Threads per block while a message can still spread over more blocks: more SMs then issue its
# stores and polls (measured against 512, 256, 64 and 32: docs/benchmarks.md, block size).
BLOCK_THREADS = 128

PAYLOAD_BYTES = abi.PAYLOAD_BYTES

# Blocks per rank a communicator sizes its scratch for (``max_blocks=``, ``$SOLLAT_MAX_BLOCKS``).
# Virtual ranks share one GPU's SMs among R ranks; a real rank has a whole GPU. A message larger
# than one pass (blocks x MAX_THREADS x MAX_SLOTS lines) is cut into passes inside the kernel, one
# round trip each. Every block of a rank must be resident at once, so the limit is an SM count.
# Real ranks: 128 blocks at 2 ranks measured best of 16/32/64/128 on 2x H200 (docs/benchmarks.md,
# blocks per rank: 1 MiB one-shot sentinel 17.8 -> 5.7 us); scratch grows with ranks x blocks, so the
# default keeps ranks x blocks at 256 (128 MiB of scratch per rank with every algorithm enabled).
MAX_BLOCKS_VIRTUAL = 16
MAX_BLOCKS_LIMIT = 128
REAL_RANK_BLOCKS_BUDGET = 256


def default_max_blocks_real(world_size: int) -> int:
    return max(16, min(MAX_BLOCKS_LIMIT, REAL_RANK_BLOCKS_BUDGET // world_size))


def virtual_block_cap(world_size: int, num_sms: int) -> int:
    """The most blocks per rank a VirtualCommunicator sizes any region for: every block of every
    rank must be resident at once, and sollat's kernels fit at most two 512-thread blocks per SM, so
    more could never launch (the occupancy check cuts further where fewer fit). 16 or more at
    R <= 8 on an H200 (132 SMs), 3 at R = 72: scratch then grows with R, not R x blocks."""
    return max(1, 2 * num_sms // world_size)

# Every rank's scratch starts with a control block; the algorithms' regions follow it, each at a
# multiple of CONTROL_BYTES (LL128 needs 512-byte aligned warp-units). The control block holds
# the rank's fault record (csrc/include/sollat/fault.h): FAULT_WORDS u32 words at
# FAULT_RECORD_OFFSET, which peers write when they detect a fault, zero while healthy.
CONTROL_BYTES = abi.CONTROL_BYTES
FAULT_RECORD_OFFSET = abi.FAULT_RECORD_OFFSET
FAULT_WORDS = abi.FAULT_WORDS
FAULT_OK, FAULT_TIMEOUT, FAULT_MISMATCH, FAULT_CLAIMED = (abi.FAULT_CODES[k] for k in ("ok", "timeout", "mismatch", "claimed"))


SIGNATURE_SLOT = abi_layout.SIGNATURE_SLOT  # the slot whose lines hold the signature words (sentinel)

# The layout formulas, each compiled from its one declaration in abi_layout.py (which renders the
# device side, layout.h, from the same declarations): no formula is written here.
slot_index: Callable[[int, int, int], int] = _F["slot_index"]
line_base: Callable[[int, int, int, int], int] = _F["line_base"]
line_index: Callable[..., int] = _F["line_index"]  # (parity, src, slot, *, nranks, lines_per_src)
ll128_acc_slot: Callable[[int, int], int] = _F["ll128_acc_slot"]
signature_word: Callable[[int, int], int] = _F["signature_word"]  # (block, thread) -> 4-byte word in a part
ll128_signature_word: Callable[[int, int], int] = _F["ll128_signature_word"]  # (block, thread) -> 8-byte word
lines_per_src: Callable[[int], int] = _F["lines_per_src"]
region_bytes_of_lines: Callable[[int, int], int] = _F["region_bytes_of_lines"]
region_bytes: Callable[[int, int], int] = _F["region_bytes"]  # (nranks, max_blocks)
peer_groups: Callable[[int], int] = _F["peer_groups"]
peer_group_lines: Callable[[int], int] = _F["peer_group_lines"]
peer_group_slot: Callable[[int, int, int, int], int] = _F["peer_group_slot"]  # (block, group, line, nranks)
DERIVED = ("slot_index", "line_base", "line_index", "ll128_acc_slot", "signature_word", "ll128_signature_word",
           "lines_per_src", "region_bytes_of_lines", "region_bytes", "peer_groups", "peer_group_lines",
           "peer_group_slot")


def message_line(geo: Geometry, it: int, block: int, slot: int, thread: int) -> int:
    """Line of the message (one-shot) or chunk (two-shot) handled by (iteration, block, slot, thread):
    consecutive threads take consecutive lines, then slots, then blocks, then iterations.
    Device: the iteration loops of ``allreduce_oneshot.cu`` and ``allreduce_twoshot.cu``."""
    return ((it * geo.blocks + block) * geo.slots + slot) * geo.threads + thread


def chunk_count(n: int, nranks: int) -> int:
    """Two-shot: elements per chunk before rounding to whole lines; rank c owns chunk c.
    Device: ``chunk_lines`` in ``allreduce_twoshot.cu``; host: ``Algorithm.lines_per_rank``."""
    return ceil_div(n, nranks)


@dataclass(frozen=True)
class Geometry:
    """How one call is cut up: identical on every rank (a pure function of the call)."""

    blocks: int  # blocks per rank
    threads: int  # threads per block (multiple of 32, <= MAX_THREADS)
    slots: int  # lines per thread per iteration (kernel template kSlots)
    iterations: int  # exchanges inside the kernel (chunks), each one epoch

    @property
    def lines_per_iteration(self) -> int:
        return self.blocks * self.threads * self.slots


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def plan(total_lines: int, *, max_blocks: int, max_slots: int = MAX_SLOTS, min_threads: int = WARP,
         block_threads: int = BLOCK_THREADS, max_threads: int = MAX_THREADS) -> Geometry:
    """Choose (blocks, threads, slots, iterations) for ``total_lines`` lines per rank.

    Up to ``block_threads`` lines get one block of just enough warps (fewest threads on the
    critical path). Larger messages spread over blocks of ``block_threads`` threads first (up to
    ``max_blocks``), then grow the blocks in steps of ``block_threads`` up to ``max_threads`` (the
    kernel's: abi.KERNELS, at most MAX_THREADS), then
    put more lines in flight per thread, then iterate. (Thread counts stay multiples of
    ``block_threads`` or of a warp-rounded line count: the protocol model relies on it.)
    """
    total_lines = max(total_lines, 1)
    if total_lines <= block_threads:
        threads = max(min_threads, ceil_div(total_lines, WARP) * WARP)
        return Geometry(1, threads, 1, 1)
    blocks = min(max_blocks, ceil_div(total_lines, block_threads))
    per_block_lines = ceil_div(total_lines, blocks)
    threads = min(max_threads, ceil_div(per_block_lines, block_threads) * block_threads)
    slots = 1
    while 2 * slots <= max_slots and per_block_lines > slots * threads:
        slots *= 2  # powers of two only, never above max_slots
    per_iter = blocks * threads * slots
    return Geometry(blocks, threads, slots, ceil_div(total_lines, per_iter))


def plan_peer_groups(total_lines: int, world_size: int, *, max_blocks: int) -> Geometry:
    """The wide one-shot's cut (``allreduce_oneshot_wide.cu``): a block is ``peer_groups(R)``
    threads for each of its ``peer_group_lines(R)`` lines, whatever the message size, so a slot
    index plays the same (group, line) role in every call and the writer's and the reader's epochs
    of a line agree (abi_layout.py, "peer groups"); blocks up to ``max_blocks``, then passes.
    (Lines per block fitted to the message would let the epochs drift apart: a receive would wait
    for a line no peer sends; the protocol model's wide-fitted-lines bug.)"""
    lb = peer_group_lines(world_size)
    blocks = min(max_blocks, ceil_div(max(total_lines, 1), lb))
    return Geometry(blocks, lb * peer_groups(world_size), 1, ceil_div(max(total_lines, 1), blocks * lb))
