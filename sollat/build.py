"""Run-time compilation of sollat's CUDA C++ with NVRTC (through ``cuda.core``), cached on disk.

Every kernel source lives in ``csrc/kernels/*.cu`` and includes headers from ``csrc/include``.
Kernels are ``extern "C"`` with explicit names (see the ``SOLLAT_*_KERNEL`` macros), so a cached
cubin needs no symbol mapping. The cache key covers the source, every header, the options and the
NVRTC version, so editing a header recompiles what depends on it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

CSRC = Path(__file__).parent / "csrc"
INCLUDE_DIR = CSRC / "include"
KERNEL_DIR = CSRC / "kernels"
DEFAULT_ARCH = "sm_90"

_lock = threading.Lock()
_modules: dict[tuple[str, str, tuple[tuple[str, str], ...]], Any] = {}


def cache_dir() -> Path:
    """Directory of compiled cubins: ``$SOLLAT_CACHE_DIR`` or ``~/.cache/sollat/cubin``."""
    root = os.environ.get("SOLLAT_CACHE_DIR")
    path = Path(root) if root else Path.home() / ".cache" / "sollat" / "cubin"
    path.mkdir(parents=True, exist_ok=True)
    return path


@functools.lru_cache(maxsize=1)
def _headers_digest() -> str:
    h = hashlib.sha256()
    for f in sorted(INCLUDE_DIR.rglob("*")):
        if f.is_file():
            h.update(str(f.relative_to(INCLUDE_DIR)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def _nvrtc_version() -> str:
    try:
        from cuda.bindings import nvrtc

        err, major, minor = nvrtc.nvrtcVersion()
        return f"{major}.{minor}"
    except Exception:  # pragma: no cover - only when cuda.bindings is broken
        return "unknown"


def device_arch(device_index: int | None = None) -> str:
    """``sm_XY`` of the current (or given) CUDA device, or sm_90 when no GPU is visible."""
    import torch

    if not torch.cuda.is_available():
        return DEFAULT_ARCH
    idx = torch.cuda.current_device() if device_index is None else device_index
    major, minor = torch.cuda.get_device_capability(idx)
    return f"sm_{major}{minor}"


def _options(arch: str, defines: Mapping[str, str]) -> Any:
    from cuda.core import ProgramOptions

    return ProgramOptions(
        arch=arch,
        std="c++17",
        include_path=[str(INCLUDE_DIR)],
        define_macro=[(k, v) for k, v in sorted(defines.items())] or None,
        # Exact IEEE adds/converts: reductions are compared bitwise with a reference.
        ftz=False,
        prec_div=True,
        prec_sqrt=True,
        fma=False,
    )


def compile_cubin(source: str, *, name: str, arch: str = DEFAULT_ARCH,
                  defines: Mapping[str, str] | None = None) -> bytes:
    """Compile ``source`` to a cubin for ``arch``, from the disk cache when possible."""
    defines = dict(defines or {})
    key = hashlib.sha256(
        "\0".join([source, _headers_digest(), arch, repr(sorted(defines.items())), _nvrtc_version(), name]).encode()
    ).hexdigest()[:32]
    path = cache_dir() / f"{name}-{arch}-{key}.cubin"
    if path.exists():
        return path.read_bytes()
    from cuda.core import Program

    prog = Program(source, code_type="c++", options=_options(arch, defines))
    try:
        obj = prog.compile("cubin")
    except Exception as exc:  # NVRTC puts the compile log in the message
        raise RuntimeError(f"sollat: NVRTC failed to compile {name} for {arch}:\n{exc}") from exc
    data = bytes(obj.code)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    tmp.replace(path)  # atomic: concurrent processes never read half a file
    return data


def kernel_source(filename: str) -> str:
    return (KERNEL_DIR / filename).read_text()


def load_module(filename: str, *, arch: str | None = None, defines: Mapping[str, str] | None = None) -> Any:
    """Compile (or fetch) ``csrc/kernels/<filename>`` and load it as a ``cuda.core`` ObjectCode."""
    from cuda.core import ObjectCode

    arch = arch or device_arch()
    dkey = tuple(sorted((defines or {}).items()))
    key = (filename, arch, dkey)
    with _lock:
        mod = _modules.get(key)
        if mod is None:
            cubin = compile_cubin(kernel_source(filename), name=Path(filename).stem, arch=arch, defines=defines)
            mod = ObjectCode.from_cubin(cubin, name=filename)
            _modules[key] = mod
    return mod


def get_kernel(filename: str, kernel_name: str, *, defines: Mapping[str, str] | None = None) -> Any:
    """Kernel ``kernel_name`` from ``csrc/kernels/<filename>`` on the current device's arch."""
    return load_module(filename, defines=defines).get_kernel(kernel_name)


def kernel_files() -> Iterable[str]:
    return sorted(p.name for p in KERNEL_DIR.glob("*.cu"))
