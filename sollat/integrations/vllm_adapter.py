"""The sollat adapter of a vLLM group coordinator: what the plugin's patches (``vllm.py``) and the
compile pass's ops (``vllm_pass.py``) both ask for (:func:`adapter`), so neither imports the other's
module for it; and the plugin's logger, a child of vLLM's ``vllm`` logger (``init_logger``), so
its lines carry vLLM's prefix and go where vLLM's own go.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

from . import core, settings
from .log_source import tag_sollat_source

ENGINE = "vLLM"
LOGGER = "vllm.plugins.sollat"
BATCH_INVARIANT_ENV = "VLLM_BATCH_INVARIANT"
_ATTR = "_sollat_adapter"


@functools.cache
def logger() -> logging.Logger:
    from vllm.logger import init_logger

    return tag_sollat_source(init_logger(LOGGER))  # "[sollat/integrations/vllm.py:LINE]", not "[vllm.py:LINE]"


def check_environment() -> None:
    """vLLM's own variable the plugin reads, as vLLM reads it (``vllm.envs``: ``bool(int(value))``);
    a value it cannot read stops the engine (settings.EnvironmentValueError)."""
    import vllm.envs as envs

    raw = os.environ.get(BATCH_INVARIANT_ENV)
    try:
        envs.environment_variables[BATCH_INVARIANT_ENV]()
    except ValueError:
        raise settings.EnvironmentValueError(BATCH_INVARIANT_ENV, str(raw), "an integer, as vLLM reads it "
                                             "(0: off, 1: vLLM's batch-invariant mode, which sollat follows)") from None


def batch_invariant_mode() -> bool:
    """vLLM's batch-invariant mode (``VLLM_BATCH_INVARIANT``) or ``SOLLAT_BATCH_INVARIANT=1``."""
    import vllm.envs as envs

    return bool(envs.VLLM_BATCH_INVARIANT) or core.sollat_batch_invariant_env()


def adapter(group: Any) -> core.GroupAdapter | None:
    """The adapter of vLLM group coordinator ``group`` when it is the tensor-parallel group, else None."""
    found = group.__dict__.get(_ATTR)
    if found is not None:
        return found or None
    from vllm.distributed import parallel_state as ps

    tp = getattr(ps, "_TP", None)
    if tp is None:  # not known yet: decide on a later call
        return None
    made: core.GroupAdapter | bool = False
    if group is tp:
        made = core.GroupAdapter(engine=ENGINE, name=group.unique_name, device_group=group.device_group,
                                 cpu_group=group.cpu_group, device=group.device, world_size=group.world_size,
                                 batch_invariant=batch_invariant_mode(),
                                 max_bytes=settings.engine_max_bytes(),
                                 log=logger())
    group.__dict__[_ATTR] = made
    return made or None
