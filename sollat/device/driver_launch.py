"""One driver call per launch: ``cuLaunchKernelEx`` through ctypes with prepacked arguments.

``cuda.core.launch`` converts every argument and builds a launch config on each call, which
costs several microseconds of host time per launch (docs/benchmarks.md, eager overhead). A
sollat call always launches the same kernel with the same configuration and the same trailing
arguments; only the tensor pointers and the stream change. :class:`BoundLaunch` therefore
packs the configuration and the trailing arguments once, and a launch writes the pointers into
the argument slots and makes one foreign call.

The pointers are either leading 8-byte parameters (the one-GPU epilogue) or one rank-table
parameter (every collective's entry point, abi.py POINTER_LISTS: a ``__grid_constant__`` struct of
8-byte words); either way they are the first words of the slots. The driver copies the argument
values when the launch is enqueued (or captured into a graph), so the slots may be rewritten by
the next call at once. Two threads must not launch the same bound kernel at the same time (like an
NCCL communicator, a sollat communicator is not thread-safe). It is sollat's only launch path:
``cuda.core.launch`` cannot pass a struct parameter, and its path measured 2-4 us more host
time per call (docs/benchmarks.md, eager overhead).
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import SollatError

# cuda.h: CUlaunchAttributeID values and the layout of CUlaunchAttribute / CUlaunchConfig.
_ATTR_CLUSTER_DIMENSION = 4
_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6
_CUDA_ERROR_INVALID_CONTEXT = 201


class _AttrValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("dims", ctypes.c_uint * 3), ("flag", ctypes.c_int)]


class _Attr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _AttrValue)]


class _Config(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_mem_bytes", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_Attr)), ("num_attrs", ctypes.c_uint)]


assert ctypes.sizeof(_Attr) == 72 and ctypes.sizeof(_Config) == 56  # as in cuda.h (x86-64 and aarch64)

_lib: Any = None  # ctypes.CDLL, or False once loading failed


def _libcuda() -> Any:
    global _lib
    if _lib is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            lib.cuLaunchKernelEx.restype = ctypes.c_int
            lib.cuGetErrorName.restype = ctypes.c_int
            _lib = lib
        except (OSError, AttributeError):
            _lib = False
    return _lib or None


def _dims3(v: Any) -> tuple[int, int, int]:
    t = (v,) if isinstance(v, int) else tuple(v)
    return (*t, 1, 1, 1)[:3]  # type: ignore[return-value]


def _param_layout(kernel: Any, n_ptrs: int, n_tail: int) -> tuple[bool, list[int]]:
    """(the pointers are one table parameter, the byte size of each tail parameter), from the
    kernel's own metadata: either n_ptrs leading 8-byte parameters or one of 8 * n_ptrs bytes."""
    sizes = []
    for p in kernel.arguments_info:
        size = getattr(p, "size", None)
        sizes.append(int(size if size is not None else p[1]))
    table = len(sizes) == 1 + n_tail and n_ptrs > 1 and sizes[0] == 8 * n_ptrs
    if not table and len(sizes) != n_ptrs + n_tail:
        raise SollatError(f"sollat: kernel takes {len(sizes)} parameters but the call packs {n_ptrs + n_tail}")
    tail = sizes[len(sizes) - n_tail:]
    bad = [s for s in (tail if table else sizes) if s not in (4, 8)]
    if bad:
        raise SollatError(f"sollat: the prepacked launcher handles 4- and 8-byte parameters only, got sizes {bad}")
    return table, tail


