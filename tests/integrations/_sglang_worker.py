"""Driven by test_sglang.py, in the Python that has SGLang: ``python _sglang_worker.py MODE OUT_DIR``.

``loader``: one process: SGLang's own ``load_plugins`` (which applies the hooks) with and without
the opt-in, and with values of the plugin's variables it does not understand. ``tp``: two gloo
processes with the plugin on: SGLang builds its TP group (and a group that is not
tensor-parallel), and its all-reduce entry points reach the hooked custom all-reduce (results bit
for bit sollat's arithmetic, which the stand-in computes); then an ``attention_tp`` group whose
factory gives SGLang's CustomAllReduceV2 (a stand-in subclass of SGLang's real class, in the
state SGLang's constructor leaves on GPUs): the object SGLang gets is still a CustomAllReduceV2,
SGLang's own gate for its custom all-gather accepts it, and sollat serves in front of it.
Each process writes what it saw as JSON into OUT_DIR (rank.json)."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _load(env: dict[str, str | None]) -> dict[str, Any]:
    """SGLang's loader once more, with ``env``: what it did."""
    import _worker
    import sglang.srt.distributed.device_communicators.custom_all_reduce as car
    import sglang.srt.plugins as plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    _worker.set_env(env)
    lines, errors = _worker.LogLines(), _worker.LogLines()
    for name, handler in (("sglang.srt.plugins.sollat", lines), ("sglang.srt.plugins", errors)):
        logging.getLogger(name).setLevel(logging.INFO)
        logging.getLogger(name).addHandler(handler)
    plugins._plugins_loaded = False
    exit_message = None
    try:
        plugins.load_plugins()
    except SystemExit as exc:  # what stops SGLang at start-up (its loader catches Exception only)
        exit_message = str(exc)
    for name, handler in (("sglang.srt.plugins.sollat", lines), ("sglang.srt.plugins", errors)):
        logging.getLogger(name).removeHandler(handler)
    from sollat.integrations import sglang as shim

    return {"hooked": getattr(car.dispatch_custom_allreduce, "__wrapped__", None) is not None,
            "registered": [getattr(h, "__module__", "") for _, h, _ in HookRegistry._hooks.get(shim.TARGET, [])],
            "lines": [ln for ln in lines.lines if ln.startswith("sollat:")],
            "errors": [ln for ln in errors.lines if "sollat" in ln and ("Failed" in ln or "not understood" in ln)],
            "exit": exit_message}


# Values of the variables the plugin reads that it does not understand: SGLang stops, nothing hooked.
BAD_VALUES = {"SOLLAT_ENGINE_PLUGIN": "on", "SOLLAT_BATCH_INVARIANT": "yes",
              "SGLANG_ENABLE_DETERMINISTIC_INFERENCE": "maybe", "SOLLAT_ENGINE_MAX_BYTES": "lots",
              "SOLLAT_TIMEOUT_S": "soon"}


def loader(out: Path) -> None:
    import _worker

    got: dict[str, Any] = {
        "not_whitelisted": _load({"SGLANG_PLUGINS": "other", "SOLLAT_ENGINE_PLUGIN": "1"}),
        "unset": _load({"SGLANG_PLUGINS": "sollat", "SOLLAT_ENGINE_PLUGIN": None}),
    }
    for name, value in BAD_VALUES.items():
        got[f"bad:{name}"] = _load({"SGLANG_PLUGINS": "sollat", "SOLLAT_ENGINE_PLUGIN": "1", name: value})
        _worker.set_env({name: None})
    got["on"] = _load({"SGLANG_PLUGINS": "sollat", "SOLLAT_ENGINE_PLUGIN": "1"})
    (out / "0.json").write_text(json.dumps(got))


