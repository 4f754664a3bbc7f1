"""Run-time compilation of sollat's CUDA C++ with NVRTC (through ``cuda.core``), cached on disk.

Every production kernel source lives in ``csrc/kernels/*.cu``, the probe kernels (the bench's SoL
and barrier probes) in ``csrc/probes/*.cu``; both include
headers from ``csrc/include`` and are found by file name (:func:`kernel_source`).
Kernels are ``extern "C"`` with explicit names (see the ``SOLLAT_*_KERNEL`` macros), so a cached
cubin needs no symbol mapping.

The cache lives in ``cache_root()/cubin`` (``$SOLLAT_CACHE_DIR/cubin``, default
``~/.cache/sollat/cubin``). It is private: created with mode 0700, and a directory another user
owns or others can write is not trusted (a fresh private temporary directory is used instead, with
a warning). The key covers the source, every header, every NVRTC option as passed, the arch, the
defines and the NVRTC and cuda.core versions. Each file starts with the sha256 of the cubin it
holds; a file that fails that check (truncated, modified) is recompiled and replaced. Files are
written to a temporary file and renamed, so a reader never sees half of one.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import os
import shutil
import stat
import tempfile
import threading
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from . import environment

CSRC = Path(__file__).parent / "csrc"
INCLUDE_DIR = CSRC / "include"
KERNEL_DIR = CSRC / "kernels"
PROBE_DIR = CSRC / "probes"
DEFAULT_ARCH = "sm_90"
_KEY_VERSION = "sollat-cubin-key-2"
_MAGIC = b"SOLLAT-CUBIN-1 "  # file = magic, sha256 hex of the cubin, newline, cubin
_HEADER_LEN = len(_MAGIC) + 64 + 1

_lock = threading.Lock()
_dir_lock = threading.Lock()
_modules: dict[tuple[str, str, tuple[tuple[str, str], ...]], Any] = {}
_fallback_dirs: dict[Path, Path] = {}


def cache_root() -> Path:
    """Root of sollat's caches: ``$SOLLAT_CACHE_DIR``, else ``~/.cache/sollat``.
    Cubins live in ``<root>/cubin``, user tuning tables in ``<root>/tuning``. A root the user
    names is created only as one directory in an existing one (``sollat.device.environment``): a typo
    never creates a tree of directories."""
    root = environment.value("SOLLAT_CACHE_DIR")  # a directory, or one to create in an existing one
    return Path(root) if root is not None else Path.home() / ".cache" / "sollat"


def cache_dir() -> Path:
    """Private directory of compiled cubins, ``cache_root()/cubin`` (see the module docstring)."""
    given = environment.raw("SOLLAT_CACHE_DIR") is not None
    path = cache_root() / "cubin"
    try:
        path.parent.mkdir(mode=0o700, parents=not given, exist_ok=True)
        path.mkdir(mode=0o700, exist_ok=True)
        problem = untrusted_reason(path)
    except OSError as exc:
        problem = f"it cannot be created ({exc})"
    return path if problem is None else _fallback_dir(path, problem)


def _warn(message: str) -> None:
    """A RuntimeWarning about the cache, attributed to sollat rather than to a source line: it
    prints as one line, ``sollat:0: RuntimeWarning: <message>``, with no line of code under it."""
    warnings.warn_explicit(message, RuntimeWarning, filename="sollat", lineno=0, module="sollat")


def untrusted_reason(path: Path) -> str | None:
    """Why ``path`` is not a private directory of this user, or None when it is."""
    st = path.stat()
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"it is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"group or others can write to it (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _fallback_dir(path: Path, problem: str) -> Path:
    """A fresh private temporary cubin directory for this process, used instead of ``path``."""
    with _dir_lock:
        tmp = _fallback_dirs.get(path)
        if tmp is None:
            tmp = Path(tempfile.mkdtemp(prefix="sollat-cubin-"))  # mode 0700
            atexit.register(shutil.rmtree, tmp, ignore_errors=True)
            _fallback_dirs[path] = tmp
            _warn(f"not using the cubin cache {path}: {problem}. Compiling into the private temporary "
                  f"directory {tmp} instead (removed at exit); make {path} private to this user (chmod 700) "
                  "or set SOLLAT_CACHE_DIR")
    return tmp


def atomic_write(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory, fsync'd, then
    ``os.replace``: a concurrent or later reader sees the old file or the new one, never part of one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


@functools.lru_cache(maxsize=1)
def _headers_digest() -> str:
    h = hashlib.sha256()
    for f in sorted(INCLUDE_DIR.rglob("*")):
        if f.is_file():
            h.update(str(f.relative_to(INCLUDE_DIR)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


NVRTC_EXTRA = "pip install 'sollat[nvrtc]' (in a checkout: pip install -e '.[nvrtc]')"


class NvrtcMissingError(RuntimeError):
    """NVRTC (libnvrtc), which compiles sollat's kernels, cannot be loaded; the message is one line."""


