"""One driver call per launch: ``cuLaunchKernelEx`` through ctypes with prepacked arguments.

``cuda.core.launch`` converts every argument and builds a launch config on each call, which
costs several microseconds of host time per launch (docs/benchmarks.md, eager overhead). A
sollat call always launches the same kernel with the same configuration and the same trailing
arguments; only the tensor pointers and the stream change. :class:`BoundLaunch` therefore
packs the configuration and the trailing arguments once, and a launch writes the pointers into
the argument slots and makes one foreign call.

The driver copies the argument values when the launch is enqueued (or captured into a graph), so
the slots may be rewritten by the next call at once. Two threads must not launch the same bound
kernel at the same time (like an NCCL communicator, a sollat communicator is not thread-safe).
When ``libcuda`` cannot be loaded, or ``SOLLAT_LAUNCHER=cuda.core``, the launch goes through
``cuda.core.launch`` instead; the two paths launch the same kernel with the same arguments.
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Callable, Sequence
from typing import Any

from .errors import SollatError

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


def enabled() -> bool:
    """Whether launches go straight to the driver (``SOLLAT_LAUNCHER`` = ``driver``, the default)."""
    choice = os.environ.get("SOLLAT_LAUNCHER", "driver")
    if choice not in ("driver", "cuda.core"):
        raise SollatError(f"SOLLAT_LAUNCHER must be 'driver' or 'cuda.core', got {choice!r}")
    return choice == "driver" and _libcuda() is not None


def _dims3(v: Any) -> tuple[int, int, int]:
    t = (v,) if isinstance(v, int) else tuple(v)
    return (*t, 1, 1, 1)[:3]  # type: ignore[return-value]


def _param_sizes(kernel: Any, count: int) -> list[int]:
    """Byte size of each kernel parameter, from the kernel's own metadata."""
    sizes = []
    for p in kernel.arguments_info:
        size = getattr(p, "size", None)
        sizes.append(int(size if size is not None else p[1]))
    if len(sizes) != count:
        raise SollatError(f"sollat: kernel takes {len(sizes)} parameters but the call packs {count}")
    bad = [s for s in sizes if s not in (4, 8)]
    if bad:
        raise SollatError(f"sollat: the prepacked launcher handles 4- and 8-byte parameters only, got sizes {bad}")
    return sizes


class BoundLaunch:
    """``kernel`` with its LaunchConfig and trailing arguments, bound for one driver call per launch.

    ``BoundLaunch(kernel, config, tail, n_ptrs)(stream_handle, ptrs)`` launches ``kernel(*ptrs,
    *tail)``; ``ptrs`` are the ``n_ptrs`` leading pointer arguments. ``launch_fn`` replaces the
    driver entry point (tests inspect the packed structures with it).
    """

    def __init__(self, kernel: Any, config: Any, tail: Sequence[Any], n_ptrs: int, *,
                 launch_fn: Callable[..., int] | None = None) -> None:
        count = n_ptrs + len(tail)
        sizes = _param_sizes(kernel, count)
        # One 8-byte slot per parameter; a 4-byte parameter reads the slot's low half (little endian).
        self._slots = (ctypes.c_uint64 * count)()
        for i, v in enumerate(tail):
            self._slots[n_ptrs + i] = int(v) & ((1 << (8 * sizes[n_ptrs + i])) - 1)
        base = ctypes.addressof(self._slots)
        self._params = (ctypes.c_void_p * count)(*[base + 8 * i for i in range(count)])
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
        self._call = launch_fn if launch_fn is not None else _libcuda().cuLaunchKernelEx

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
