"""User-written collectives: your own CUDA C++ kernel, written with sollat's device API
(``#include <sollat/collective.h>``: LLBuffer, CallArgs, refused(), the entry-point macro), compiled
by sollat's NVRTC build and launched on a communicator's scratch, with epochs, bounded spins and
fault reporting handled as for the built-in kernels (docs/custom-collectives.md).

>>> maxabs = sollat.custom.Collective("maxabs", Path("maxabs.cu"), proto="ll")
>>> vcomm = sollat.VirtualCommunicator(4, collectives=[maxabs])   # registered at construction
>>> ys = vcomm.run(maxabs, [x0, x1, x2, x3])

A collective gets its own scratch region and epoch arrays, laid out when the communicator is
constructed, so it is registered there (``collectives=[...]``, the same list on every rank: the
ranks agree on it, source hash included, like on the tuning table). ``compile`` builds a
collective's kernels without a GPU (what the CPU tests and CI run).

Tested: the examples compile for sm_90 on the CPU (CI), and their GPU tests run on virtual ranks
(tests/gpu/test_custom.py: R = 2, 4, 8, every dtype, both protocols, CUDA graphs, an absent rank, an
LL mismatch). The real-rank suite (one process per GPU) runs no user collective.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from ..device import abi, build, layout
from ..device.dtypes import DTYPES
from ..errors import UnsupportedError
from . import algorithms
from .algorithms import CustomAlgorithm

PROTOS = ("ll", "sentinel")
SOURCE_SUFFIXES = (".cu", ".cuh")  # a str of one line ending so is a path, not source text
OUTPUTS = ("same", "gather")  # out like the input, or world_size inputs stacked (rank r's at [r])
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
_SLOT_CHOICES = {1: (1,), 2: (1, 2), 4: (1, 2, 4)}
# A sentinel buffer's channels stay below the slot that holds its signature words (layout.SIGNATURE_SLOT;
# docs/custom-collectives.md, "Mismatch detection"): the largest slot count below it.
SENTINEL_MAX_SLOTS = max(c for c in _SLOT_CHOICES if c <= layout.SIGNATURE_SLOT)


class Collective:
    """One user-written collective.

    ``Collective(name, source, *, proto="ll", buffers=1, dtypes=(float32, bfloat16, float16, float64),
    output="same", two_shot=False, deterministic=True, max_slots=1, doc="")``

    * ``name``: a C identifier; the source must define the entry point ``<name>`` with
      ``SOLLAT_DEFINE_ENTRY_POINTS(<name>, SOLLAT_T, body)`` (both communicators: collective.h).
    * ``source``: the CUDA C++ text, or the file to read it from (read once, here): a
      ``pathlib.Path``, or a str of one line ending in ``.cu`` or ``.cuh`` (a path relative to the
      working directory; a missing file is an error naming it).
    * ``proto``: ``"ll"`` (8 payload bytes per 16-byte line, the call signature in every flag, so a
      differing call is detected on the device) or ``"sentinel"`` (16 payload bytes; the receiver
      resets). The kernel gets it as ``SOLLAT_PROTO`` and the payload per line as
      ``LLBuffer<SOLLAT_PROTO, ...>::kPayload``; the host fills the region with its rest byte.
    * ``buffers``: LLBuffer regions (and epoch arrays) the kernel uses (``SOLLAT_BUFFERS``; the
      source sets ``constexpr int kBuffers = SOLLAT_BUFFERS;``).
    * ``dtypes``: the element types it accepts (``SOLLAT_T``).
    * ``output``: ``"same"`` (the output has the input's shape) or ``"gather"`` (shape
      ``[world_size, *input.shape]``; the kernel's ``out`` holds ``world_size * n`` elements).
    * ``two_shot``: the launch geometry covers one chunk of ``ceil(n / world_size)`` elements per
      rank instead of the whole message (``layout.chunk_count``).
    * ``max_slots``: lines per thread per iteration the kernel handles (``SOLLAT_SLOTS``: 1, 2, 4;
      a sentinel collective at most 2).
    """

    def __init__(self, name: str, source: str | os.PathLike[str], *, proto: str = "ll", buffers: int = 1,
                 dtypes: Iterable[torch.dtype] | None = None, output: str = "same", two_shot: bool = False,
                 deterministic: bool = True, max_slots: int = 1, doc: str = "") -> None:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise UnsupportedError(f"Collective: name must be a C identifier of at most 64 characters, got {name!r}")
        if isinstance(source, str) and _names_a_file(source):
            source = Path(source.strip())
        if isinstance(source, os.PathLike):
            path = Path(source)
            try:
                source = path.read_text()
            except OSError as exc:
                raise UnsupportedError(f"Collective {name!r}: cannot read source file {path}: {exc}") from None
        if not isinstance(source, str) or not source.strip():
            raise UnsupportedError(f"Collective {name!r}: source must be CUDA C++ text (str), a pathlib.Path or a "
                                   f"path ending in {' or '.join(SOURCE_SUFFIXES)}, got {source!r}")
        if not re.search(r"SOLLAT_DEFINE_ENTRY_POINTS\s*\(\s*" + re.escape(name) + r"\s*,", source):
            raise UnsupportedError(f"Collective {name!r}: the source must define its entry points with "
                                   f"SOLLAT_DEFINE_ENTRY_POINTS({name}, SOLLAT_T, body) (docs/custom-collectives.md)")
        if proto not in PROTOS:
            raise UnsupportedError(f"Collective {name!r}: proto must be one of {', '.join(PROTOS)}, got {proto!r}")
        if isinstance(buffers, bool) or not isinstance(buffers, int) or not 1 <= buffers <= 4:
            raise UnsupportedError(f"Collective {name!r}: buffers must be an integer 1..4, got {buffers!r}")
        if output not in OUTPUTS:
            raise UnsupportedError(f"Collective {name!r}: output must be one of {', '.join(OUTPUTS)}, got {output!r}")
        if max_slots not in _SLOT_CHOICES or isinstance(max_slots, bool):
            raise UnsupportedError(f"Collective {name!r}: max_slots must be 1, 2 or 4, got {max_slots!r}")
        if proto == "sentinel" and max_slots > SENTINEL_MAX_SLOTS:
            raise UnsupportedError(f"Collective {name!r}: a sentinel collective handles at most {SENTINEL_MAX_SLOTS} "
                                   f"slots per thread (the last slot's lines hold its signature words), "
                                   f"got max_slots={max_slots}")
        if output == "gather" and two_shot:
            raise UnsupportedError(f"Collective {name!r}: output='gather' cuts the message per rank; two_shot must be False")
        dts = tuple(DTYPES) if dtypes is None else tuple(dtypes)
        bad = [d for d in dts if d not in DTYPES]
        if not dts or bad:
            ok = ", ".join(str(d).replace("torch.", "") for d in DTYPES)
            raise UnsupportedError(f"Collective {name!r}: dtypes must be a non-empty subset of {ok}, got {list(dts)}")
        self.name = name
        self.source = source
        self.proto = proto
        self.output = output
        self.source_sha256 = build.source_digest(source)
        self.algorithm = CustomAlgorithm(
            name=f"custom:{name}", kernel_file=f"<{name}>", kernel=name, proto=proto,
            max_blocks=layout.MAX_BLOCKS_VIRTUAL, deterministic=bool(deterministic), two_shot=bool(two_shot),
            dtypes=frozenset(dts), ops=frozenset({""}),
            slot_choices=tuple((r, max_slots) for r in abi.RANK_CAPS[:-1]) + ((abi.MAX_RANKS, 1),),
            doc=doc, source=source, n_buffers=buffers, gathers=output == "gather")

    @property
    def dtypes(self) -> frozenset[torch.dtype]:
        return self.algorithm.dtypes

    @property
    def buffers(self) -> int:
        return self.algorithm.buffers

    @property
    def payload_bytes(self) -> int:
        """User bytes per 16-byte line under this collective's protocol (LL 8, sentinel 16)."""
        return self.algorithm.payload_bytes

    def elements_per_line(self, dtype: torch.dtype) -> int:
        return self.algorithm.elems_per_line(DTYPES[dtype])

    def describe(self) -> str:
        """What every rank must have registered identically (the setup agreement compares it)."""
        a = self.algorithm
        dts = ",".join(sorted(DTYPES[d].short for d in a.dtypes))
        return (f"{self.name}:{a.proto}:buffers={a.buffers}:dtypes={dts}:output={self.output}:two_shot={a.two_shot}:"
                f"slots={a.max_slots(2)}:sha256={self.source_sha256[:16]}")

    def __repr__(self) -> str:
        return f"Collective({self.describe()})"


def _names_a_file(text: str) -> bool:
    """Whether ``source`` as a str is a file name: one line ending in .cu or .cuh. Kernel source
    never is one (it spans lines and ends in code), so a path given as a str is read like a
    pathlib.Path instead of being compiled as text."""
    stripped = text.strip()
    return "\n" not in stripped and stripped.endswith(SOURCE_SUFFIXES)


def checked_collectives(collectives: Sequence[Collective] | None, who: str) -> tuple[Collective, ...]:
    """``collectives=`` of a communicator: Collective objects with distinct names."""
    if collectives is None:
        return ()
    if isinstance(collectives, (Collective, str, bytes)):
        raise UnsupportedError(f"{who}: collectives must be a list of sollat.custom.Collective, got {collectives!r}")
    out = tuple(collectives)
    for c in out:
        if not isinstance(c, Collective):
            raise UnsupportedError(f"{who}: collectives must hold sollat.custom.Collective objects, got {c!r}")
    names = [c.name for c in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UnsupportedError(f"{who}: two collectives are named {', '.join(dup)}; names must be distinct")
    return out


def compile(coll: Collective, dtype: torch.dtype = torch.float32, *, world_size: int = 2, arch: str = build.DEFAULT_ARCH,
            real_ranks: bool = False, slots: int | None = None, test_hooks: bool = False) -> bytes:
    """Compile ``coll`` for one instantiation with exactly the defines a communicator would use, on
    any machine (no GPU needed): returns the cubin, raises RuntimeError with the NVRTC log when the
    source does not compile. ``real_ranks`` picks the defines of a ``Communicator`` (system-scope
    fences) over those of a ``VirtualCommunicator``."""
    alg = coll.algorithm
    alg.check(dtype, "", f"compile({coll.name!r})")
    rmax = algorithms.max_ranks_template(world_size)
    defines = algorithms.kernel_defines(alg, DTYPES[dtype], "", rmax, slots or alg.max_slots(rmax), test_hooks,
                                        real_ranks=real_ranks)
    return build.compile_cubin(coll.source, name=coll.name, arch=arch, defines=defines)


def instantiations(coll: Collective) -> list[tuple[torch.dtype, int, int, bool]]:
    """(dtype, max ranks, slots, real ranks) of every kernel a communicator may build for ``coll``."""
    alg = coll.algorithm
    return [(d, r, s, real) for d in sorted(alg.dtypes, key=str) for r, top in alg.slot_choices
            for s in _SLOT_CHOICES[top] for real in (False, True)]
