"""vLLM compile pass: tensor-parallel all-reduce -> ``fused_add_rms_norm`` (-> static FP8 quant)
becomes one sollat fused call.

vLLM 0.33 traces a decoder layer's ``tensor_model_parallel_all_reduce(x)`` followed by
``RMSNorm(x, residual)`` as ``vllm.all_reduce(x, group_name)`` and the functional IR op
``vllm_ir.fused_add_rms_norm(x, residual, weight, eps)`` (``vllm/ir/ops/layernorm.py``), and
its static per-tensor FP8 quantisation as ``_C.static_scaled_fp8_quant`` (QuantFP8 as a custom
op) or as QuantFP8's native aten ops. Its own ``AllReduceFusionPass``
(``compilation/passes/fusion/allreduce_rms_fusion.py``) matches exactly those nodes and replaces
them with FlashInfer's fused kernel; vLLM runs it only with ``pass_config.fuse_allreduce_rms``,
which ``VLLM_BATCH_INVARIANT=1`` turns off. This pass matches the same nodes and puts the
``sollat_vllm::all_reduce_rmsnorm`` (or ``..._fp8``) custom op in their place. ``add_to`` (called
after ``PostGradPassManager.configure``) inserts it where vLLM inserts its own fusion: after the
no-op elimination and the RMSNorm canonicalisation, before the RMSNorm + quant fusion (which would
otherwise take the ``fused_add_rms_norm`` + quant pair first).

At run time the op asks the group's adapter (``core.GroupAdapter.all_reduce_rmsnorm``); a call
the rule refuses is composed from vLLM's own parts: the group's all-reduce (itself routed by the
plugin), the ``fused_add_rms_norm`` IR op and QuantFP8. The fused result has sollat's arithmetic
(``sollat.rmsnorm.reference``: the rank-order fp32 sum rounded to the dtype, the residual added and
rounded again, the norm in fp32), which is within rounding of vLLM's unfused kernels, not
bit-identical to them.
"""

from __future__ import annotations

from typing import Any

import torch

from . import core

_EPSILONS = (1e-5, 1e-6)  # the values vLLM's own fusion registers patterns for
_FP8 = torch.float8_e4m3fn
_BEFORE = ("RMSNormReshapeFusionPass", "RMSNormQuantFusionPass", "RocmAiterRMSNormQuantFusionPass",
           "ActivationQuantFusionPass")  # passes that must see the graph after this one


# ---- the custom ops the pass puts in the graph ------------------------------------------------
def _group(group_name: str) -> Any:
    from vllm.distributed import parallel_state as ps

    ref = ps._groups.get(group_name)
    group = ref() if ref is not None else None
    if group is None:
        raise ValueError(f"sollat_vllm: vLLM group {group_name!r} does not exist (any more)")
    return group


def _adapter(group: Any) -> core.GroupAdapter | None:
    from .vllm_adapter import adapter

    return adapter(group)


def _unfused(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, epsilon: float,
             group_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    import vllm.ir.ops

    summed = _group(group_name)._all_reduce_out_place(x)
    y, r = vllm.ir.ops.fused_add_rms_norm(summed, residual, weight, epsilon)
    return y, r


@torch.library.custom_op("sollat_vllm::all_reduce_rmsnorm", mutates_args=())
def all_reduce_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, epsilon: float,
                       group_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y, residual_out)`` of all_reduce(x) -> fused_add_rms_norm over vLLM group ``group_name``."""
    ad = _adapter(_group(group_name))
    got = ad.all_reduce_rmsnorm(x, residual, weight, epsilon) if ad is not None else None
    if got is None:
        return _unfused(x, residual, weight, epsilon, group_name)
    return got[0], got[1]


@all_reduce_rmsnorm.register_fake
def _(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, epsilon: float,
      group_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), torch.empty_like(x)


_quant: Any = None  # vLLM's QuantFP8 (static, per tensor), made while a vLLM config is current


def _static_quant() -> Any:
    global _quant
    if _quant is None:
        from vllm.model_executor.layers.quantization.input_quant_fp8 import QuantFP8
        from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape

        _quant = QuantFP8(True, GroupShape.PER_TENSOR, compile_native=False)
    return _quant


@torch.library.custom_op("sollat_vllm::all_reduce_rmsnorm_fp8", mutates_args=())
def all_reduce_rmsnorm_fp8(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                           epsilon: float, group_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, residual_out)``: as ``all_reduce_rmsnorm``, then vLLM's static per-tensor FP8 quant of y."""
    ad = _adapter(_group(group_name))
    got = ad.all_reduce_rmsnorm(x, residual, weight, epsilon, fp8_scale=scale) if ad is not None else None
    if got is None:
        y, r = _unfused(x, residual, weight, epsilon, group_name)
        return _static_quant()(y, scale)[0], r
    return got[2], got[1]