def nvrtc_missing() -> str | None:
    """Why NVRTC cannot be loaded here, one line naming the ``nvrtc`` extra; None when it loads."""
    try:
        from cuda.bindings import nvrtc

        nvrtc.nvrtcVersion()
    except Exception as exc:  # cuda.pathfinder's DynamicLibNotFoundError when no libnvrtc is found
        return (f"sollat: NVRTC (libnvrtc), which compiles sollat's kernels, cannot be loaded "
                f"({type(exc).__name__}); install sollat's nvrtc extra: {NVRTC_EXTRA}")
    return None


@functools.lru_cache(maxsize=1)
def _nvrtc_version() -> str:
    try:
        from cuda.bindings import nvrtc

        err, major, minor = nvrtc.nvrtcVersion()
        return f"{major}.{minor}"
    except Exception:  # pragma: no cover - only when cuda.bindings is broken
        return "unknown"


@functools.lru_cache(maxsize=1)
def _cuda_core_version() -> str:
    try:
        import cuda.core

        return str(cuda.core.__version__)
    except Exception:  # pragma: no cover - only when cuda.core is broken
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


def options_text(options: Any) -> str:
    """The NVRTC command-line options ``options`` (a cuda.core ProgramOptions) stands for."""
    try:
        return "\n".join(o.decode() for o in options.as_bytes("nvrtc", "cubin"))
    except Exception:  # an older cuda.core: every field, by name
        fields = getattr(options, "__dataclass_fields__", None)
        return repr(sorted((f, repr(getattr(options, f))) for f in fields)) if fields else repr(options)


def cache_key(source: str, *, name: str, arch: str, options: Any, defines: Mapping[str, str]) -> str:
    """sha256 over everything that can change the cubin (see the module docstring)."""
    h = hashlib.sha256()
    parts = [_KEY_VERSION, name, arch, source, _headers_digest(), options_text(options),
             repr(sorted(defines.items())), _nvrtc_version(), _cuda_core_version()]
    for part in parts:
        b = part.encode()
        h.update(len(b).to_bytes(8, "little"))  # length-prefixed: no two part lists hash alike
        h.update(b)
    return h.hexdigest()


def _pack(cubin: bytes) -> bytes:
    return _MAGIC + hashlib.sha256(cubin).hexdigest().encode() + b"\n" + cubin


def _unpack(blob: bytes) -> bytes | None:
    """The cubin in a cache file, or None when the file fails its content check."""
    if len(blob) <= _HEADER_LEN or not blob.startswith(_MAGIC) or blob[_HEADER_LEN - 1:_HEADER_LEN] != b"\n":
        return None
    cubin = blob[_HEADER_LEN:]
    return cubin if hashlib.sha256(cubin).hexdigest().encode() == blob[len(_MAGIC):_HEADER_LEN - 1] else None


def _read_cached(path: Path) -> bytes | None:
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        _warn(f"cannot read cached cubin {path} ({exc}); recompiling")
        return None
    cubin = _unpack(blob)
    if cubin is None:
        _warn(f"cached cubin {path} failed its content check (truncated or modified); recompiling and "
              "replacing it")
    return cubin


