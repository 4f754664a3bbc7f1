"""What every test of an absent peer checks after the call (virtual ranks): the timeout reaches the
host, every rank's fault record holds it, and every other rank's output is NaN or exact, with
at least one NaN."""

from __future__ import annotations

import pytest
import torch

import sollat


def assert_absent_rank_fault(c: sollat.VirtualCommunicator, outs: list[torch.Tensor], refs: list[torch.Tensor],
                             absent: int, what: str) -> None:
    """``outs[k]`` is rank k's output of the faulted call, ``refs[k]`` its exact value."""
    with pytest.raises(sollat.PeerTimeoutError) as ei:
        c.check()
    assert ei.value.peer in (absent, -1)
    torch.cuda.synchronize()
    for k, (rank, view) in enumerate(c._record_views()):
        assert int(view[0]) == 1, f"rank {rank}'s record does not hold the fault: {view.tolist()}"
        if k != absent:
            ok = torch.isnan(outs[k]) | (outs[k] == refs[k])
            assert bool(ok.all()), f"{what}: rank {k} wrote a value that is neither NaN nor exact"
            assert bool(torch.isnan(outs[k]).any()), f"{what}: rank {k} shows no sign of the fault"
