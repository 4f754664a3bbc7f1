"""sollat in vLLM: the ``vllm.general_plugins`` entry point (``register``).

With ``SOLLAT_ENGINE_PLUGIN=1`` (and ``sollat`` allowed by ``VLLM_PLUGINS``, if that is set),
vLLM's loader calls :func:`register` in every process, which patches three places of vLLM 0.33:

* ``GroupCoordinator._all_reduce_out_place``, where the CPU and CUDA paths meet and what the
  ``vllm.all_reduce`` custom op calls under ``torch.compile``: for the tensor-parallel group, the
  call goes to the group's :class:`~sollat.integrations.core.GroupAdapter` (sollat where the rule
  of ``core.py`` admits it), everything else to vLLM's own path, unchanged;
* ``GroupCoordinator.graph_capture``: enters the adapter's ``capture()`` (the communicator is
  built before the capture starts);
* ``PostGradPassManager.configure``: where vLLM's own ``fuse_allreduce_rms`` is off, adds
  ``vllm_pass.SollatAllReduceRMSNormPass`` at the place vLLM's AllReduce fusion takes.

Under ``VLLM_BATCH_INVARIANT=1`` the adapter's communicator is built in sollat's batch-invariant mode.
Without the opt-in, :func:`register` returns at once and vLLM is untouched. With it, every variable
the plugin reads (sollat's, ``settings.check_environment``, and ``VLLM_BATCH_INVARIANT``) is
checked first: a value that is not understood raises ``settings.EnvironmentValueError`` (one line:
the variable and the values it takes), which vLLM's loader lets through, so vLLM stops at start-up
before anything is patched. The plugin logs through vLLM's logger (``vllm_adapter.logger``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from . import core, settings
from .vllm_adapter import ENGINE, adapter, batch_invariant_mode, check_environment, logger

__all__ = ["ENGINE", "adapter", "batch_invariant_mode", "register", "summary_line"]

_installed = False


def summary_line(batch_invariant: bool, max_bytes: int) -> str:
    """The one line ``register`` logs (docs/integrations.md shows it)."""
    return core.summary(ENGINE, "tensor-parallel all_reduce", batch_invariant, max_bytes,
                        "; compile pass all_reduce + fused_add_rms_norm (+ static FP8 quant) -> sollat's fused op "
                        "where fuse_allreduce_rms is off")


def register() -> None:
    """The entry point: nothing unless ``SOLLAT_ENGINE_PLUGIN=1``; then patch once per process and
    say so in one log line."""
    global _installed
    if not settings.plugin_opted_in() or _installed:
        return
    found = settings.check_environment(engine_checks=check_environment)  # before anything is patched
    from vllm.compilation.passes.pass_manager import PostGradPassManager
    from vllm.distributed.parallel_state import GroupCoordinator

    from . import vllm_pass  # noqa: F401  (registers the sollat_vllm ops before any graph, cached or new, names them)

    _wrap(GroupCoordinator, "_all_reduce_out_place", _all_reduce_out_place)
    _wrap(GroupCoordinator, "graph_capture", _graph_capture)
    _wrap(PostGradPassManager, "configure", _configure)
    _installed = True
    logger().info("%s", summary_line(batch_invariant_mode(), found.max_bytes))


def _wrap(cls: type, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    original = cls.__dict__[name]
    wrapped = make(original)
    wrapped.__wrapped__ = original  # type: ignore[attr-defined]
    wrapped.sollat_patch = True  # type: ignore[attr-defined]
    setattr(cls, name, wrapped)


def _all_reduce_out_place(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def all_reduce_out_place(self: Any, input_: Any) -> Any:
        ad = adapter(self)
        if ad is not None:
            out = ad.all_reduce(input_)
            if out is not None:
                return out
        return original(self, input_)

    return all_reduce_out_place


def _graph_capture(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    @contextlib.contextmanager
    def graph_capture(self: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        ad = adapter(self)
        with ad.capture() if ad is not None else contextlib.nullcontext(), original(self, *args, **kwargs) as ctx:
            yield ctx

    return graph_capture


def _configure(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def configure(self: Any, config: Any) -> None:
        original(self, config)
        from . import vllm_pass

        vllm_pass.add_to(self, config)

    return configure
