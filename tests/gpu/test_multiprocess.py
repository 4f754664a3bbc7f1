"""Real ranks (one process per GPU, torchrun): every algorithm bitwise or within the summation
bound, LL128 over NVLink, NCCL fallback, the timeout path. Skips with fewer than 2 GPUs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.multigpu]


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs >= 2 GPUs")
def test_real_ranks() -> None:
    n = torch.cuda.device_count()
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1",
               PYTHONPATH=str(Path(__file__).parents[2]) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    worker = Path(__file__).with_name("mp_worker.py")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={n}", str(worker)],
                       env=env, capture_output=True, text=True, timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    for rank in range(n):
        assert f"RANK {rank} CORRECT" in out and f"RANK {rank} RECOVERED" in out, out[-6000:]
    assert out.count("TIMEOUT names peer") == n - 1, out[-6000:]
