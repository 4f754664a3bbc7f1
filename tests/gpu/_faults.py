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


#: What an output holds before a call whose result a test checks for poisoning: finite, so an
#: element the kernel never wrote shows as finite (a faulted call writes NaN into every one).
FINITE_POISON = 1234.5


def poisoned_like(refs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.full_like(ref, FINITE_POISON) for ref in refs]


def assert_mismatch_poisons_every_rank(c: sollat.VirtualCommunicator, outs: list[torch.Tensor], what: str) -> None:
    """After a call in which one rank's call differed (the mismatch hook: that rank's signature
    differs, its data is what it would send anyway): every rank's check raises CallMismatchError,
    every rank's record holds the fault, and every element of every rank's output (poisoned with
    FINITE_POISON before the call) is NaN. A finite element on any rank is a result accepted from a
    call with other arguments: never allowed, however right its value happens to be."""
    with pytest.raises(sollat.CallMismatchError):
        c.check()
    torch.cuda.synchronize()
    for rank, view in c._record_views():
        assert int(view[0]) != 0, f"{what}: rank {rank}'s record does not hold the mismatch: {view.tolist()}"
    for k, y in enumerate(outs):
        finite = int((~torch.isnan(y.float())).sum())
        assert finite == 0, f"{what}: rank {k} kept {finite} finite elements of {y.numel()} (of another call's data)"
