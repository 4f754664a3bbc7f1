"""``Communicator.all_reduce``'s eager hot path: which calls it takes, what
it hands the driver, and that everything else falls through to the checked path. No GPU: CPU
tensors report device -1, so a communicator faked onto device -1 takes them as its own; the launch
is a recording stand-in. The real launches run in every GPU test and the real-rank suite."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from sollat.collectives import handover
from sollat.comm.plan import _Plan
from sollat.comm.ranks import RealRanks
from sollat.comm.real import Communicator
from sollat.device import launch


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[int, tuple[int, ...]]] = []

    def __call__(self, stream: int, ptrs: tuple[int, ...]) -> None:
        self.calls.append((stream, ptrs))


def _fake(monkeypatch: pytest.MonkeyPatch, n: int = 8, dtype: torch.dtype = torch.float32) -> tuple[Communicator, _Recorder, list[Any]]:
    comm = Communicator.__new__(Communicator)
    comm._dev_index = -1  # CPU tensors' get_device()
    comm._faulted = False
    comm._err_host = np.zeros(4, dtype=np.int32)
    comm._symm = handover.SymmetricTensors("g", torch.device("cpu"))
    comm._last_stream = 7
    comm._ranks = RealRanks(0, torch.empty(0, dtype=torch.uint8))
    comm.debug = False
    rec = _Recorder()
    comm._calls = {(n, dtype, "sum", "auto", False, False): _Plan(None, None, None, (), rec)}  # type: ignore[arg-type]
    slow: list[Any] = []

    def checked(tensors: list[Any], op: str, algo: str, outs: list[Any] | None, deterministic: bool) -> list[str]:
        slow.append((tensors[0], op, algo, None if outs is None else outs[0], deterministic))
        return ["slow"]  # one launch rank's result: the public call returns it

    monkeypatch.setattr(comm, "_all_reduce_ranks", checked)
    monkeypatch.setattr(comm, "_order_streams", lambda stream: slow.append(("order", stream)))
    monkeypatch.setattr(launch, "stream_handle", lambda index: 7)
    return comm, rec, slow


def test_a_known_call_shape_goes_straight_to_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    comm, rec, slow = _fake(monkeypatch)
    x, out = torch.randn(8), torch.empty(8)
    assert comm.all_reduce(x, out=out) is out
    y = comm.all_reduce(x)
    assert isinstance(y, torch.Tensor) and y.shape == x.shape and y.dtype == x.dtype and y.data_ptr() != x.data_ptr()
    assert comm.all_reduce(x, out=x) is x
    assert rec.calls == [(7, (x.data_ptr(), out.data_ptr())), (7, (x.data_ptr(), y.data_ptr())),
                         (7, (x.data_ptr(), x.data_ptr()))]
    assert slow == []
    # out with the input's element count but another shape is the same memory: accepted
    flat = torch.empty(2, 4)
    assert comm.all_reduce(x, out=flat) is flat and rec.calls[-1] == (7, (x.data_ptr(), flat.data_ptr()))


@pytest.mark.parametrize("case", ["new shape", "other dtype", "other op", "other algo", "deterministic",
                                  "not contiguous", "out other dtype", "out other numel", "out not contiguous",
                                  "not a tensor", "out not a tensor", "empty", "faulted", "fault flagged"])
def test_everything_else_takes_the_checked_path(monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    comm, rec, slow = _fake(monkeypatch)
    x: Any = torch.randn(8)
    kw: dict[str, Any] = {}
    if case == "new shape":
        x = torch.randn(9)
    elif case == "other dtype":
        x = torch.randn(8, dtype=torch.float64)
    elif case == "other op":
        kw["op"] = "max"
    elif case == "other algo":
        kw["algo"] = "oneshot_ll"
    elif case == "deterministic":
        kw["deterministic"] = True
    elif case == "not contiguous":
        x = torch.randn(16)[::2]
    elif case == "out other dtype":
        kw["out"] = torch.empty(8, dtype=torch.float64)
    elif case == "out other numel":
        kw["out"] = torch.empty(9)
    elif case == "out not contiguous":
        kw["out"] = torch.empty(16)[::2]
    elif case == "not a tensor":
        x = [1.0] * 8
    elif case == "out not a tensor":
        kw["out"] = [0.0] * 8
    elif case == "empty":
        x = torch.empty(0)
    elif case == "faulted":
        comm._faulted = True
    elif case == "fault flagged":
        comm._err_host[0] = 3
    assert comm.all_reduce(x, **kw) == "slow"
    assert rec.calls == [] and len(slow) == 1


def test_a_library_path_in_the_cache_takes_the_checked_path(monkeypatch: pytest.MonkeyPatch) -> None:
    comm, rec, slow = _fake(monkeypatch)
    comm._calls = {(8, torch.float32, "sum", "auto", False, False): "nccl"}
    x = torch.randn(8)
    assert comm.all_reduce(x) == "slow"
    assert rec.calls == [] and slow[0][0] is x and isinstance(slow[0][3], torch.Tensor)


def test_a_new_stream_is_ordered_before_the_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    comm, rec, slow = _fake(monkeypatch)
    monkeypatch.setattr(launch, "stream_handle", lambda index: 9)
    x = torch.randn(8)
    comm.all_reduce(x, out=x)
    assert slow == [("order", 9)] and rec.calls == [(9, (x.data_ptr(), x.data_ptr()))]



def test_torch_compile_traces_the_custom_op_not_the_hot_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torch.compile the call becomes ``sollat::all_reduce`` (its eager body reaches the
    communicator by id and runs the checked path); the hot path is never traced."""
    from sollat.collectives import registry

    comm, rec, slow = _fake(monkeypatch)
    comm.comm_id = registry.register(comm)
    seen: list[str] = []

    def backend(gm: torch.fx.GraphModule, _inputs: Any) -> Any:
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    torch._dynamo.reset()
    f = torch.compile(lambda x: comm.all_reduce(x) * 1, backend=backend, fullgraph=True)
    monkeypatch.setattr(comm, "_all_reduce_ranks", lambda ts, *a: (slow.append(("op", ts[0])), [ts[0] + 1])[1])
    x = torch.randn(8)
    assert torch.equal(f(x), x + 1)
    assert any("sollat.all_reduce" in s for s in seen), seen
    assert rec.calls == [] and [k for k, _ in slow] == ["op"]
