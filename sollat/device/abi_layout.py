"""The scratch layout's formulas, declared once: slot indices, line addresses, region sizes.

Each formula is one expression of ``sollat.device.formula``'s subset over abi.py's constants.
``sollat.device.layout`` exports the Python functions compiled from these declarations, and
``header_text()`` renders the device ones as ``csrc/include/sollat/layout.h`` (a CPU test checks
that the committed header equals the rendering). Regenerate it after editing this file::

    python -m sollat.device.abi_layout > sollat/device/csrc/include/sollat/layout.h
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import abi
from .formula import KEYWORD_ONLY, CEnv, Formula, Signature, c_type, parse, python_function, render_cxx
from .generated_header import GeneratedHeader, framed

HEADER_PATH = Path(__file__).parent / "csrc" / "include" / "sollat" / "layout.h"
REGENERATE = "python -m sollat.device.abi_layout > sollat/device/csrc/include/sollat/layout.h"

# The slot whose lines hold a sentinel buffer's signature words instead of data: the last one. A
# sentinel buffer's channels use the slots below it (kSlots <= SIGNATURE_SLOT: 1 or 2), and every
# thread's 4-byte word sits in the first quarter of this slot's lines of its block (four words a
# line). LL128's 8-byte reduce-scatter words use the first half of the same lines of its
# accumulator buffer's source-1 part (two words a line).
SIGNATURE_SLOT = abi.MAX_SLOTS - 1

# The constants a formula may name: Python name -> (C++ spelling, value). abi.h declares all but
# the last, layout.h that one (a test checks every spelling against the rendered headers).
CONSTANTS: dict[str, tuple[str, int]] = {
    "MAX_SLOTS": ("kMaxSlotsPerThread", abi.MAX_SLOTS),
    "MAX_THREADS": ("kMaxThreads", abi.MAX_THREADS),
    "PARITIES": ("kParities", abi.PARITIES),
    "LINE_BYTES": ("kLineBytes", abi.LINE_BYTES),
    "WARP": ("kWarpSize", abi.WARP),
    "PEER_WINDOW": ("kPeerWindow", abi.PEER_WINDOW),
    "SIGNATURE_SLOT": ("kSignatureSlot", SIGNATURE_SLOT),
}
LAYOUT_CONSTANTS = ("SIGNATURE_SLOT",)  # declared in layout.h, not abi.h

_INT3 = Signature((("block", "int"), ("slot", "int"), ("thread", "int")))

FORMULAS: tuple[Formula, ...] = (
    # ---- device and host (layout.h renders these, in this order) ----
    Formula("slot_index", ("block", "slot", "thread"), "(block * MAX_SLOTS + slot) * MAX_THREADS + thread",
            "line-channel `slot` (< kMaxSlotsPerThread) of (block, thread): consecutive threads get "
            "consecutive lines.", device=(_INT3,)),
    # Peer groups (kernels/allreduce_oneshot_wide.cu): thread (group g, line j) of a block handles
    # line j for the peers of group g (ranks g * PEER_WINDOW ..). Lines per block depend on the world
    # size only, never on the message: a slot index then plays one (group, line) role in every call,
    # and the epochs of the writer and the reader of a line agree (ll_buffer.h's channel rule,
    # generalised: channel (g, j) on rank r talks to channel (group of r, j) on every peer of g).
    Formula("peer_groups", ("nranks",), "(nranks + PEER_WINDOW - 1) // PEER_WINDOW",
            "peer groups of a wide group: PEER_WINDOW ranks each, the last one possibly smaller (threads per "
            "line of the wide one-shot).", device=(Signature((("nranks", "int"),)),)),
    Formula("peer_group_lines", ("nranks",), "MAX_THREADS // peer_groups(nranks) // WARP * WARP",
            "lines per block of the wide one-shot: as many whole warps of lines as MAX_THREADS threads hold "
            "with peer_groups(nranks) threads per line (a warp then serves one group); a function of the "
            "world size alone.", device=(Signature((("nranks", "int"),)),)),
    Formula("peer_group_slot", ("block", "group", "line", "nranks"),
            "slot_index(block, 0, group * peer_group_lines(nranks) + line)",
            "the wide one-shot's line-channel of thread (group, line) of block `block` (its threadIdx.x is "
            "group * peer_group_lines + line): on rank r it receives line `line` from the ranks of group "
            "`group`; a rank sends that line to peer q in q's channel (group of r, line).",
            device=(Signature((("block", "int"), ("group", "int"), ("line", "int"), ("nranks", "int"))),)),
    Formula("signature_word", ("block", "thread"), "4 * slot_index(block, SIGNATURE_SLOT, 0) + thread",
            "the 4-byte word, counted from the start of a receiver's (parity, source) part, that holds the "
            "signature word of thread `thread` of block `block` (sentinel buffers, ll_buffer.h): the first "
            "quarter of the block's SIGNATURE_SLOT lines, four threads' words a line, a warp's 32 words one "
            "128-byte line.",
            device=(Signature((("block", "int"), ("thread", "int"))),)),
    Formula("ll128_signature_word", ("block", "thread"), "2 * slot_index(block, SIGNATURE_SLOT, 0) + thread",
            "the 8-byte word, counted from the start of a (parity, source) part, that holds LL128's "
            "reduce-scatter signature word of (block, thread) (allreduce_ll128.cu: thread warp * WARP + "
            "source of its accumulator buffer's source-1 part): the first half of the block's "
            "SIGNATURE_SLOT lines, two words a line.",
            device=(Signature((("block", "int"), ("thread", "int"))),)),
    Formula("ll128_acc_slot", ("block", "thread"), "block * MAX_THREADS + thread",
            "LL128's accumulator slot (and epoch index) of (block, thread); its 16-byte line is "
            "line_index(parity, 0, acc_slot).", device=(Signature((("block", "int"), ("thread", "int"))),)),
    Formula("line_base", ("parity", "src", "nranks", "lines_per_src"), "widen(parity * nranks + src) * lines_per_src",
            "the first line of (parity, source) inside a receiver's region; + slot index = layout.line_index. "
            "Two precisions, each the arithmetic its callers always used (their generated code is unchanged): "
            "LLBuffer's (32-bit index, 64-bit product) and LL128's accumulator line (64-bit throughout).",
            device=(Signature((("parity", "int"), ("src", "int"), ("nranks", "int"), ("lines_per_src", "int")),
                              "long long"),
                    Signature((("parity", "u64"), ("src", "int"), ("nranks", "int"), ("lines_per_src", "u64")),
                              "u64"))),
    Formula("region_bytes_of_lines", ("nranks", "lines_per_src"), "widen(PARITIES) * nranks * lines_per_src * LINE_BYTES",
            "one buffer region on one rank, kParities x nranks sources x lines_per_src lines (layout.region_bytes "
            "of max_blocks).", device=(Signature((("nranks", "int"), ("lines_per_src", "int")), "u64"),),
            cxx_name="region_bytes"),
    # ---- host only ----
    Formula("line_index", ("parity", "src", "slot", KEYWORD_ONLY, "nranks", "lines_per_src"),
            "line_base(parity, src, nranks, lines_per_src) + slot",
            "Line of (parity, source, slot) inside a receiver's region; device: ``line_base`` + slot "
            "(``layout.h``)."),
    Formula("lines_per_src", ("max_blocks",), "max_blocks * MAX_SLOTS * MAX_THREADS",
            "Slot indices per (parity, source) part of a region: every slot of ``max_blocks`` blocks (a "
            "sentinel region keeps its signature words in the SIGNATURE_SLOT lines, ``signature_word``). "
            "Also the length of each buffer's epoch array (the kernels' ``lines_per_src`` argument)."),
    Formula("region_bytes", ("nranks", "max_blocks"), "region_bytes_of_lines(nranks, lines_per_src(max_blocks))",
            "Bytes of one LLBuffer region on one rank: PARITIES x nranks sources x lines. Device: "
            "``region_bytes(nranks, lines_per_src)`` (``layout.h``)."),
)
BY_NAME: dict[str, Formula] = {f.name: f for f in FORMULAS}
ENV = CEnv(CONSTANTS, {f.name: f for f in FORMULAS if f.device})
_KNOWN = (*CONSTANTS, *BY_NAME)


def _check() -> None:
    assert len(BY_NAME) == len(FORMULAS), "a formula declared twice"
    for f in FORMULAS:
        tree = parse(f, _KNOWN)
        for sig in f.device:
            assert tuple(n for n, _ in sig.params) == f.names, f"{f.name}: C++ parameters are the Python ones"
            assert c_type(tree, sig, ENV) == sig.returns, f"{f.name}: result type"
            render_cxx(tree, sig, ENV)  # a device formula calls only device formulas (KeyError otherwise)


_check()


def functions() -> dict[str, Callable[..., int]]:
    """Every formula as a Python function, by name (``sollat.device.layout`` exports these objects)."""
    namespace: dict[str, Any] = {k: v for k, (_, v) in CONSTANTS.items()}
    return {f.name: python_function(f, namespace, _KNOWN) for f in FORMULAS}


FUNCTIONS = functions()


def _comment(text: str, prefix: str = "") -> list[str]:
    return ["// " + line for line in textwrap.wrap(prefix + text, width=97)]


def _device_lines(f: Formula) -> list[str]:
    out = _comment(f.doc, f"layout.{f.name}: ")
    tree = parse(f, _KNOWN)
    for sig in f.device:
        params = ", ".join(f"{t} {n}" for n, t in sig.params)
        out += [f"__device__ __forceinline__ {sig.returns} {f.cxx}({params}) {{",
                f"  return {render_cxx(tree, sig, ENV)};", "}"]
    return out


def header_text() -> str:
    """``csrc/include/sollat/layout.h``: the device formulas as C++."""
    consts = [f"{CONSTANTS[k][0]} = {CONSTANTS[k][1]}" for k in LAYOUT_CONSTANTS]
    body: list[str] = [
        "// The slot whose lines hold a sentinel buffer's signature words (layout.SIGNATURE_SLOT).",
        f"enum SignatureLayout : int {{ {', '.join(consts)} }};",
    ]
    for f in FORMULAS:
        if f.device:
            body += ["", *_device_lines(f)]
    banner = [
        f"// GENERATED by sollat/device/abi_layout.py - do not edit. Regenerate: {REGENERATE}",
        "// sollat/layout.h - where a line lives in the scratch: the device side of sollat/device/layout.py.",
        "//",
        "// Every kernel computes slot indices, line addresses and region sizes with these helpers (the",
        "// host sizes the same regions with layout.region_bytes and abi.py's constants; both are",
        "// derived from the formulas declared once in sollat/device/abi_layout.py).",
    ]
    return framed(banner, "SOLLAT_LAYOUT_H_",
                  ['#include "sollat/types.h"', "", "namespace sollat {", "", *body, "", "}  // namespace sollat"])


HEADER = GeneratedHeader(HEADER_PATH, header_text)

if __name__ == "__main__":
    HEADER.print()
