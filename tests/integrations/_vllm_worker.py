"""Driven by test_vllm.py, in the Python that has vLLM: ``python _vllm_worker.py MODE OUT_DIR``.

``loader``: one process, no torch.distributed: vLLM's own plugin loader with and without the
opt-in. ``tp``: two gloo processes with the plugin on (vLLM's CPU platform): vLLM's TP all-reduce,
eagerly and through the ``vllm.all_reduce`` custom op under torch.compile, ineligible calls, the
fused op and the compile pass. Each process writes what it saw as JSON into OUT_DIR (rank.json)."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def _load(env: dict[str, str | None]) -> dict[str, Any]:
    """vLLM's loader once, in a process where it has not run, with ``env``; what it did."""
    import _worker
    import vllm.plugins as plugins
    from vllm.compilation.passes.pass_manager import PostGradPassManager
    from vllm.distributed.parallel_state import GroupCoordinator

    _worker.set_env(env)
    lines = _worker.LogLines()
    logging.getLogger("vllm").setLevel(logging.INFO)  # as vLLM's own logging setup leaves it
    logging.getLogger("vllm.plugins.sollat").addHandler(lines)
    plugins.plugins_loaded = False
    error = None
    try:
        plugins.load_general_plugins()
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    logging.getLogger("vllm.plugins.sollat").removeHandler(lines)
    return {"patched": [getattr(f, "sollat_patch", False) for f in (
                GroupCoordinator._all_reduce_out_place, GroupCoordinator.graph_capture, PostGradPassManager.configure)],
            "lines": [ln for ln in lines.lines if ln.startswith("sollat:")], "error": error}


def loader(out: Path) -> None:
    got = {
        "not_whitelisted": _load({"VLLM_PLUGINS": "lora_filesystem_resolver", "SOLLAT_ENGINE_PLUGIN": "1"}),
        "unset": _load({"VLLM_PLUGINS": "sollat", "SOLLAT_ENGINE_PLUGIN": None}),
        "zero": _load({"VLLM_PLUGINS": "sollat", "SOLLAT_ENGINE_PLUGIN": "0"}),
        "bad": _load({"VLLM_PLUGINS": "sollat", "SOLLAT_ENGINE_PLUGIN": "yes"}),
        "on": _load({"VLLM_PLUGINS": "sollat", "SOLLAT_ENGINE_PLUGIN": "1"}),
        "again": _load({"VLLM_PLUGINS": "sollat", "SOLLAT_ENGINE_PLUGIN": "1"}),
    }
    (out / "0.json").write_text(json.dumps(got))