@all_reduce_rmsnorm_fp8.register_fake
def _(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, epsilon: float,
      group_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty(x.shape, dtype=_FP8, device=x.device), torch.empty_like(x)


# ---- the patterns -------------------------------------------------------------------------------
def _quant_nodes(y: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """vLLM's static per-tensor FP8 quant of ``y`` as it appears in a post-grad graph: the custom op
    through auto_functionalized when QuantFP8 is enabled as a custom op, else its native aten ops."""
    q = _static_quant()
    if q.enabled():
        from torch._higher_order_ops.auto_functionalize import auto_functionalized

        result = torch.empty(y.shape, device=y.device, dtype=_FP8)
        got = auto_functionalized(torch.ops._C.static_scaled_fp8_quant.default, result=result, input=y,
                                  scale=scale, group_shape=[-1, -1])
        return got[1]
    return q.forward_native(y, scale)[0]


def _weight_dtype_matches(match: Any) -> bool:
    """As vLLM's own check: no fusion when the norm's weight dtype differs from its input's."""
    ir_op = torch.ops.vllm_ir.fused_add_rms_norm.default
    for node in match.nodes:
        if node.target == ir_op:
            x, weight = node.args[0], node.args[2]
            if isinstance(x, torch.fx.Node) and isinstance(weight, torch.fx.Node):
                return bool(x.meta["val"].dtype == weight.meta["val"].dtype)
    return True


def _pattern_functions(eps: float, group_name: str) -> tuple[Any, Any, Any, Any]:
    """(pattern, replacement, pattern_fp8, replacement_fp8) for one epsilon (the matcher takes
    every parameter of a pattern as a graph input, so the constants are closed over)."""
    import vllm.ir.ops

    all_reduce = torch.ops.vllm.all_reduce.default
    fused = torch.ops.sollat_vllm.all_reduce_rmsnorm.default
    fused_fp8 = torch.ops.sollat_vllm.all_reduce_rmsnorm_fp8.default

    def pattern(residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y, r = vllm.ir.ops.fused_add_rms_norm(all_reduce(x, group_name), residual, weight, eps)
        return y, r

    def replacement(residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y, r = fused(x, residual, weight, eps, group_name)
        return y, r

    def pattern_fp8(residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                    scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y, r = vllm.ir.ops.fused_add_rms_norm(all_reduce(x, group_name), residual, weight, eps)
        return _quant_nodes(y, scale), r

    def replacement_fp8(residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                        scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, r = fused_fp8(x, residual, weight, scale, eps, group_name)
        return q, r

    return pattern, replacement, pattern_fp8, replacement_fp8


def _y_only(fn: Any) -> Any:
    def first(residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return fn(residual, x, weight)[0]

    return first


def register_patterns(patterns: Any, group_name: str, dtypes: tuple[torch.dtype, ...], device: Any) -> int:
    """Register this pass's replacements into the inductor ``PatternMatcherPass`` ``patterns``
    (under fake mode); how many. ``dtypes``: the model's dtype (the quant's native form has dtype-
    dependent casts), or every dtype the fused op takes when the model's is not known."""
    import torch._inductor.pattern_matcher as pm

    count = 0
    for eps in _EPSILONS:
        pattern, replacement, pattern_fp8, replacement_fp8 = _pattern_functions(eps, group_name)
        for i, dtype in enumerate(dtypes):
            inputs = [torch.empty(5, 16, dtype=dtype, device=device) for _ in range(2)]
            inputs.append(torch.empty(16, dtype=dtype, device=device))
            scale = torch.empty(1, 1, dtype=torch.float32, device=device)
            # The matcher searches with constants and dtypes ignored and then checks the match against
            # the pattern traced again on the matched nodes, constants included: a pattern that only
            # differs in a constant is kept, one that is the same (the IR op is one node whatever the
            # dtype; the quant's casts are the same for both 16-bit types) is skipped.
            regs = [(pattern, replacement, inputs), (_y_only(pattern), _y_only(replacement), inputs)] if i == 0 else []
            regs.append((pattern_fp8, replacement_fp8, [*inputs, scale]))
            for search, replace, example in regs:
                pm.register_replacement(search, replace, example, pm.fwd_only, patterns,
                                        extra_check=_weight_dtype_matches, skip_duplicates=True)
                count += 1
    return count


def make_pass(config: Any) -> Any:
    """An instance of the pass for vLLM config ``config`` (vLLM's pass classes are imported here,
    so that this module imports without vLLM's compile stack)."""
    import torch._inductor.pattern_matcher as pm
    from vllm.compilation.passes.inductor_pass import enable_fake_mode
    from vllm.compilation.passes.vllm_inductor_pass import VllmInductorPass, VllmPatternMatcherPass
    from vllm.distributed import get_tp_group

    class SollatAllReduceRMSNormPass(VllmPatternMatcherPass):  # type: ignore[misc,valid-type]
        """all_reduce -> fused_add_rms_norm (-> static FP8 quant) -> sollat's fused op."""

        def __init__(self, config: Any) -> None:
            super().__init__(config)
            self.patterns = pm.PatternMatcherPass(pass_name="sollat_allreduce_rmsnorm_pass")
            self.group_name = get_tp_group().unique_name
            dtype = getattr(self, "model_dtype", None)
            self.dtypes = (dtype,) if dtype in core.RMSNORM_DTYPES else tuple(core.RMSNORM_DTYPES)
            self.registered = enable_fake_mode(register_patterns)(self.patterns, self.group_name, self.dtypes,
                                                                  self.device)

        @VllmInductorPass.time_and_log
        def __call__(self, graph: torch.fx.Graph) -> None:
            self.matched_count = self.patterns.apply(graph)

        def uuid(self) -> str:
            return str(VllmInductorPass.hash_dict({"source": VllmInductorPass.hash_source(self, register_patterns),
                                                   "group": self.group_name,
                                                   "dtypes": [str(d) for d in self.dtypes]}))

    return SollatAllReduceRMSNormPass(config)


def wanted(config: Any) -> str | None:
    """None when the pass belongs in this compilation, else why not."""
    from vllm.distributed import parallel_state as ps

    if config.compilation_config.pass_config.fuse_allreduce_rms:
        return "vLLM's own fuse_allreduce_rms is on"
    tp = getattr(ps, "_TP", None)
    if tp is None or tp.world_size < 2:
        return "no tensor-parallel group of 2 or more ranks"
    return None


def add_to(manager: Any, config: Any) -> bool:
    """After ``PostGradPassManager.configure``: insert the pass where vLLM's AllReduce fusion would be."""
    if wanted(config) is not None:
        return False
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(config, check_compile=False):
        _static_quant()  # made while this config is current (QuantFP8 reads it), outside fake mode
        new = make_pass(config)
    at = next((i for i, p in enumerate(manager.passes) if type(p).__name__ in _BEFORE), len(manager.passes))
    manager.passes.insert(at, new)
    return True
