"""The fused AllReduce + RMSNorm at row geometries that leave warps or blocks without a line, with
row buffers reused in a cluster, on real ranks (``rmsnorm_geometry_worker.py``: its docstring says
what each section proves) at 3 processes, and 2 and 4 marked slow where the processes share one
GPU (``_procs``: their kernels time-slice, which holds a block back for a whole slice). Every rank
must print PASS for every section of its PLAN and SUMMARY failed=0; the launcher kills the whole
launch after TIMEOUT_S.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from . import _procs
from .rmsnorm_geometry_worker import SECTIONS

pytestmark = [pytest.mark.gpu]

WORKER = Path(__file__).with_name("rmsnorm_geometry_worker.py")
TIMEOUT_S = 1500
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU")
@pytest.mark.parametrize("nproc", [_procs.world_param(n, GPUS) for n in (2, 3, 4)])
def test_rmsnorm_row_geometries_on_real_ranks(nproc: int) -> None:
    rc, out = _procs.launch(WORKER, nproc, [], _procs.child_env(nproc, GPUS), TIMEOUT_S)
    _procs.assert_every_rank_passed(rc, out, nproc, list(SECTIONS))
