"""What every test of an absent peer checks after the call (virtual ranks): the timeout reaches the
host, every rank's fault record holds it, and every other rank's output is NaN or exact, with
at least one NaN; and, where the test says so, that the communicator then refuses every call until
``reset()``, after which it computes right again."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import sollat
from sollat import testing

from ._reference import assert_bitwise


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


def assert_absent_rank_refuses_until_reset(c: sollat.VirtualCommunicator,
                                           call: Callable[[list[torch.Tensor] | None], list[torch.Tensor]],
                                           refs: list[torch.Tensor], absent: int, what: str) -> None:
    """Rank ``absent`` never arrives at ``call(outs)`` (``call(out)`` runs the collective on every
    rank's inputs, into ``out`` if given; ``refs[k]`` is rank k's exact result): the fault as
    :func:`assert_absent_rank_fault` checks it, the next call refused, and after ``c.reset()`` every
    rank's result exact again."""
    outs = [torch.zeros_like(ref) for ref in refs]
    testing.inject(c, absent=absent)
    call(outs)
    assert_absent_rank_fault(c, outs, refs, absent, what)
    testing.clear(c)
    with pytest.raises(sollat.CommunicatorFaultedError):
        call(None)
    c.reset()
    for k, y in enumerate(call(None)):
        assert_bitwise(y, refs[k], f"{what} after reset rank {k}")
    c.check()