def fake_v2() -> type:
    """A subclass of SGLang's real CustomAllReduceV2 in the state SGLang's constructor leaves it
    on GPUs (enabled, multicast, its sizes), without its CUDA buffers: its own all-reduce sums over
    gloo and counts its calls, so a call that reaches SGLang's object instead of sollat shows."""
    import torch
    import torch.distributed as dist
    from sglang.srt.distributed.device_communicators.custom_all_reduce_v2 import CustomAllReduceV2

    class FakeV2(CustomAllReduceV2):  # type: ignore[misc]
        def __init__(self, group: Any, device: Any, max_size: int = 8 << 20, **kwargs: Any) -> None:
            self.group, self.device = group, device
            self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
            self.max_size = self.max_push_size = max_size
            self.config = SimpleNamespace(num_push_blocks=4)
            self.has_multicast = True
            self.engine_calls, self.captures = 0, 0
            self.disabled = False

        def should_custom_ar(self, inp: Any) -> bool:
            return not self.disabled and inp.dtype == torch.float32 and inp.is_contiguous()

        def custom_all_reduce(self, input: Any) -> Any:
            import _worker

            self.engine_calls += 1
            parts = [torch.empty_like(input) for _ in range(self.world_size)]
            dist.all_gather(parts, input, group=self.group)
            return _worker.rank_order_sum(parts)

        @contextlib.contextmanager
        def capture(self) -> Any:
            self.captures += 1
            yield

        def close(self) -> None:
            pass

    return FakeV2


def tp(rank: int, port: int, out: Path) -> None:
    import _double
    import _worker
    import torch

    from sollat.integrations import core
    from sollat.integrations import sglang as shim

    core.set_communicator_factory(_double.RankOrderDouble)
    got: dict[str, Any] = {"rank": rank, "load": _load({"SGLANG_PLUGINS": "sollat", "SOLLAT_ENGINE_PLUGIN": "1"})}
    from sglang.srt.distributed import parallel_state as ps

    ws = 2
    ps.init_distributed_environment(world_size=ws, rank=rank, local_rank=rank, backend="gloo",
                                    distributed_init_method=f"tcp://127.0.0.1:{port}")
    # initialize_model_parallel needs a published server config and imports torchvision: the TP
    # group alone, built as initialize_model_parallel builds it.
    group = ps.init_model_parallel_group([list(range(ws))], rank, "gloo", use_custom_allreduce=True, group_name="tp")
    other = ps.init_model_parallel_group([list(range(ws))], rank, "gloo", use_custom_allreduce=True,
                                         group_name="pdmux_prefill_tp")
    ca = group.ca_comm
    got["ca_type"] = type(ca).__name__
    got["other_ca_type"] = type(other.ca_comm).__name__
    got["engine_ca"] = type(getattr(ca, "engine_ca", None)).__name__
    checks: dict[str, bool] = {}

    def ref(xs: list[Any]) -> Any:
        return _worker.rank_order_sum(xs)

    for dtype, seed in ((torch.bfloat16, 1), (torch.float32, 2)):
        xs = [_worker.rank_input(r, (3, 40), dtype, seed) for r in range(ws)]
        checks[f"auto_{dtype}"] = _worker.same_bits(group._all_reduce_out_place(xs[rank], "auto"), ref(xs))
    xs = [_worker.rank_input(r, (5, 8), torch.float16, 3) for r in range(ws)]
    checks["ca"] = _worker.same_bits(group._all_reduce_out_place(xs[rank], "ca"), ref(xs))
    got["after_routed"] = _double.counts("all_reduce")
    # What the rule gives back to SGLang: should_custom_ar says no, so SGLang's method choice is not
    # "ca" (its next choices, pynccl and the rest, are CUDA-only: on CPU SGLang's own all_reduce
    # sends the tensor to torch.distributed, which gives the result compared here).
    xi = [torch.arange(12, dtype=torch.int32).reshape(3, 4) * (r + 1) for r in range(ws)]
    xs = [_worker.rank_input(r, (8, 6), torch.float32, 4) for r in range(ws)]
    declined = {"int32": (xi[rank], ref(xi)), "non_contiguous": (xs[rank].t(), ref(xs).t())}
    got["declined_method"] = {}
    for name, (t, want) in declined.items():
        got["declined_method"][name] = [bool(ca.should_custom_ar(t)), group._resolve_outplace_all_reduce_method(t)]
        checks[name] = _worker.same_bits(group.all_reduce(t.clone()).contiguous(), want.contiguous())
    got["after_declined"] = _double.counts("all_reduce")
    # SGLang's piecewise CUDA-graph runner switches `disabled` in place
    ca.disabled = True
    got["should_when_disabled"] = bool(ca.should_custom_ar(xs[rank]))
    ca.disabled = False
    # SGLang's graph_capture() enters the custom all-reduce's capture()
    with group.graph_capture():
        got["capturing_inside"] = [ca._IS_CAPTURING, ca.sollat_adapter.capturing]
    got["capturing_after"] = [ca._IS_CAPTURING, ca.sollat_adapter.capturing]
    got["checks"] = checks
    got["counts"] = dict(ca.sollat_adapter.counts)
    got["shim_groups"] = list(shim.GROUPS)
    got["adapter_logger"] = ca.sollat_adapter.log.name
    got["v2"] = with_v2(rank, ws)
    _worker.write_rank_result(out, rank, got)


