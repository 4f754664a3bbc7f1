"""Driven by test_vllm.py, in the Python that has vLLM: ``python _vllm_worker.py MODE OUT_DIR``.

``loader``: one process, no torch.distributed: vLLM's own plugin loader with and without the
opt-in, and with values of the plugin's variables it does not understand. ``tp``: two gloo
processes with the plugin on (vLLM's CPU platform): vLLM's TP all-reduce, eagerly and through the
``vllm.all_reduce`` custom op under torch.compile, ineligible calls, the fused op and the compile
pass, every routed result compared bit for bit with sollat's arithmetic (the stand-in computes
it); the plugin's log lines as vLLM's logger formats them. Each process writes what it saw as JSON
into OUT_DIR (rank.json)."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


class VllmFormatted(logging.Handler):
    """Every record that reaches vLLM's own ``vllm`` logger, formatted by vLLM's handler."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        handler = next(h for h in logging.getLogger("vllm").handlers if h is not self)
        self.lines.append(handler.format(record))


def _load(env: dict[str, str | None]) -> dict[str, Any]:
    """vLLM's loader once, in a process where it has not run, with ``env``; what it did."""
    import _worker
    import vllm.plugins as plugins
    from vllm.compilation.passes.pass_manager import PostGradPassManager
    from vllm.distributed.parallel_state import GroupCoordinator

    _worker.set_env(env)
    lines, formatted = _worker.LogLines(), VllmFormatted()
    logging.getLogger("vllm").setLevel(logging.INFO)  # as vLLM's own logging setup leaves it
    logging.getLogger("vllm.plugins.sollat").addHandler(lines)
    logging.getLogger("vllm").addHandler(formatted)
    plugins.plugins_loaded = False
    error = None
    try:
        plugins.load_general_plugins()
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    logging.getLogger("vllm.plugins.sollat").removeHandler(lines)
    logging.getLogger("vllm").removeHandler(formatted)
    return {"patched": [getattr(f, "sollat_patch", False) for f in (
                GroupCoordinator._all_reduce_out_place, GroupCoordinator.graph_capture, PostGradPassManager.configure)],
            "lines": [ln for ln in lines.lines if ln.startswith("sollat:")], "error": error,
            "formatted": [ln for ln in formatted.lines if "sollat:" in ln]}


# Values of the variables the plugin reads that it does not understand: vLLM stops, nothing patched.
BAD_VALUES = {"SOLLAT_ENGINE_PLUGIN": "yes", "SOLLAT_BATCH_INVARIANT": "yes", "VLLM_BATCH_INVARIANT": "yes",
              "SOLLAT_ENGINE_MAX_BYTES": "lots", "SOLLAT_SETUP_TIMEOUT_S": "soon"}


def configure_vllm_logging() -> None:
    """vLLM's logging set-up, as every vLLM process runs it (its handler on the ``vllm`` logger)."""
    from vllm.config.logging import LoggingConfig
    from vllm.logger import configure_logging

    configure_logging(LoggingConfig())


def loader(out: Path) -> None:
    configure_vllm_logging()
    got: dict[str, Any] = {
        "not_whitelisted": _load({"VLLM_PLUGINS": "lora_filesystem_resolver", "SOLLAT_ENGINE_PLUGIN": "1"}),
        "unset": _load({"VLLM_PLUGINS": "sollat", "SOLLAT_ENGINE_PLUGIN": None}),
        "zero": _load({"VLLM_PLUGINS": "sollat", "SOLLAT_ENGINE_PLUGIN": "0"}),
        # off: the other variables are not the plugin's business
        "zero_bad_other": _load({"VLLM_PLUGINS": "sollat", "SOLLAT_ENGINE_PLUGIN": "0", "SOLLAT_BATCH_INVARIANT": "yes"}),
    }
    for name, value in BAD_VALUES.items():
        got[f"bad:{name}"] = _load({"VLLM_PLUGINS": "sollat", "SOLLAT_ENGINE_PLUGIN": "1", "SOLLAT_BATCH_INVARIANT": None,
                                    **{name: value}})
        _worker_env_clear(name)
    got["on"] = _load({"VLLM_PLUGINS": "sollat", "SOLLAT_ENGINE_PLUGIN": "1", "SOLLAT_BATCH_INVARIANT": None})
    got["again"] = _load({"VLLM_PLUGINS": "sollat", "SOLLAT_ENGINE_PLUGIN": "1"})
    from sollat.integrations import vllm_adapter

    got["logger"] = {"name": vllm_adapter.logger().name, "vllm_methods": hasattr(vllm_adapter.logger(), "info_once")}
    (out / "0.json").write_text(json.dumps(got))


def _worker_env_clear(name: str) -> None:
    import _worker

    _worker.set_env({name: None})