def _write_cached(path: Path, cubin: bytes) -> None:
    try:
        atomic_write(path, _pack(cubin))
    except OSError as exc:  # a full or read-only disk costs a recompile next time, not this call
        _warn(f"cannot write cubin cache {path} ({exc})")


def compile_cubin(source: str, *, name: str, arch: str = DEFAULT_ARCH,
                  defines: Mapping[str, str] | None = None) -> bytes:
    """Compile ``source`` to a cubin for ``arch``, from the disk cache when possible."""
    defines = dict(defines or {})
    options = _options(arch, defines)
    key = cache_key(source, name=name, arch=arch, options=options, defines=defines)
    path = cache_dir() / f"{name}-{arch}-{key[:32]}.cubin"
    cubin = _read_cached(path)
    if cubin is not None:
        return cubin
    missing = nvrtc_missing()
    if missing is not None:
        raise NvrtcMissingError(missing)
    from cuda.core import Program

    prog = Program(source, code_type="c++", options=options)
    try:
        obj = prog.compile("cubin")
    except Exception as exc:  # NVRTC puts the compile log in the message
        raise RuntimeError(f"sollat: NVRTC failed to compile {name} for {arch}:\n{exc}") from exc
    cubin = bytes(obj.code)
    _write_cached(path, cubin)
    return cubin


def kernel_source(filename: str) -> str:
    """The source of ``filename``, a file of ``csrc/kernels`` or else of ``csrc/probes``."""
    path = KERNEL_DIR / filename
    if not path.exists() and (PROBE_DIR / filename).exists():
        path = PROBE_DIR / filename
    return path.read_text()


def load_module(filename: str, *, arch: str | None = None, defines: Mapping[str, str] | None = None) -> Any:
    """Compile (or fetch) ``filename`` (``kernel_source``) and load it as a ``cuda.core`` ObjectCode."""
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
    """Kernel ``kernel_name`` from ``filename`` (``kernel_source``) on the current device's arch."""
    return load_module(filename, defines=defines).get_kernel(kernel_name)


def source_digest(source: str) -> str:
    """sha256 of a kernel source (user-written collectives: part of their module and cubin keys)."""
    return hashlib.sha256(source.encode()).hexdigest()


def load_source(source: str, *, name: str, arch: str | None = None, defines: Mapping[str, str] | None = None) -> Any:
    """Compile (or fetch) CUDA C++ ``source`` (a user-written collective, sollat.custom) with
    sollat's options and include path, and load it as a ``cuda.core`` ObjectCode. The cubin cache
    key covers the source text (cache_key), so an edited source is always recompiled."""
    from cuda.core import ObjectCode

    arch = arch or device_arch()
    key = (f"source:{source_digest(source)}", arch, tuple(sorted((defines or {}).items())))
    with _lock:
        mod = _modules.get(key)
        if mod is None:
            cubin = compile_cubin(source, name=name, arch=arch, defines=defines)
            mod = ObjectCode.from_cubin(cubin, name=name)
            _modules[key] = mod
    return mod


def get_source_kernel(source: str, name: str, kernel_name: str, *, defines: Mapping[str, str] | None = None) -> Any:
    """Kernel ``kernel_name`` of ``source`` (``load_source``) on the current device's arch."""
    mod = load_source(source, name=name, defines=defines)
    try:
        return mod.get_kernel(kernel_name)
    except Exception as exc:
        raise RuntimeError(f"sollat: the source of {name!r} compiled but has no kernel {kernel_name!r}; its entry "
                           f"points must come from SOLLAT_DEFINE_ENTRY_POINTS({name}, SOLLAT_T, body) ({exc})") from exc


def kernel_files() -> Iterable[str]:
    """The production kernel files (``csrc/kernels``)."""
    return sorted(p.name for p in KERNEL_DIR.glob("*.cu"))


def probe_files() -> Iterable[str]:
    """The probe kernel files (``csrc/probes``): the bench's ``sol`` and ``barrier``."""
    return sorted(p.name for p in PROBE_DIR.glob("*.cu"))