def tp(rank: int, port: int, out: Path) -> None:
    import _double
    import _worker
    import torch
    import torch._inductor.pattern_matcher as pm
    from _worker import rank_input, rank_order_sum

    from sollat.integrations import core, vllm_pass
    from sollat.integrations import vllm as shim

    core.set_communicator_factory(_double.RankOrderDouble)
    got: dict[str, Any] = {"rank": rank}
    got["load"] = _load({"VLLM_PLUGINS": "sollat", "SOLLAT_ENGINE_PLUGIN": "1"})

    import vllm.ir.ops
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state as ps
    from vllm.distributed import tensor_model_parallel_all_reduce

    ws = 2
    checks: dict[str, Any] = {}

    def check(name: str, value: Any, want: Any, exact: bool = True, rtol: float = 2e-2) -> None:
        value, want = value.double(), want.double()
        ok = bool(torch.equal(value, want)) if exact else bool(torch.allclose(value, want, rtol=rtol, atol=2e-2))
        checks[name] = {"ok": ok, "max_err": float((value - want).abs().max()) if value.numel() else 0.0}

    def everyone(shape: tuple[int, ...], dtype: Any, seed: int) -> list[Any]:
        return [rank_input(r, shape, dtype, seed) for r in range(ws)]

    with set_current_vllm_config(VllmConfig()) as _:
        ps.init_distributed_environment(world_size=ws, rank=rank, local_rank=rank, backend="gloo",
                                        distributed_init_method=f"tcp://127.0.0.1:{port}")
        ps.initialize_model_parallel(tensor_model_parallel_size=ws)
        group = ps.get_tp_group()
        got["device_communicator"] = type(group.device_communicator).__name__
        got["world_adapter"] = shim.adapter(ps.get_world_group()) is not None

        # eager, through vLLM's public TP all-reduce
        for dtype, seed in ((torch.float32, 1), (torch.bfloat16, 2)):
            xs = everyone((3, 40), dtype, seed)
            check(f"eager_{dtype}", tensor_model_parallel_all_reduce(xs[rank].clone()), rank_order_sum(xs).to(dtype))
        got["after_eager"] = _double.counts("all_reduce")

        # calls the rule gives to vLLM (CpuCommunicator, in place on a copy)
        xi = [torch.arange(12, dtype=torch.int32).reshape(3, 4) * (r + 1) for r in range(ws)]
        check("int32", tensor_model_parallel_all_reduce(xi[rank].clone()), rank_order_sum(xi).to(torch.int32))
        xs = everyone((8, 6), torch.float32, 3)
        check("non_contiguous", tensor_model_parallel_all_reduce(xs[rank].clone().t()), rank_order_sum(xs).t().float())
        check("empty", tensor_model_parallel_all_reduce(torch.empty(0, 4)), torch.empty(0, 4))
        got["after_ineligible"] = _double.counts("all_reduce")

        # torch.compile through vLLM's opaque custom op (what CUDA platforms trace)
        group.use_custom_op_call = True

        @torch.compile(backend="aot_eager", fullgraph=True, dynamic=False)
        def layer(x: Any) -> Any:
            return tensor_model_parallel_all_reduce(x * 2.0) + 1.0

        for seed in (4, 5):
            xs = everyone((2, 24), torch.float32, seed)
            check(f"compiled_{seed}", layer(xs[rank]), rank_order_sum([2.0 * x for x in xs]).float() + 1.0)
        got["after_compiled"] = _double.counts("all_reduce")

        # the fused op the compile pass puts in the graph, eagerly
        name = group.unique_name
        xs, rs = everyone((4, 64), torch.bfloat16, 6), everyone((4, 64), torch.bfloat16, 7)
        w = rank_input(0, (64,), torch.bfloat16, 8)  # the same weight on every rank
        want_y, want_r = vllm.ir.ops.fused_add_rms_norm(rank_order_sum(xs).to(torch.bfloat16), rs[rank], w, 1e-6)
        y, r = torch.ops.sollat_vllm.all_reduce_rmsnorm(xs[rank], rs[rank], w, 1e-6, name)
        # routed: the double's (sollat's) arithmetic, one rounding of sum + residual; y within
        # rounding of vLLM's unfused IR op
        check("fused_y", y, want_y, exact=False)
        check("fused_r", r, (rank_order_sum(xs) + rs[rank].double()).to(torch.bfloat16))
        x64, r64 = everyone((4, 64), torch.float64, 9), everyone((4, 64), torch.float64, 10)
        w64 = rank_input(0, (64,), torch.float64, 11)
        y, r = torch.ops.sollat_vllm.all_reduce_rmsnorm(x64[rank], r64[rank], w64, 1e-6, name)
        wy, wr = vllm.ir.ops.fused_add_rms_norm(rank_order_sum(x64), r64[rank], w64, 1e-6)
        check("fused_fallback_y", y, wy)
        check("fused_fallback_r", r, wr)
        got["after_fused_ops"] = {"rmsnorm": _double.counts("all_reduce_rmsnorm"), "all_reduce": _double.counts("all_reduce")}

        # the compile pass: vLLM's pass manager takes it in, and it rewrites vLLM's pattern
        from vllm.compilation.passes.pass_manager import PostGradPassManager

        config = VllmConfig()
        manager = PostGradPassManager()
        manager.configure(config)
        names = [type(p).__name__ for p in manager.passes]
        got["manager_passes"] = names
        ours = next(p for p in manager.passes if type(p).__name__ == "SollatAllReduceRMSNormPass")
        scale = torch.tensor([[0.05]], dtype=torch.float32)

        def model(residual: Any, x: Any, weight: Any, scale: Any) -> Any:
            y, r = vllm.ir.ops.fused_add_rms_norm(tensor_model_parallel_all_reduce(x), residual, weight, 1e-6)
            q = vllm_pass._static_quant()(y, scale)[0]
            y2, r2 = vllm.ir.ops.fused_add_rms_norm(tensor_model_parallel_all_reduce(r), r, weight, 1e-5)
            return q, y2, r2

        args = (rs[rank], xs[rank], w, scale)

        def trace() -> Any:  # as vLLM traces its patterns: on fake tensors of the same shapes
            return pm.fwd_only(model, [torch.empty(a.shape, dtype=a.dtype) for a in args])

        from vllm.compilation.passes.inductor_pass import enable_fake_mode

        gm = enable_fake_mode(trace)()
        before = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
        ours(gm.graph)
        gm.recompile()
        after = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
        got["graph_before"], got["graph_after"], got["matched"] = before, after, ours.matched_count
        n0 = _double.counts("all_reduce_rmsnorm")
        q, y2, r2 = gm(*args)
        got["graph_rmsnorm_calls"] = _double.counts("all_reduce_rmsnorm") - n0
        wq, wy2, wr2 = model(*args)
        check("pass_q", q.float(), wq.float(), exact=False, rtol=0.13)  # e4m3: 3 mantissa bits
        check("pass_y2", y2, wy2, exact=False)
        check("pass_r2", r2, wr2, exact=False)

        fusing = VllmConfig()
        fusing.compilation_config.pass_config.fuse_allreduce_rms = True
        got["wanted_when_vllm_fuses"] = vllm_pass.wanted(fusing)
        got["checks"] = checks
        got["counts"] = dict(shim.adapter(group).counts)
    _worker.write_rank_result(out, rank, got)


if __name__ == "__main__":
    import _worker

    _worker.run(loader, tp)