def tp(rank: int, port: int, out: Path) -> None:
    import _double
    import _worker
    import torch
    import torch._inductor.pattern_matcher as pm
    from _worker import rank_input, rank_order_sum, same_bits

    from sollat.collectives.rmsnorm import fp8_reference, reference
    from sollat.integrations import core, vllm_adapter, vllm_pass
    from sollat.integrations import vllm as shim

    core.set_communicator_factory(_double.RankOrderDouble)
    configure_vllm_logging()
    got: dict[str, Any] = {"rank": rank}
    got["load"] = _load({"VLLM_PLUGINS": "sollat", "SOLLAT_ENGINE_PLUGIN": "1"})

    import vllm.ir.ops
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state as ps
    from vllm.distributed import tensor_model_parallel_all_reduce

    ws = 2
    checks: dict[str, bool] = {}

    def check(name: str, value: Any, want: Any) -> None:  # bit for bit
        checks[name] = same_bits(value, want)

    def everyone(shape: tuple[int, ...], dtype: Any, seed: int) -> list[Any]:
        return [rank_input(r, shape, dtype, seed) for r in range(ws)]

    with set_current_vllm_config(VllmConfig()) as _:
        ps.init_distributed_environment(world_size=ws, rank=rank, local_rank=rank, backend="gloo",
                                        distributed_init_method=f"tcp://127.0.0.1:{port}")
        ps.initialize_model_parallel(tensor_model_parallel_size=ws)
        group = ps.get_tp_group()
        got["device_communicator"] = type(group.device_communicator).__name__
        got["world_adapter"] = shim.adapter(ps.get_world_group()) is not None
        got["adapter_logger"] = shim.adapter(group).log.name

        # eager, through vLLM's public TP all-reduce
        for dtype, seed in ((torch.float32, 1), (torch.bfloat16, 2)):
            xs = everyone((3, 40), dtype, seed)
            check(f"eager_{dtype}", tensor_model_parallel_all_reduce(xs[rank].clone()), rank_order_sum(xs))
        got["after_eager"] = _double.counts("all_reduce")

        # calls the rule gives to vLLM (CpuCommunicator, in place on a copy)
        xi = [torch.arange(12, dtype=torch.int32).reshape(3, 4) * (r + 1) for r in range(ws)]
        check("int32", tensor_model_parallel_all_reduce(xi[rank].clone()), rank_order_sum(xi))
        xs = everyone((8, 6), torch.float32, 3)
        check("non_contiguous", tensor_model_parallel_all_reduce(xs[rank].clone().t()).contiguous(),
              rank_order_sum(xs).t().contiguous())
        check("empty", tensor_model_parallel_all_reduce(torch.empty(0, 4)), torch.empty(0, 4))
        got["after_ineligible"] = _double.counts("all_reduce")

        # torch.compile through vLLM's opaque custom op (what CUDA platforms trace)
        group.use_custom_op_call = True

        @torch.compile(backend="aot_eager", fullgraph=True, dynamic=False)
        def layer(x: Any) -> Any:
            return tensor_model_parallel_all_reduce(x * 2.0) + 1.0

        for seed in (4, 5):
            xs = everyone((2, 24), torch.float32, seed)
            check(f"compiled_{seed}", layer(xs[rank]), rank_order_sum([2.0 * x for x in xs]) + 1.0)
        got["after_compiled"] = _double.counts("all_reduce")

        # the fused op the compile pass puts in the graph, eagerly: sollat's arithmetic, bit for bit
        name = group.unique_name
        xs, rs = everyone((4, 64), torch.bfloat16, 6), everyone((4, 64), torch.bfloat16, 7)
        w = rank_input(0, (64,), torch.bfloat16, 8)  # the same weight on every rank
        want_y, want_r = reference(xs, rs[rank], w, 1e-6)
        y, r = torch.ops.sollat_vllm.all_reduce_rmsnorm(xs[rank], rs[rank], w, 1e-6, name)
        check("fused_y", y, want_y)
        check("fused_r", r, want_r)
        x64, r64 = everyone((4, 64), torch.float64, 9), everyone((4, 64), torch.float64, 10)
        w64 = rank_input(0, (64,), torch.float64, 11)
        y, r = torch.ops.sollat_vllm.all_reduce_rmsnorm(x64[rank], r64[rank], w64, 1e-6, name)
        wy, wr = vllm.ir.ops.fused_add_rms_norm(rank_order_sum(x64), r64[rank], w64, 1e-6)  # vLLM's own parts
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
        # sollat's arithmetic for both fused calls of every rank: the second call's x and residual
        # are each rank's r of the first
        y1, _ = reference(xs, rs[rank], w, 1e-6)
        r_all = [reference(xs, rs[k], w, 1e-6)[1] for k in range(ws)]
        wy2, wr2 = reference(r_all, r_all[rank], w, 1e-5)
        check("pass_q", q, fp8_reference(y1, scale))
        check("pass_y2", y2, wy2)
        check("pass_r2", r2, wr2)

        fusing = VllmConfig()
        fusing.compilation_config.pass_config.fuse_allreduce_rms = True
        got["wanted_when_vllm_fuses"] = vllm_pass.wanted(fusing)
        got["checks"] = checks
        got["counts"] = dict(shim.adapter(group).counts)

        # a group whose communicator one rank cannot build keeps vLLM's all-reduce, with one
        # warning through vLLM's logger (rank 0's), naming the rank and the cause
        formatted = VllmFormatted()
        logging.getLogger("vllm").addHandler(formatted)

        def failing(g: Any, device: Any, bi: bool) -> Any:
            if rank == 1:
                raise torch.OutOfMemoryError("CUDA out of memory (injected on rank 1)")
            made = _double.RankOrderDouble(g, device, bi)
            _double.DOUBLES.remove(made)  # not one of the TP group's
            return made

        core.set_communicator_factory(failing)
        spare = core.GroupAdapter(engine=vllm_adapter.ENGINE, name="tp:spare", device_group=group.device_group,
                                  cpu_group=group.cpu_group, device=group.device, world_size=ws,
                                  batch_invariant=False, log=vllm_adapter.logger())
        got["spare"] = {"built": spare.ensure(), "unavailable": spare.unavailable}
        logging.getLogger("vllm").removeHandler(formatted)
        got["warnings"] = [ln for ln in formatted.lines if "keeps the engine's all-reduce" in ln]
    _worker.write_rank_result(out, rank, got)


if __name__ == "__main__":
    import _worker

    _worker.run(loader, tp)
