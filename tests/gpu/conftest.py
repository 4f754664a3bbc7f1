from __future__ import annotations

import os
import time

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def _kernels_compiled_in_parallel() -> None:
    """Compile every built-in kernel into the disk cache once, on all cores, before the first GPU
    test: a cold cache otherwise compiles them one at a time inside the tests (minutes)."""
    if not torch.cuda.is_available():
        return
    from sollat.collectives import instantiations

    t0 = time.monotonic()
    n = instantiations.precompile(jobs=max(1, min(32, os.cpu_count() or 1)))
    print(f"\nsollat: {n} kernel modules in the cache ({time.monotonic() - t0:.1f} s)")