class BoundLaunch:
    """``kernel`` with its LaunchConfig and trailing arguments, bound for one driver call per launch.

    ``BoundLaunch(kernel, config, tail, n_ptrs)(stream_handle, ptrs)`` launches ``kernel(*ptrs,
    *tail)``; ``ptrs`` are the ``n_ptrs`` pointers (leading parameters, or the rank table).
    ``launch_fn`` replaces the driver entry point (tests inspect the packed structures with it).
    """

    def __init__(self, kernel: Any, config: Any, tail: Sequence[Any], n_ptrs: int, *,
                 launch_fn: Callable[..., int] | None = None) -> None:
        count = n_ptrs + len(tail)
        table, sizes = _param_layout(kernel, n_ptrs, len(tail))
        # One 8-byte slot per pointer and tail parameter; a 4-byte parameter reads the slot's low
        # half (little endian); a table parameter is its n_ptrs slots, read from the first.
        self._slots = (ctypes.c_uint64 * count)()
        for i, v in enumerate(tail):
            self._slots[n_ptrs + i] = int(v) & ((1 << (8 * sizes[i])) - 1)
        base = ctypes.addressof(self._slots)
        starts = [0] if table else list(range(n_ptrs))
        starts += range(n_ptrs, count)
        self._params = (ctypes.c_void_p * len(starts))(*[base + 8 * i for i in starts])
        self._pack_ptrs = struct.Struct(f"<{n_ptrs}Q").pack_into
        cluster = getattr(config, "cluster", None)
        grid, block = _dims3(config.grid), _dims3(config.block)
        attrs: list[tuple[int, tuple[int, ...] | int]] = []
        if cluster is not None:
            cdims = _dims3(cluster)
            grid = tuple(g * c for g, c in zip(grid, cdims, strict=True))  # cuda.core's grid counts clusters, the driver's blocks
            attrs.append((_ATTR_CLUSTER_DIMENSION, cdims))
        if getattr(config, "programmatic_stream_serialization", False):
            attrs.append((_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION, 1))
        self._attrs = (_Attr * max(1, len(attrs)))()
        for a, (aid, val) in zip(self._attrs[:len(attrs)], attrs, strict=True):
            a.id = aid
            if isinstance(val, tuple):
                a.value.dims[:] = val
            else:
                a.value.flag = val
        self._cfg = _Config()
        self._cfg.grid[:] = grid
        self._cfg.block[:] = block
        self._cfg.shared_mem_bytes = int(getattr(config, "shmem_size", 0) or 0)
        self._cfg.attrs = ctypes.cast(self._attrs, ctypes.POINTER(_Attr))
        self._cfg.num_attrs = len(attrs)
        self._stream = 0  # the stream in self._cfg (0: the legacy default stream, as ctypes.Structure starts)
        self._cfg_ref = ctypes.byref(self._cfg)
        self._func = ctypes.c_void_p(int(kernel.handle))
        if launch_fn is None:
            lib = _libcuda()
            if lib is None:
                raise SollatError("sollat: libcuda.so.1 (the CUDA driver) cannot be loaded; sollat launches through it")
            launch_fn = lib.cuLaunchKernelEx
        self._call = launch_fn

    def __call__(self, stream: int, ptrs: Sequence[int]) -> None:
        self._pack_ptrs(self._slots, 0, *ptrs)
        if stream != self._stream:  # a ctypes field store costs more than the comparison
            self._cfg.stream = stream
            self._stream = stream
        rc = self._call(self._cfg_ref, self._func, self._params, None)
        if rc:
            if rc == _CUDA_ERROR_INVALID_CONTEXT:  # a thread where no context is current yet
                _make_current()
                rc = self._call(self._cfg_ref, self._func, self._params, None)
            if rc:
                raise SollatError(f"sollat: cuLaunchKernelEx failed with {error_name(rc)} ({rc})")


def _make_current() -> None:
    import torch
    from cuda.core import Device

    Device(torch.cuda.current_device()).set_current()


def error_name(rc: int) -> str:
    lib = _libcuda()
    if lib is None:
        return "CUDA error"
    name = ctypes.c_char_p()
    if lib.cuGetErrorName(ctypes.c_int(rc), ctypes.byref(name)) != 0 or not name.value:
        return "CUDA error"
    return name.value.decode()