def with_v2(rank: int, ws: int) -> dict[str, Any]:
    """An ``attention_tp`` group whose factory gives SGLang's CustomAllReduceV2 (``fake_v2``), as
    SGLang's dispatch does on CUDA, with a 4 KiB sollat limit: SGLang's features that check the
    type see SGLang's class; sollat serves what it admits, SGLang's object what it declines."""
    import os

    import _double
    import _worker
    import sglang.srt.distributed.device_communicators.custom_all_reduce as car
    import sglang.srt.distributed.device_communicators.custom_all_reduce_v2 as v2
    import torch
    from sglang.kernels.ops.communication.muse_spark_all_gather import gemm_ag_supported
    from sglang.srt.distributed import parallel_state as ps

    real_v2 = v2.CustomAllReduceV2
    saved = (car._is_cuda, v2.CustomAllReduceV2, v2.can_use_custom_all_reduce_v2)
    car._is_cuda, v2.CustomAllReduceV2 = True, fake_v2()
    v2.can_use_custom_all_reduce_v2 = lambda group, device: True
    os.environ["SOLLAT_ENGINE_MAX_BYTES"] = "4096"
    try:
        group = ps.init_model_parallel_group([list(range(ws))], rank, "gloo", use_custom_allreduce=True,
                                             group_name="attention_tp")
    finally:
        car._is_cuda, v2.CustomAllReduceV2, v2.can_use_custom_all_reduce_v2 = saved
        del os.environ["SOLLAT_ENGINE_MAX_BYTES"]
    ca = group.ca_comm
    got: dict[str, Any] = {"type": type(ca).__name__, "is_v2": isinstance(ca, real_v2), "disabled": ca.disabled,
                           "has_multicast": ca.has_multicast}
    x, w = torch.zeros(2, 64, dtype=torch.bfloat16), torch.zeros(128, 64, dtype=torch.bfloat16)
    got["sglang_all_gather_gate"] = bool(gemm_ag_supported(ca, x, w))  # SGLang's own check, unchanged
    n0 = _double.counts("all_reduce")
    small = [_worker.rank_input(r, (4, 64), torch.float32, 20) for r in range(ws)]  # 1 KiB: sollat's
    big = [_worker.rank_input(r, (32, 64), torch.float32, 21) for r in range(ws)]  # 8 KiB: above the limit
    got["small"] = _worker.same_bits(group._all_reduce_out_place(small[rank], "ca"), _worker.rank_order_sum(small))
    got["big"] = _worker.same_bits(group._all_reduce_out_place(big[rank], "ca"), _worker.rank_order_sum(big))
    got["sollat_calls"], got["sglang_calls"] = _double.counts("all_reduce") - n0, ca.engine_calls
    with group.graph_capture():
        got["capturing"] = [ca.sollat_adapter.capturing, ca.captures]
    ca.disabled = True  # SGLang's piecewise runner switches its object off in place: both paths
    got["should_when_disabled"] = [ca.should_custom_ar(small[rank]), ca.should_custom_ar(big[rank])]
    ca.disabled = False
    return got


if __name__ == "__main__":
    import _worker

    _worker.run(loader, tp)
