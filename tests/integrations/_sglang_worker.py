"""Driven by test_sglang.py, in the Python that has SGLang: ``python _sglang_worker.py MODE OUT_DIR``.

``loader``: one process: SGLang's own ``load_plugins`` (which applies the hooks) with and without
the opt-in. ``tp``: two gloo processes with the plugin on: SGLang builds its TP group (and a group
that is not tensor-parallel), and its all-reduce entry points reach the hooked custom all-reduce.
Each process writes what it saw as JSON into OUT_DIR (rank.json)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
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
    plugins.load_plugins()
    for name, handler in (("sglang.srt.plugins.sollat", lines), ("sglang.srt.plugins", errors)):
        logging.getLogger(name).removeHandler(handler)
    from sollat.integrations import sglang as shim

    return {"hooked": getattr(car.dispatch_custom_allreduce, "__wrapped__", None) is not None,
            "registered": [getattr(h, "__module__", "") for _, h, _ in HookRegistry._hooks.get(shim.TARGET, [])],
            "lines": [ln for ln in lines.lines if ln.startswith("sollat:")],
            "errors": [ln for ln in errors.lines if "sollat" in ln and ("Failed" in ln or "not understood" in ln)]}


def loader(out: Path) -> None:
    got = {
        "not_whitelisted": _load({"SGLANG_PLUGINS": "other", "SOLLAT_ENGINE_PLUGIN": "1"}),
        "unset": _load({"SGLANG_PLUGINS": "sollat", "SOLLAT_ENGINE_PLUGIN": None}),
        "bad": _load({"SGLANG_PLUGINS": "sollat", "SOLLAT_ENGINE_PLUGIN": "on"}),
        "on": _load({"SGLANG_PLUGINS": "sollat", "SOLLAT_ENGINE_PLUGIN": "1"}),
    }
    (out / "0.json").write_text(json.dumps(got))


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
        return _worker.rank_order_sum(xs).to(xs[0].dtype)

    for dtype, seed in ((torch.bfloat16, 1), (torch.float32, 2)):
        xs = [_worker.rank_input(r, (3, 40), dtype, seed) for r in range(ws)]
        checks[f"auto_{dtype}"] = bool(torch.equal(group._all_reduce_out_place(xs[rank], "auto"), ref(xs)))
    xs = [_worker.rank_input(r, (5, 8), torch.float16, 3) for r in range(ws)]
    checks["ca"] = bool(torch.equal(group._all_reduce_out_place(xs[rank], "ca"), ref(xs)))
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
        checks[name] = bool(torch.equal(group.all_reduce(t.clone()), want))
    got["after_declined"] = _double.counts("all_reduce")
    # SGLang's piecewise CUDA-graph runner switches `disabled` in place
    ca.disabled = True
    got["should_when_disabled"] = bool(ca.should_custom_ar(xs[rank]))
    ca.disabled = False
    # SGLang's graph_capture() enters the custom all-reduce's capture()
    with group.graph_capture():
        got["capturing_inside"] = [ca._IS_CAPTURING, ca.adapter.capturing]
    got["capturing_after"] = [ca._IS_CAPTURING, ca.adapter.capturing]
    got["checks"] = checks
    got["counts"] = dict(ca.adapter.counts)
    got["shim_groups"] = list(shim.GROUPS)
    _worker.write_rank_result(out, rank, got)


if __name__ == "__main__":
    import _worker

    _worker.run(loader, tp)
