"""sollat in SGLang: the ``sglang.srt.plugins`` entry point (``register``).

With ``SOLLAT_ENGINE_PLUGIN=1`` (and ``sollat`` in ``SGLANG_PLUGINS``, if that is set),
SGLang's ``load_plugins`` calls :func:`register`, which registers an AROUND hook on SGLang's custom
all-reduce factory, ``sglang.srt.distributed.device_communicators.custom_all_reduce.
dispatch_custom_allreduce``; ``HookRegistry.apply_hooks`` installs it. ``GroupCoordinator``
calls the factory for every group that may use a custom all-reduce and constructs what it returns
with ``group=`` (the group's gloo group) and ``device=``. For the tensor-parallel groups
(``tp``, and ``attention_tp`` where DP attention makes it a group of its own) the hook returns
:class:`SollatCustomAllreduce`, which honours the contract GroupCoordinator relies on
(``disabled``, ``should_custom_ar``, ``custom_all_reduce``, ``capture()``, ``close()``):
sollat serves what the rule of ``core.py`` admits, and SGLang's own custom all-reduce (built as
SGLang would have built it) keeps everything else, down to SGLang's NCCL paths when it declines
too. Other groups keep SGLang's class. With ``--enable-deterministic-inference``
(``SGLANG_ENABLE_DETERMINISTIC_INFERENCE``) sollat's communicator is in batch-invariant mode.
Without the opt-in, :func:`register` returns at once and SGLang is untouched.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Iterator
from typing import Any

import torch

from . import core

ENGINE = "SGLang"
TARGET = "sglang.srt.distributed.device_communicators.custom_all_reduce.dispatch_custom_allreduce"
GROUPS = ("tp", "attention_tp")  # the base names of SGLang's tensor-parallel groups
logger = logging.getLogger("sglang.srt.plugins.sollat")
_registered = False


def batch_invariant_mode() -> bool:
    """SGLang's deterministic inference (``--enable-deterministic-inference`` sets
    ``SGLANG_ENABLE_DETERMINISTIC_INFERENCE``) or ``SOLLAT_BATCH_INVARIANT=1``."""
    from sglang.srt.environ import envs

    return bool(envs.SGLANG_ENABLE_DETERMINISTIC_INFERENCE.get()) or core.sollat_batch_invariant_env(
        os.environ.get(core.BATCH_INVARIANT_ENV))


def register() -> None:
    """The entry point: nothing unless ``SOLLAT_ENGINE_PLUGIN=1``; then register the hook once per
    process and say so in one log line. (SGLang logs, and then ignores, an exception raised here:
    a value of the variable that is not understood is reported in the log and leaves SGLang as it is.)"""
    global _registered
    if not core.opted_in(os.environ.get(core.OPT_IN_ENV)) or _registered:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, dispatch_custom_allreduce, HookType.AROUND)
    _registered = True
    logger.info("%s", core.summary(ENGINE, "tensor-parallel custom all-reduce (groups tp, attention_tp)",
                                   batch_invariant_mode()))


def _coordinator_of(cpu_group: Any) -> Any:
    """The GroupCoordinator being built over gloo group ``cpu_group`` (it registers itself by name
    before it builds its communicators)."""
    from sglang.srt.distributed import parallel_state as ps

    for ref in list(ps._groups.values()):
        coordinator = ref()
        if coordinator is not None and getattr(coordinator, "cpu_group", None) is cpu_group:
            return coordinator
    return None


def dispatch_custom_allreduce(original: Any, *args: Any, **kwargs: Any) -> Any:
    """The AROUND hook: SGLang's class for other groups, sollat's in front of it for TP groups."""
    try:
        engine_cls = original(*args, **kwargs)
        engine_error = None
    except Exception as exc:  # GroupCoordinator would have turned it into a warning and no custom AR
        engine_cls, engine_error = None, exc
    group = kwargs.get("group", args[0] if args else None)
    coordinator = _coordinator_of(group)
    if coordinator is None or str(coordinator.unique_name).rsplit(":", 1)[0] not in GROUPS:
        if engine_error is not None:
            raise engine_error
        return engine_cls
    return functools.partial(SollatCustomAllreduce, engine_cls=engine_cls, coordinator=coordinator)


class SollatCustomAllreduce:
    """sollat first, SGLang's custom all-reduce (``engine_ca``) second, for one TP group."""

    def __init__(self, group: Any, device: Any, *, engine_cls: Any, coordinator: Any, **kwargs: Any) -> None:
        self.world_size = int(coordinator.world_size)
        self.adapter = core.GroupAdapter(engine=ENGINE, name=str(coordinator.unique_name),
                                         device_group=coordinator.device_group, cpu_group=group,
                                         device=torch.device(device), world_size=self.world_size,
                                         batch_invariant=batch_invariant_mode())
        self.engine_ca: Any = None
        if engine_cls is not None:
            try:
                self.engine_ca = engine_cls(group=group, device=device, **kwargs)
            except Exception as exc:  # as GroupCoordinator reports its own failure
                logger.warning("sollat: SGLang's own custom all-reduce could not be set up (%s); what sollat "
                               "declines goes to SGLang's NCCL paths", exc)
        self._disabled = False
        self.original_disabled = False
        self._IS_CAPTURING = False
        # Built now, collectively, as SGLang builds its own custom all-reduce in GroupCoordinator.__init__.
        self.adapter.ensure()

    # SGLang's piecewise CUDA-graph runner switches ``disabled`` in place: it applies to both.
    @property
    def disabled(self) -> bool:
        return self._disabled

    @disabled.setter
    def disabled(self, value: bool) -> None:
        self._disabled = bool(value)
        if self.engine_ca is not None and hasattr(self.engine_ca, "disabled"):
            self.engine_ca.disabled = bool(value) or bool(getattr(self.engine_ca, "original_disabled", False))

    def _engine_serves(self, inp: torch.Tensor) -> bool:
        ca = self.engine_ca
        return ca is not None and not ca.disabled and bool(ca.should_custom_ar(inp))

    def should_custom_ar(self, inp: torch.Tensor) -> bool:
        if self._disabled:
            return False
        return self.adapter.serves(inp) or self._engine_serves(inp)

    def custom_all_reduce(self, input: torch.Tensor) -> torch.Tensor | None:
        """The sum over the group (a new tensor), or None when neither sollat nor SGLang's custom
        all-reduce serves it. sollat's call is the real one in a capture, its warm-up and a
        piecewise graph's eager split alike (it needs no registered buffers)."""
        if self._disabled:
            return None
        out = self.adapter.all_reduce(input)
        if out is not None:
            return out
        if self._engine_serves(input):
            return self.engine_ca.custom_all_reduce(input)  # type: ignore[no-any-return]
        return None

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        engine = self.engine_ca.capture() if self.engine_ca is not None else contextlib.nullcontext()
        self._IS_CAPTURING = True
        try:
            with self.adapter.capture(), engine:
                yield
        finally:
            self._IS_CAPTURING = False

    def close(self) -> None:
        if self.engine_ca is not None and hasattr(self.engine_ca, "close"):
            self.engine_ca.close()

    def __getattr__(self, name: str) -> Any:
        # Anything else SGLang asks of its custom all-reduce (custom all-gather, ...) stays SGLang's.
        engine = self.__dict__.get("engine_ca")
        if engine is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(engine, name)
