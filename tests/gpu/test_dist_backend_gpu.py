"""The ``sollat`` torch.distributed backend on real ranks (``dist_worker.py``): eager ``dist.*`` calls,
CUDA graphs, ``torch.compile`` (Inductor and reduce-overhead), a DTensor tensor-parallel MLP and
decoder block, a call that differs between ranks and an absent peer, all through
``init_process_group("cpu:gloo,cuda:sollat")``. On a host with fewer GPUs than ranks the processes
share GPU 0 and the backend's inner library is gloo (``_procs``); the default run launches 3
processes there, 2 is marked slow. Every rank must print PASS for every section of its PLAN."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from . import _procs
from .dist_worker import SECTIONS, ZERO_CHANGE_ENV, ZERO_CHANGE_SECTIONS

pytestmark = [pytest.mark.gpu]

WORKER = Path(__file__).with_name("dist_worker.py")
TIMEOUT_S = 540
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU")
@pytest.mark.parametrize("nproc", [_procs.world_param(n, GPUS) for n in (2, 3)])
def test_dist_backend_on_real_ranks(nproc: int) -> None:
    rc, out = _procs.launch(WORKER, nproc, [], _procs.child_env(nproc, GPUS), TIMEOUT_S)
    _procs.assert_every_rank_passed(rc, out, nproc, list(SECTIONS))


@pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU")
def test_zero_change_mode_on_real_ranks() -> None:
    """SOLLAT_DIST=1 and an unchanged init_process_group("nccl"): a sollat group that says nccl."""
    env = _procs.child_env(3, GPUS, {"SOLLAT_DIST": "1", ZERO_CHANGE_ENV: "1"})
    rc, out = _procs.launch(WORKER, 3, [], env, TIMEOUT_S)
    _procs.assert_every_rank_passed(rc, out, 3, list(ZERO_CHANGE_SECTIONS))


@pytest.mark.multigpu
@pytest.mark.skipif(GPUS < 2, reason="needs >= 2 GPUs (the decode app's default group is NCCL)")
def test_decode_app_dist_sollat_on_two_gpus(tmp_path: Path) -> None:
    """``python -m sollat.apps.decode --backends nccl,dist_sollat`` under torchrun: plain
    ``dist.all_reduce`` on a sollat group, teacher-forced against NCCL's tokens."""
    import json
    import subprocess
    import sys

    env = _procs.child_env(2, GPUS)
    report = tmp_path / "decode.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
           "sollat.apps.decode", "--layers", "2", "--context", "256", "--steps", "16", "--warmup", "4",
           "--check-steps", "4", "--backends", "nccl,dist_sollat", "--json", str(report)]
    proc = subprocess.run(cmd, cwd=_procs.ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-4000:]
    data = json.loads(report.read_text())
    assert data["ok"] and data["checks"]["dist_sollat"]["ok"], json.dumps(data["checks"])[:3000]
