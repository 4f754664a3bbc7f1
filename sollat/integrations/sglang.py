"""sollat in SGLang: the ``sglang.srt.plugins`` entry point (``register``).

With ``SOLLAT_ENGINE_PLUGIN=1`` (and ``sollat`` in ``SGLANG_PLUGINS``, if that is set),
SGLang's ``load_plugins`` calls :func:`register`, which registers an AROUND hook on SGLang's custom
all-reduce factory, ``sglang.srt.distributed.device_communicators.custom_all_reduce.
dispatch_custom_allreduce``; ``HookRegistry.apply_hooks`` installs it. ``GroupCoordinator``
calls the factory for every group that may use a custom all-reduce and constructs what it returns
with ``group=`` (the group's gloo group) and ``device=``. For the tensor-parallel groups
(``tp``, and ``attention_tp`` where DP attention makes it a group of its own) the hook builds
SGLang's own custom all-reduce as SGLang would, with sollat in front of it:

* where SGLang's object is built and enabled, it is an instance of SGLang's own class (a subclass
  of it that routes the calls the rule of ``core.py`` admits to sollat, :func:`routing_class`),
  so every SGLang feature that checks ``isinstance(comm, CustomAllReduceV2)`` and reads its
  state (the K3 SP collective, the custom all-gather, the K3 fused AllReduce + RMSNorm, the DP
  attention buffer) keeps working on SGLang's own buffers;
* where SGLang has none (its factory raised, or its object came up disabled: no NVLink, a world
  size it does not support, no CUDA), :class:`SollatCustomAllreduce` serves what sollat admits
  and keeps the contract GroupCoordinator relies on (``disabled``, ``should_custom_ar``,
  ``custom_all_reduce``, ``capture()``, ``close()``); those features are off, as they would be
  without the plugin.

What sollat declines goes to SGLang's custom all-reduce, then to SGLang's NCCL paths. Other
groups keep SGLang's class. With ``--enable-deterministic-inference``
(``SGLANG_ENABLE_DETERMINISTIC_INFERENCE``) sollat's communicator is in batch-invariant mode.
Without the opt-in, :func:`register` returns at once and SGLang is untouched. With it, every
variable the plugin reads is checked first; SGLang's loader logs a plugin's exception and goes on
without it, so a value that is not understood raises ``SystemExit`` with one line (the variable
and the values it takes): SGLang stops at start-up, before anything is hooked.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Iterator
from typing import Any

import torch

from . import core, settings

ENGINE = "SGLang"
TARGET = "sglang.srt.distributed.device_communicators.custom_all_reduce.dispatch_custom_allreduce"
GROUPS = ("tp", "attention_tp")  # the base names of SGLang's tensor-parallel groups
DETERMINISTIC_ENV = "SGLANG_ENABLE_DETERMINISTIC_INFERENCE"
logger = logging.getLogger("sglang.srt.plugins.sollat")  # under "sglang": SGLang's log set-up prints it
_registered = False


def batch_invariant_mode() -> bool:
    """SGLang's deterministic inference (``--enable-deterministic-inference`` sets
    ``SGLANG_ENABLE_DETERMINISTIC_INFERENCE``) or ``SOLLAT_BATCH_INVARIANT=1``."""
    from sglang.srt.environ import envs

    return bool(envs.SGLANG_ENABLE_DETERMINISTIC_INFERENCE.get()) or core.sollat_batch_invariant_env()


def check_environment() -> None:
    """SGLang's own variable the plugin reads, with SGLang's parser (which, left to itself, warns
    and uses the default for a value it cannot read)."""
    from sglang.srt.environ import envs

    raw = os.environ.get(DETERMINISTIC_ENV)
    if raw is None:
        return
    try:
        envs.SGLANG_ENABLE_DETERMINISTIC_INFERENCE.parse(raw)
    except ValueError:
        raise settings.EnvironmentValueError(DETERMINISTIC_ENV, raw, "true, 1, yes, y or false, 0, no, n (any "
                                             "case), as SGLang reads it") from None


def summary_line(batch_invariant: bool, max_bytes: int) -> str:
    """The one line ``register`` logs (docs/integrations.md shows it)."""
    return core.summary(ENGINE, "tensor-parallel custom all-reduce (groups tp, attention_tp)", batch_invariant,
                        max_bytes, "; SGLang's own custom all-reduce stays in place behind it (its features that "
                        "check for CustomAllReduceV2 stay on)")


def register() -> None:
    """The entry point: nothing unless ``SOLLAT_ENGINE_PLUGIN=1``; then check the environment,
    register the hook once per process and say so in one log line."""
    global _registered
    try:
        if not settings.plugin_opted_in() or _registered:
            return
        found = settings.check_environment(engine_checks=check_environment)
    except settings.EnvironmentValueError as exc:
        raise SystemExit(str(exc)) from None
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, dispatch_custom_allreduce, HookType.AROUND)
    _registered = True
    logger.info("%s", summary_line(batch_invariant_mode(), found.max_bytes))


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
    return functools.partial(custom_allreduce, engine_cls=engine_cls, coordinator=coordinator)


def custom_allreduce(group: Any, device: Any, *, engine_cls: Any, coordinator: Any, **kwargs: Any) -> Any:
    """What GroupCoordinator gets for a TP group: SGLang's own object with sollat in front (an
    instance of SGLang's class) where SGLang built one, else :class:`SollatCustomAllreduce`.
    Collective, as SGLang's own construction is: SGLang's object first, then sollat's
    communicator, on every rank."""
    adapter = core.GroupAdapter(engine=ENGINE, name=str(coordinator.unique_name),
                                device_group=coordinator.device_group, cpu_group=group,
                                device=torch.device(device), world_size=int(coordinator.world_size),
                                batch_invariant=batch_invariant_mode(),
                                max_bytes=settings.engine_max_bytes(),
                                log=logger)
    engine_ca: Any = None
    if engine_cls is not None:
        cls = routing_class(engine_cls) if isinstance(engine_cls, type) else engine_cls
        try:
            engine_ca = cls(group=group, device=device, **kwargs)
        except Exception as exc:  # as GroupCoordinator reports its own failure
            logger.warning("sollat: SGLang's own custom all-reduce could not be set up (%s); what sollat "
                           "declines goes to SGLang's NCCL paths", exc)
    ca: Any
    if isinstance(engine_ca, _SollatRouting) and not engine_ca.disabled:
        engine_ca.sollat_adapter = adapter
        ca = engine_ca
    else:
        ca = SollatCustomAllreduce(adapter, engine_ca)
    adapter.ensure()  # built now, collectively, as SGLang builds its own in GroupCoordinator.__init__
    return ca


class _SollatRouting:
    """sollat in front of SGLang's own custom all-reduce, mixed into a subclass of SGLang's class
    (``routing_class``): the object is SGLang's, with SGLang's state and ``disabled`` flag (which
    SGLang's piecewise CUDA-graph runner switches in place, for both); only the all-reduce entry
    points ask sollat first. Without ``sollat_adapter`` it is SGLang's object unchanged."""

    sollat_adapter: core.GroupAdapter | None = None

    def should_custom_ar(self, inp: torch.Tensor) -> bool:
        ad = self.sollat_adapter
        if ad is not None and not self.disabled and ad.serves(inp):  # type: ignore[attr-defined]
            return True
        return bool(super().should_custom_ar(inp))  # type: ignore[misc]

    def custom_all_reduce(self, input: torch.Tensor) -> torch.Tensor | None:
        ad = self.sollat_adapter
        if ad is not None and not self.disabled:  # type: ignore[attr-defined]
            out = ad.all_reduce(input)
            if out is not None:
                return out
        return super().custom_all_reduce(input)  # type: ignore[misc,no-any-return]

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        ad = self.sollat_adapter
        with ad.capture() if ad is not None else contextlib.nullcontext(), super().capture():  # type: ignore[misc]
            yield


@functools.cache
def routing_class(engine_cls: type) -> type:
    """A subclass of SGLang's custom all-reduce class with sollat in front (``_SollatRouting``):
    ``isinstance`` against SGLang's class holds for its objects."""
    return type(f"Sollat{engine_cls.__name__}", (_SollatRouting, engine_cls), {"__module__": __name__})


class SollatCustomAllreduce:
    """sollat first, then SGLang's custom all-reduce object ``engine_ca`` if any (one that came up
    disabled, or None), for one TP group where SGLang has no working custom all-reduce of its own."""

    def __init__(self, adapter: core.GroupAdapter, engine_ca: Any = None) -> None:
        self.sollat_adapter = adapter
        self.world_size = adapter.world_size
        self.engine_ca = engine_ca
        self._disabled = False
        self.original_disabled = False
        self._IS_CAPTURING = False

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
        return self.sollat_adapter.serves(inp) or self._engine_serves(inp)

    def custom_all_reduce(self, input: torch.Tensor) -> torch.Tensor | None:
        """The sum over the group (a new tensor), or None when neither sollat nor SGLang's custom
        all-reduce serves it. sollat's call is the real one in a capture, its warm-up and a
        piecewise graph's eager split alike (it needs no registered buffers)."""
        if self._disabled:
            return None
        out = self.sollat_adapter.all_reduce(input)
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
            with self.sollat_adapter.capture(), engine:
                yield
        finally:
            self._IS_CAPTURING = False

    def close(self) -> None:
        if self.engine_ca is not None and hasattr(self.engine_ca, "close"):
            self.engine_ca.close()

    def __getattr__(self, name: str) -> Any:
        # Anything else SGLang asks of its custom all-reduce stays SGLang's object's (if any).
        engine = self.__dict__.get("engine_ca")
        if engine is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(engine, name)
