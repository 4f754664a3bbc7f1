"""Every kernel instantiation sollat can launch, for ahead-of-time compiles and the CPU compile test."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor

from . import algorithms, build
from .dtypes import DTYPES


def all_instantiations() -> Iterator[tuple[str, dict[str, str]]]:
    """(kernel file, defines) for every (algorithm, dtype, op, max ranks, slots) combination."""
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for alg in algorithms.ALGORITHMS.values():
        for dtype in alg.dtypes:
            dt = DTYPES[dtype]
            for op in sorted(alg.ops):
                for rmax, slots in alg.slot_choices:
                    for real in (True, False):
                        d = algorithms.kernel_defines(alg, dt, op, rmax, slots, test_hooks=False, real_ranks=real)
                        key = (alg.kernel_file, tuple(sorted(d.items())))
                        if key not in seen:
                            seen.add(key)
                            yield alg.kernel_file, d


def _compile_one(args: tuple[str, dict[str, str], str]) -> str:
    filename, defines, arch = args
    build.compile_cubin(build.kernel_source(filename), name=filename.removesuffix(".cu"), arch=arch, defines=defines)
    return filename


def precompile(arch: str | None = None, jobs: int = 8) -> int:
    """Compile every instantiation into the disk cache, ``jobs`` at a time. Returns the count."""
    arch = arch or build.device_arch()
    work = [(f, d, arch) for f, d in all_instantiations()]
    if jobs <= 1:
        for w in work:
            _compile_one(w)
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(_compile_one, work))
    return len(work)
