"""Launching compiled kernels on the current torch stream, eagerly or under CUDA-graph capture.

The stream is looked up on every call (inside ``torch.cuda.graph`` the current stream is the
capture stream; a wrapper made before capture would launch eagerly, outside the graph).
Wrappers are cached by stream handle, so the lookup is a dict hit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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


def _stream_handle_fallback(index: int) -> int:
    return int(torch.cuda.current_stream(index).cuda_stream)


# stream_handle(index): handle (CUstream as an int) of torch's current stream on device ``index``.
# The raw-handle query skips building a torch.cuda.Stream object (about a microsecond a call), and
# is bound here directly: the eager hot path calls it once per call.
stream_handle: Callable[[int], int] = _raw_stream if _raw_stream is not None else _stream_handle_fallback


def current_stream(device: torch.device) -> Any:
    """cuda.core Stream for torch's current stream on ``device``."""
    handle = stream_handle(device.index)
    stream = _stream_cache.get(handle)
    if stream is None:
        from cuda.core import Stream

        stream = Stream.from_handle(handle)
        _stream_cache[handle] = stream
    return stream


def launch_config(grid: tuple[int, int], block: int, *, pdl: bool, cluster: tuple[int, int] | None = None) -> Any:
    """A cached LaunchConfig. ``pdl`` sets programmatic stream serialization (dependent launch).

    With ``cluster`` the grid counts clusters (cuda.core's convention) and each cluster holds
    ``cluster`` blocks, which the hardware schedules onto one GPC together.
    """
    key = (grid, block, pdl, cluster)
    cfg = _config_cache.get(key)
    if cfg is None:
        from cuda.core import LaunchConfig

        cfg = LaunchConfig(grid=grid, block=block, cluster=cluster, programmatic_stream_serialization=pdl)
        _config_cache[key] = cfg
    return cfg


_core_launch: Any = None  # cuda.core.launch, imported on first use (an import per call costs time)


def launch(kernel: Any, config: Any, args: tuple[Any, ...], *, device: torch.device) -> None:
    """Launch ``kernel`` with a LaunchConfig (``launch_config``) on torch's current stream."""
    global _core_launch
    if _core_launch is None:
        from cuda.core import launch as _core_launch
    _core_launch(current_stream(device), config, kernel, *args)


_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)


def is_capturing() -> bool:
    """Whether the current stream is being captured into a CUDA graph (cheap query)."""
    return bool(_capturing()) if _capturing is not None else torch.cuda.is_current_stream_capturing()


def stream_is_capturing(handle: int) -> bool:
    """Whether the stream with this handle is being captured (cudaStreamIsCapturing)."""
    from cuda.bindings import runtime

    err, status = runtime.cudaStreamIsCapturing(handle)
    if int(err) != 0:
        return False
    return status != runtime.cudaStreamCaptureStatus.cudaStreamCaptureStatusNone
