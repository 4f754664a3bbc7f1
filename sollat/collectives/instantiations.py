"""Every kernel instantiation sollat can launch, for ahead-of-time compiles and the CPU compile test."""

from __future__ import annotations

import itertools
import multiprocessing
import re
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import AbstractContextManager
from typing import Any

from ..device import build, resources
from ..device.dtypes import DTYPES
from . import algorithms, rmsnorm, rmsnorm_epilogue

DEFAULT_ARCH = build.DEFAULT_ARCH
MIN_ARCH = 90  # the kernels use griddepcontrol (PDL), which needs sm_90


class PrecompileError(RuntimeError):
    """A precompile that cannot run or a kernel that does not compile; the message is one line."""


def nvrtc_archs() -> list[int]:
    """The sm_XY numbers this NVRTC compiles for ([] when NVRTC cannot be asked)."""
    try:
        from cuda.bindings import nvrtc

        err, archs = nvrtc.nvrtcGetSupportedArchs()
        return [int(a) for a in archs] if int(err) == 0 else []
    except Exception:
        return []


def check_arch(arch: str) -> str:
    """``arch`` if sollat can be compiled for it (``sm_90``, ``sm_90a``, ``sm_100`` ...), else ValueError."""
    m = re.fullmatch(r"sm_(\d{2,3})([af]?)", arch)
    if m is None:
        raise ValueError(f"an arch looks like sm_90, got {arch!r}")
    number = int(m.group(1))
    if number < MIN_ARCH:
        raise ValueError(f"sollat's kernels need sm_{MIN_ARCH} or newer, got {arch!r}")
    known = nvrtc_archs()
    if known and number not in known:
        raise ValueError(f"this NVRTC does not compile for {arch!r}; it knows sm_{', sm_'.join(map(str, known))}")
    return arch


def all_instantiations() -> Iterator[tuple[str, dict[str, str]]]:
    """(kernel file, defines) for every (algorithm, dtype, op, max ranks, slots) combination, the fused
    RMSNorm kernels (plain and with the FP8 copy), their unfused epilogue and the built-in AllGather /
    ReduceScatter included."""
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for alg in (*algorithms.ALGORITHMS.values(), *algorithms.RMSNORM_ALGORITHMS.values(),
                *algorithms.GATHER_SCATTER_ALGORITHMS.values()):
        variants = (False, True) if alg.name in algorithms.RMSNORM_ALGORITHMS else (False,)
        for dtype in alg.dtypes:
            dt = DTYPES[dtype]
            for op in sorted(alg.ops):
                for (rmax, slots), real, fp8 in itertools.product(alg.slot_choices, (True, False), variants):
                    d = algorithms.kernel_defines(alg, dt, op, rmax, slots, test_hooks=False, real_ranks=real, fp8=fp8)
                    key = (alg.kernel_file, tuple(sorted(d.items())))
                    if key not in seen:
                        seen.add(key)
                        yield alg.kernel_file, d
    for dtype, table_ranks in itertools.product(rmsnorm.DTYPES_SUPPORTED, rmsnorm_epilogue.TABLE_RANKS):
        yield rmsnorm_epilogue.KERNEL_FILE, rmsnorm_epilogue.defines(DTYPES[dtype], table_ranks)  # the unfused epilogue


def _compile_one(args: tuple[str, dict[str, str], str]) -> str:
    filename, defines, arch = args
    build.compile_cubin(build.kernel_source(filename), name=filename.removesuffix(".cu"), arch=arch, defines=defines)
    return filename


def _first_error(log: str) -> str:
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower() and "NVRTC_ERROR" not in ln]
    return (errors or lines or ["no compile log"])[0]


#: ``progress(total, description)`` of precompile: a context manager with ``advance(note=...)``.
ProgressBar = Callable[[int, str], AbstractContextManager[Any]]


class _NoProgress:
    """precompile's progress when none is asked for."""

    def __init__(self, total: int, description: str) -> None:
        pass

    def __enter__(self) -> _NoProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def advance(self, note: str = "") -> None:
        pass


def precompile(arch: str | None = None, jobs: int = 8, *, progress: ProgressBar | None = None,
               files: Collection[str] | None = None,
               only: Callable[[str, dict[str, str]], bool] | None = None) -> int:
    """Compile every instantiation into the disk cache, ``jobs`` at a time. Returns the count.
    ``files``: only the instantiations of these kernel files (``allreduce_oneshot_wide.cu`` ...);
    ``only(file, defines)``: only those it accepts (a job that needs a few, e.g. virtual ranks).

    ``progress(total, description)``: a context manager whose ``advance(note=...)`` is called once
    per module (the CLI passes ``sollat.bench.progress.Progress``); None: no progress shown. Raises ValueError for an arch sollat cannot
    use and PrecompileError when NVRTC is missing or compiling fails."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    arch = check_arch(arch or build.device_arch())
    try:
        import cuda.core  # noqa: F401
    except ImportError as exc:
        raise PrecompileError(f"cuda.core is missing ({exc}); it is a dependency of sollat: "
                              "pip install 'cuda-core>=1.2'") from exc
    missing = build.nvrtc_missing()
    if missing is not None:
        raise PrecompileError(missing.removeprefix("sollat: "))
    work = _work(arch, files, only)
    try:
        with (progress or _NoProgress)(len(work), f"precompile {arch}") as bar:
            for done in _each(_compile_one, work, jobs):
                bar.advance(note=done)
    except RuntimeError as exc:
        raise PrecompileError(f"NVRTC failed for {arch}: {_first_error(str(exc))}") from exc
    return len(work)


def _work(arch: str, files: Collection[str] | None,
          only: Callable[[str, dict[str, str]], bool] | None) -> list[tuple[str, dict[str, str], str]]:
    return [(f, d, arch) for f, d in all_instantiations()
            if (files is None or f in files) and (only is None or only(f, d))]


def _each(fn: Callable[[Any], Any], work: list[Any], jobs: int) -> Iterator[Any]:
    """fn(w) for every w of ``work``, ``jobs`` processes at a time, in the order they finish. The
    first exception is raised, and no further item is started."""
    if jobs == 1:
        yield from map(fn, work)
        return
    # spawn, not fork: the caller may already hold a CUDA context (a forked child must not use it)
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            for done in as_completed([pool.submit(fn, w) for w in work]):
                yield done.result()
        except BaseException:  # the first failure is the answer: start no further compile
            pool.shutdown(wait=True, cancel_futures=True)
            raise


#: (kernel file, defines, ptxas's figures for each function of that module)
Report = tuple[str, dict[str, str], list[resources.FunctionResources]]


def _resources_one(args: tuple[str, dict[str, str], str]) -> Report:
    filename, defines, arch = args
    return filename, defines, resources.compile_resources(build.kernel_source(filename), arch=arch, defines=defines)


def resource_report(arch: str, jobs: int = 8, *, files: Collection[str] | None = None,
                    only: Callable[[str, dict[str, str]], bool] | None = None) -> list[Report]:
    """ptxas's registers, stack frame and spills (resources.compile_resources) of every instantiation
    (``files``, ``only``: as precompile), compiled for ``arch`` outside the cache, ``jobs`` at a time.
    Raises as precompile does."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    arch = check_arch(arch)
    try:
        return list(_each(_resources_one, _work(arch, files, only), jobs))
    except RuntimeError as exc:
        raise PrecompileError(f"NVRTC failed for {arch}: {_first_error(str(exc))}") from exc
