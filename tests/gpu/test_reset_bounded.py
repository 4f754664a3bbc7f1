"""``Communicator.reset()`` on real ranks (``reset_worker.py``) at 2, 3 and 4 processes; where the
host has fewer GPUs than ranks, the processes share GPU 0 over gloo (``_procs``) and the default run
launches 3 (2 and 4 are marked slow: ``-m ''`` runs them).

It proves, on every rank: a reset after an absent rank's fault recovers (the next call bit for bit
the rank-order sum); a reset realigns the host agreement's rounds after one rank gave up on a round
its peers never entered; and where one rank's kernels are absent and it never calls ``reset()`` (a
dead peer), every survivor's ``reset()`` raises ``PeerTimeoutError`` naming it within
``agree.reset_wait_s(timeout)`` + a slack, never waiting on the device group. The launcher kills the
whole launch after TIMEOUT_S (a reset that waited on a device-group barrier after a dead peer
would wait for the process group's own timeout, 600 s).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from . import _procs
from .reset_worker import SECTIONS, SETUP_TIMEOUT_S

pytestmark = [pytest.mark.gpu]

WORKER = Path(__file__).with_name("reset_worker.py")
TIMEOUT_S = 300
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU")
@pytest.mark.parametrize("nproc", [_procs.world_param(n, GPUS) for n in (2, 3, 4)])
def test_reset_is_bounded_on_real_ranks(nproc: int) -> None:
    env = _procs.child_env(nproc, GPUS, {"SOLLAT_SETUP_TIMEOUT_S": str(SETUP_TIMEOUT_S)})
    rc, out = _procs.launch(WORKER, nproc, [], env, TIMEOUT_S)
    _procs.assert_every_rank_passed(rc, out, nproc, list(SECTIONS))
