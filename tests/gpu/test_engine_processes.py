"""The engine plugins' adapter core on real ranks (``engine_worker.py``, no engine installed) at 2,
3 and 4 processes; where the host has fewer GPUs than ranks (one GPU: every launch here), the
processes share GPU 0 over gloo (``_procs``), whose kernels time-slice, so each call costs
milliseconds and the worker makes a few dozen per mode. On such a host the default run launches 3
processes; 2 and 4 are marked slow (``-m ''`` runs them).

It proves, on every rank: the rule (what goes to the engine), one communicator per group built
with the engine options, every routed all-reduce and fused AllReduce + RMSNorm (+ FP8) result bit
for bit sollat's reference eagerly, in a CUDA graph and under ``torch.compile`` (the fused op the
vLLM pass inserts), in the default and the batch-invariant mode, the same bits on every rank; one
routing on every rank, with one warning naming rank 1, when rank 1 alone has another
SOLLAT_ENGINE_MAX_BYTES or batch-invariant setting; and one decision on every rank, within the
setup timeout, with one warning, when the construction fails on rank 1 (a bad environment value,
its scratch allocation out of memory, its rendezvous failing). Every rank must print PASS for every section of its PLAN and SUMMARY failed=0; the
launcher kills the whole launch after TIMEOUT_S.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from . import _procs
from .engine_worker import SECTIONS

pytestmark = [pytest.mark.gpu]

WORKER = Path(__file__).with_name("engine_worker.py")
TIMEOUT_S = 600
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU")
@pytest.mark.parametrize("nproc", [_procs.world_param(n, GPUS) for n in (2, 3, 4)])
def test_engine_adapter_on_real_ranks(nproc: int) -> None:
    rc, out = _procs.launch(WORKER, nproc, [], _procs.child_env(nproc, GPUS), TIMEOUT_S)
    _procs.assert_every_rank_passed(rc, out, nproc, list(SECTIONS))
