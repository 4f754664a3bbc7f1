"""The engine-free core of the engine plugins (sollat/integrations/core.py): the opt-in, the rule,
and a GroupAdapter over two gloo processes with stand-in communicators (no engine, no GPU)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import torch

from sollat.errors import UnsupportedError
from sollat.integrations import core

CPU = torch.device("cpu")


@pytest.mark.parametrize(("value", "on"), [(None, False), ("", False), ("0", False), (" 0 ", False), ("1", True)])
def test_opt_in_values(value: str | None, on: bool) -> None:
    assert core.opted_in(value) is on


@pytest.mark.parametrize("value", ["yes", "true", "2", "on", "1,0"])
def test_opt_in_value_not_understood(value: str) -> None:
    with pytest.raises(UnsupportedError, match=f"SOLLAT_ENGINE_PLUGIN={value!r} is not understood"):
        core.opted_in(value)


def test_batch_invariant_env() -> None:
    assert core.sollat_batch_invariant_env("1") and not core.sollat_batch_invariant_env(None)
    assert not core.sollat_batch_invariant_env("0")


def test_all_reduce_rule() -> None:
    x = torch.zeros(4, 8)
    assert core.all_reduce_refusal(x, CPU) is None
    for dtype in core.ALL_REDUCE_DTYPES:
        assert core.all_reduce_refusal(x.to(dtype), CPU) is None
    assert core.all_reduce_refusal(x, None) == "no sollat communicator"
    assert core.all_reduce_refusal(x, torch.device("meta")) == "on cpu, the communicator is on meta"
    assert core.all_reduce_refusal(x.to(torch.int32), CPU) == "dtype torch.int32"
    assert core.all_reduce_refusal(x.to(torch.float8_e4m3fn), CPU) == "dtype torch.float8_e4m3fn"
    assert core.all_reduce_refusal(x.t(), CPU) == "not contiguous"
    assert core.all_reduce_refusal(x[:, 1:5], CPU) == "not contiguous"
    assert core.all_reduce_refusal(x[1:3], CPU) is None  # contiguous view at an offset: sollat takes it
    assert core.all_reduce_refusal(torch.zeros(0, 8), CPU) == "empty"
    assert core.all_reduce_refusal("x", CPU) == "not a tensor (str)"
    huge = torch.empty(core.MAX_ELEMENTS + 1, device="meta")
    assert core.all_reduce_refusal(huge, torch.device("meta")) == f"{core.MAX_ELEMENTS + 1} elements > {core.MAX_ELEMENTS}"
    # nothing in the rule depends on the size below the limit (batch invariance)
    big = torch.empty(core.MAX_ELEMENTS, device="meta")
    assert core.all_reduce_refusal(big, torch.device("meta")) is None


def test_rmsnorm_rule() -> None:
    x, r, w = torch.zeros(3, 64, dtype=torch.bfloat16), torch.zeros(3, 64, dtype=torch.bfloat16), torch.ones(
        64, dtype=torch.bfloat16)
    scale = torch.ones(1, 1)
    assert core.rmsnorm_refusal(x, r, w, CPU) is None
    assert core.rmsnorm_refusal(x, r, w, CPU, scale) is None
    assert core.rmsnorm_refusal(x.double(), r.double(), w.double(), CPU).startswith("dtype torch.float64")
    assert core.rmsnorm_refusal(x, r.float(), w, CPU).startswith("residual")
    assert core.rmsnorm_refusal(x, torch.zeros(64, 3, dtype=torch.bfloat16).t(), w, CPU).startswith("residual")
    assert core.rmsnorm_refusal(x, r, w.float(), CPU).startswith("weight")
    assert core.rmsnorm_refusal(x, r, w[:32], CPU).startswith("weight")
    assert core.rmsnorm_refusal(x, r, w, CPU, torch.ones(2)).startswith("fp8 scale")
    assert core.rmsnorm_refusal(x, r, w, CPU, torch.ones(1, dtype=torch.float16)).startswith("fp8 scale")
    wide = torch.zeros(1, 65537, dtype=torch.float16)
    assert core.rmsnorm_refusal(wide, wide, torch.ones(65537, dtype=torch.float16), CPU) == "hidden 65537 > 65536"
    assert core.rmsnorm_refusal(x, r, w, None) == "no sollat communicator"


def test_domain_rule() -> None:
    assert core.domain_refusal(2, ["a", "a"]) is None
    assert core.domain_refusal(8, ["a"] * 8) is None
    assert core.domain_refusal(1, ["a"]).startswith("world size 1")
    assert core.domain_refusal(72, ["a"] * 72) is None
    assert core.domain_refusal(73, ["a"] * 73).startswith("world size 73")
    assert "spans hosts ['a', 'b']" in str(core.domain_refusal(2, ["a", "b"]))


def test_factory_seam_checks_and_restores() -> None:
    with pytest.raises(TypeError, match="expected a callable"):
        core.set_communicator_factory(42)  # type: ignore[arg-type]
    core.set_communicator_factory(lambda g, d, b: None)  # type: ignore[arg-type,return-value]
    core.set_communicator_factory(None)
    assert core._factory is core.sollat_communicator


def test_default_factory_refuses_without_cuda_or_batch_invariance() -> None:
    # On a CPU machine the real communicator cannot be built; the error is sollat's, not a crash.
    with pytest.raises(UnsupportedError):
        core.sollat_communicator(None, torch.device("cuda", 0), True)


def test_adapter_without_a_group_of_two() -> None:
    ad = core.GroupAdapter(engine="test", name="tp:0", device_group=None, cpu_group=None, device=CPU, world_size=1,
                           batch_invariant=False)
    assert ad.all_reduce(torch.ones(3)) is None
    assert ad.unavailable is not None and ad.unavailable.startswith("world size 1")
    assert ad.counts == {"declined:no sollat communicator": 1}
    assert "unavailable" in ad.describe()


# ---- two gloo processes ------------------------------------------------------------------------
class _SumDouble:
    """Sums in rank order over the gloo group; rank ``fail_rank`` fails to construct."""

    fail_rank = -1

    def __init__(self, group: Any, device: torch.device, batch_invariant: bool) -> None:
        import torch.distributed as dist

        if dist.get_rank() == _SumDouble.fail_rank:
            raise RuntimeError("no peer memory here")
        self.group, self.device, self.batch_invariant = group, device, batch_invariant
        self.calls = 0

    def all_reduce(self, x: torch.Tensor, op: str = "sum", algo: str = "auto", *, out: Any = None) -> torch.Tensor:
        import torch.distributed as dist

        self.calls += 1
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(parts, x, group=self.group)
        return torch.stack([p.double() for p in parts]).sum(0).to(x.dtype)

    def all_reduce_rmsnorm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                           algo: str = "auto", **kw: Any) -> tuple[torch.Tensor, ...]:
        r = self.all_reduce(x) + residual
        y = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * weight
        return (y, r, y.to(torch.float8_e4m3fn)) if kw.get("fp8_scale") is not None else (y, r)


def _two_ranks(rank: int, port: int, fail_rank: int, out: str) -> None:
    import json

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    _SumDouble.fail_rank = fail_rank
    core.set_communicator_factory(_SumDouble)
    group = dist.new_group([0, 1], backend="gloo")
    ad = core.GroupAdapter(engine="test", name="tp:0", device_group=group, cpu_group=group, device=CPU, world_size=2,
                           batch_invariant=True)
    got: dict[str, Any] = {}
    got["int32_first"] = ad.all_reduce(torch.ones(2, dtype=torch.int32)) is None  # declined: nothing built
    got["built_after_int32"] = ad.comm is not None or ad.unavailable is not None
    y = ad.all_reduce(torch.full((3,), float(rank + 1)))
    got["y"] = None if y is None else y.tolist()
    x, r, w = torch.full((2, 4), float(rank)), torch.ones(2, 4), torch.ones(4)
    fused = ad.all_reduce_rmsnorm(x, r, w, 1e-6)
    got["fused_r"] = None if fused is None else fused[1].tolist()
    got["fp8"] = None if ad.all_reduce_rmsnorm(x, r, w, 1e-6, fp8_scale=torch.ones(1)) is None else 3
    with ad.capture():
        got["capturing"] = ad.capturing
    got["unavailable"] = ad.unavailable
    got["batch_invariant"] = ad.batch_invariant
    got["counts"] = dict(ad.counts)
    Path(out, f"{rank}.json").write_text(json.dumps(got))
    dist.destroy_process_group()


@pytest.mark.parametrize("fail_rank", [-1, 1], ids=["built", "rank1_fails"])
def test_adapter_agrees_on_every_rank(tmp_path: Path, fail_rank: int) -> None:
    import json

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_two_ranks, args=(port, fail_rank, str(tmp_path)), nprocs=2)
    for rank in (0, 1):
        got = json.loads((tmp_path / f"{rank}.json").read_text())
        assert got["int32_first"] and not got["built_after_int32"]
        assert got["capturing"] is True
        if fail_rank < 0:
            assert got["y"] == [3.0, 3.0, 3.0]
            assert got["fused_r"] == [[2.0] * 4] * 2  # 0 + 1 summed, plus the residual 1
            assert got["fp8"] == 3
            assert got["unavailable"] is None and got["batch_invariant"] is True
            assert got["counts"] == {"declined:no sollat communicator": 1, "all_reduce": 1, "all_reduce_rmsnorm": 2}
        else:  # one rank could not build it: neither rank routes anything to sollat
            assert got["y"] is None and got["fused_r"] is None and got["fp8"] is None
            assert got["unavailable"] == "rank 1: RuntimeError: no peer memory here"
            assert got["counts"] == {"declined:no sollat communicator": 4}
