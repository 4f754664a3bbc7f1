"""The sollat adapter of a vLLM group coordinator: what the plugin's patches (``vllm.py``) and the
compile pass's ops (``vllm_pass.py``) both ask for (:func:`adapter`), so neither imports the other's
module for it.
"""

from __future__ import annotations

import os
from typing import Any

from . import core

ENGINE = "vLLM"
_ATTR = "_sollat_adapter"


def batch_invariant_mode() -> bool:
    """vLLM's batch-invariant mode (``VLLM_BATCH_INVARIANT``) or ``SOLLAT_BATCH_INVARIANT=1``."""
    import vllm.envs as envs

    return bool(envs.VLLM_BATCH_INVARIANT) or core.sollat_batch_invariant_env(os.environ.get(core.BATCH_INVARIANT_ENV))


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
                                 batch_invariant=batch_invariant_mode())
    group.__dict__[_ATTR] = made
    return made or None
