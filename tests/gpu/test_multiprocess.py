"""Real ranks (processes, sollat.Communicator): the suite in mp_suite.py at 2, 3 and 4 ranks, then
its compile-skew section in a launch of its own with an empty kernel cache.

Where the host has a GPU per rank, each rank is one process per GPU over NCCL. With fewer GPUs
than ranks (one GPU: every launch here), the processes share GPU 0 over a gloo group
(``_procs``): the suite then proves processes, symmetric memory between them, faults seen by
other processes, stream and call ordering, and skips by name the sections that need NCCL between
distinct GPUs. A host with more GPUs also runs the suite on all of them. Every rank must write a
result file (``_procs.RankResult``) that holds its plan, a pass for every planned section and a
summary with none failed. Where ranks share a GPU the default run
launches 3 processes (the others, and every compile-skew launch, are marked slow: ``-m ''``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from . import _procs

pytestmark = [pytest.mark.gpu]

SUITE = Path(__file__).with_name("mp_suite.py")
MAIN_TIMEOUT_S = 1500
SKEW_TIMEOUT_S = 400
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
WORLDS = sorted({2, 3, 4} | ({GPUS} if GPUS > 4 else set()))

needs_a_gpu = pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU")


def launch(nproc: int, args: list[str], extra_env: dict[str, str], timeout_s: int, results: Path) -> tuple[int, str]:
    """torchrun the suite; each rank writes its verdict to ``results/rank<r>.json``."""
    env = _procs.child_env(nproc, GPUS, {**extra_env, _procs.RESULTS_ENV: str(results)})
    return _procs.launch(SUITE, nproc, args, env, timeout_s)


@needs_a_gpu
@pytest.mark.parametrize("nproc", [_procs.world_param(n, GPUS) for n in WORLDS])
def test_real_rank_suite(tmp_path: Path, nproc: int) -> None:
    results = tmp_path / "results"
    rc, out = launch(nproc, [], {}, MAIN_TIMEOUT_S, results)
    sections = _procs.assert_every_rank_passed(rc, out, nproc, results=results)
    if _procs.shares_gpu(nproc, GPUS):  # skipped by name, never silently
        first = _procs.read_results(results, nproc)[0]
        assert first is not None and "tear" not in sections
        assert any(why.startswith("tear: ") for why in first["skipped"]), first["skipped"]


@needs_a_gpu
@pytest.mark.slow  # each rank compiles its kernels with NVRTC into an empty cache: minutes
@pytest.mark.parametrize("nproc", WORLDS)
def test_real_rank_compile_skew(tmp_path: Path, nproc: int) -> None:
    cache = tmp_path / "empty-cache"
    cache.mkdir()
    results = tmp_path / "results"
    rc, out = launch(nproc, ["--only", "skew"], {"SOLLAT_CACHE_DIR": str(cache), "SOLLAT_MP_SECTIONS": "",
                                                 "SOLLAT_MP_SKIP": ""}, SKEW_TIMEOUT_S, results)
    assert _procs.assert_every_rank_passed(rc, out, nproc, results=results) == ["skew"]
