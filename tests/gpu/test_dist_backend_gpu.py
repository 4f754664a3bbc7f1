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
from .dist_worker import SECTIONS

pytestmark = [pytest.mark.gpu]

WORKER = Path(__file__).with_name("dist_worker.py")
TIMEOUT_S = 540
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU")
@pytest.mark.parametrize("nproc", [_procs.world_param(n, GPUS) for n in (2, 3)])
def test_dist_backend_on_real_ranks(nproc: int) -> None:
    rc, out = _procs.launch(WORKER, nproc, [], _procs.child_env(nproc, GPUS), TIMEOUT_S)
    _procs.assert_every_rank_passed(rc, out, nproc, list(SECTIONS))
