"""sollat inside serving engines: opt-in plugins for vLLM and SGLang (docs/integrations.md).

``core`` holds everything that runs on the GPU and imports no engine (one sollat communicator per
tensor-parallel group, the rule of which calls sollat serves, the fused AllReduce + RMSNorm entry,
CUDA-graph capture); ``vllm`` and ``sglang`` are thin shims registered as the engines' entry points
(``vllm.general_plugins`` and ``sglang.srt.plugins``, both named ``sollat``) and do nothing unless
``SOLLAT_ENGINE_PLUGIN=1``. Importing this package imports no engine.

``dist_backend`` (with ``dist_router``, ``dist_group`` and ``dist_zero_change``) is the ``sollat``
backend of ``torch.distributed`` (docs/torch-distributed.md), built on the same ``core.GroupAdapter``.
"""

from __future__ import annotations

__all__ = ["core"]

from . import core
