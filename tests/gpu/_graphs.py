"""What every CUDA-graph test does once its calls are planned (virtual ranks): capture them in one
graph, then replay it with fresh inputs and poisoned outputs, checking after every replay."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

import sollat


def capture_and_replay(issue: Callable[[], None], *, inputs: Iterable[torch.Tensor], gen: torch.Generator,
                       replays: int, check: Callable[[int], None], poisoned: Iterable[torch.Tensor] = ()) -> None:
    """Capture ``issue()`` in one CUDA graph and replay it ``replays`` times. Before each replay every
    tensor of ``inputs`` (in order) gets fresh standard-normal values from ``gen``, in its own dtype,
    and every tensor of ``poisoned`` NaN; after it, the device is synchronized and
    ``check(replay)`` runs. Plan the calls (run ``issue`` or its calls once) before."""
    inputs, poisoned = list(inputs), list(poisoned)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        issue()
    for replay in range(replays):
        for x in inputs:
            x.copy_(torch.randn(x.shape, device=x.device, generator=gen).to(x.dtype))
        for o in poisoned:
            o.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check(replay)


def check_eagerly_then_in_a_graph(c: sollat.VirtualCommunicator, issue: Callable[[], None],
                                  verify: Callable[[str], None], *, inputs: Iterable[torch.Tensor],
                                  gen: torch.Generator, replays: int,
                                  poisoned: Iterable[torch.Tensor] = ()) -> None:
    """``issue()`` eagerly (which also plans every call before the capture), then ``verify("eager")``;
    then :func:`capture_and_replay`, each replay followed by ``c.check(sync=False)`` (no fault) and
    ``verify(f"graph replay {replay}")``; last ``c.check()``."""
    issue()
    torch.cuda.synchronize()
    verify("eager")

    def check_replay(replay: int) -> None:
        c.check(sync=False)
        verify(f"graph replay {replay}")

    capture_and_replay(issue, inputs=inputs, poisoned=poisoned, gen=gen, replays=replays, check=check_replay)
    c.check()
