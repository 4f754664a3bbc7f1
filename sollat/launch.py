"""Launching compiled kernels on the current torch stream, eagerly or under CUDA-graph capture.

The stream is looked up on every call (inside ``torch.cuda.graph`` the current stream is the
capture stream; a wrapper made before capture would launch eagerly, outside the graph).
Wrappers are cached by stream handle, so the lookup is a dict hit.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy as np
import torch

_stream_cache: dict[int, Any] = {}
_config_cache: dict[tuple[Any, ...], Any] = {}
_devices_set: set[int] = set()


def ensure_device(index: int) -> None:
    """Make ``index`` the current device for cuda.core (once per process and device)."""
    if index in _devices_set:
        return
    from cuda.core import Device

    torch.cuda.init()
    Device(index).set_current()
    _devices_set.add(index)


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def current_stream(device: torch.device) -> Any:
    """cuda.core Stream for torch's current stream on ``device``."""
    # The raw-handle query skips building a torch.cuda.Stream object (about a microsecond a call).
    handle = _raw_stream(device.index) if _raw_stream is not None else torch.cuda.current_stream(device).cuda_stream
    stream = _stream_cache.get(handle)
    if stream is None:
        from cuda.core import Stream

        stream = Stream.from_handle(handle)
        _stream_cache[handle] = stream
    return stream


def launch_config(grid: tuple[int, int], block: int, *, pdl: bool) -> Any:
    """A cached LaunchConfig. ``pdl`` sets programmatic stream serialization (dependent launch)."""
    key = (grid, block, pdl)
    cfg = _config_cache.get(key)
    if cfg is None:
        from cuda.core import LaunchConfig

        cfg = LaunchConfig(grid=grid, block=block, programmatic_stream_serialization=pdl)
        _config_cache[key] = cfg
    return cfg


def launch(kernel: Any, grid: tuple[int, int], block: int, args: tuple[Any, ...], *,
           device: torch.device, pdl: bool = True) -> None:
    from cuda.core import launch as _launch

    _launch(current_stream(device), launch_config(grid, block, pdl=pdl), kernel, *args)


def is_capturing() -> bool:
    """Whether the current stream is being captured into a CUDA graph (cheap query)."""
    fn = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)
    return bool(fn()) if fn is not None else torch.cuda.is_current_stream_capturing()


_CTYPE = {np.uint64: ctypes.c_uint64, np.int32: ctypes.c_int32, np.uint32: ctypes.c_uint32}
_cu_streams: dict[int, Any] = {}


class PreparedLaunch:
    """One kernel with a fixed grid and fixed trailing arguments, launched through
    ``cuLaunchKernelEx`` with a parameter block built once: a call only writes the tensor
    pointers and the stream (the eager hot path; about a third of cuda.core's per-call cost when
    measured on the H200 machine, see docs/benchmarks.md). ``SOLLAT_LAUNCHER=cuda.core`` selects
    cuda.core's ``launch`` instead, which is also the fallback if this cannot be set up."""

    def __init__(self, kernel: Any, grid: tuple[int, int], block: int, n_ptrs: int, tail: tuple[Any, ...],
                 *, pdl: bool) -> None:
        from cuda.bindings import driver

        self._driver = driver
        self._func = kernel.handle
        vals: list[Any] = [ctypes.c_uint64(0) for _ in range(n_ptrs)]
        for v in tail:
            ct = ctypes.c_uint64 if isinstance(v, int) else _CTYPE[type(v)]
            vals.append(ct(int(v)))
        self._ptrs = vals[:n_ptrs]
        self._vals = vals  # keeps every parameter alive as long as the array points at it
        self._params = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
        self._params_addr = ctypes.addressof(self._params)
        cfg = driver.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid[0], grid[1], 1
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block, 1, 1
        cfg.sharedMemBytes = 0
        if pdl:
            attr = driver.CUlaunchAttribute()
            attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            cfg.attrs = [attr]
            cfg.numAttrs = 1
        else:
            cfg.numAttrs = 0
        self._cfg = cfg

    def __call__(self, ptrs: tuple[int, ...], device: torch.device) -> None:
        for slot, p in zip(self._ptrs, ptrs, strict=True):
            slot.value = p
        handle = _raw_stream(device.index) if _raw_stream is not None else torch.cuda.current_stream(device).cuda_stream
        stream = _cu_streams.get(handle)
        if stream is None:
            stream = _cu_streams[handle] = self._driver.CUstream(handle)
        self._cfg.hStream = stream
        (err,) = self._driver.cuLaunchKernelEx(self._cfg, self._func, self._params_addr, 0)
        if err != self._driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"sollat: cuLaunchKernelEx failed: {err!r}")


class CudaCoreLaunch:
    """The same interface over cuda.core's ``launch`` (simple, a few microseconds slower)."""

    def __init__(self, kernel: Any, grid: tuple[int, int], block: int, n_ptrs: int, tail: tuple[Any, ...],
                 *, pdl: bool) -> None:
        self._kernel, self._grid, self._block, self._tail, self._pdl = kernel, grid, block, tail, pdl

    def __call__(self, ptrs: tuple[int, ...], device: torch.device) -> None:
        launch(self._kernel, self._grid, self._block, ptrs + self._tail, device=device, pdl=self._pdl)


def prepare(kernel: Any, grid: tuple[int, int], block: int, n_ptrs: int, tail: tuple[Any, ...], *,
            pdl: bool = True) -> PreparedLaunch | CudaCoreLaunch:
    if os.environ.get("SOLLAT_LAUNCHER", "raw") != "cuda.core":
        try:
            return PreparedLaunch(kernel, grid, block, n_ptrs, tail, pdl=pdl)
        except Exception:  # an unexpected cuda.bindings/cuda.core version: use the portable path
            pass
    return CudaCoreLaunch(kernel, grid, block, n_ptrs, tail, pdl=pdl)
