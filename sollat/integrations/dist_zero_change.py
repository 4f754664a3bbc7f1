"""``SOLLAT_DIST=1``: an unchanged ``init_process_group("nccl")`` comes up as a sollat group
(docs/torch-distributed.md, the zero-change mode). Opt-in, and only on the torch versions listed in
TESTED_TORCH, because it rests on private torch names:

* ``torch.distributed.distributed_c10d._new_process_group_helper``, the function every group
  (``init_process_group``, ``new_group``, DeviceMesh) is built by: wrapped so that a group asked
  for with the backend ``nccl`` is built with ``cuda:sollat`` (whose inner backend is NCCL) instead;
* ``torch.distributed.distributed_c10d._world.pg_map`` and ``pg_backend_config``: the group's entries
  are set back to what was asked for, so ``get_backend()`` still says ``nccl``.

The mode starts from the ``torch.backends`` entry point (``sollat_dist_autoload.autoload``), which
torch runs at ``import torch`` (unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``), or from :func:`enable`.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

from ..errors import UnsupportedError
from . import dist_backend

ENV = "SOLLAT_DIST"
#: torch releases (major.minor) whose private names above this mode was run against.
TESTED_TORCH = ("2.11", "2.13", "2.14")
DEFAULT_REWRITES = {"nccl": "cuda:sollat"}

_original: Any = None


def torch_release() -> str:
    return ".".join(torch.__version__.split("+")[0].split(".")[:2])


def enabled() -> bool:
    """Whether the mode is on in this process."""
    return _original is not None


def enable(rewrites: dict[str, str] | None = None) -> None:
    """Turn the mode on (idempotent): a group asked for with a backend in ``rewrites`` (default:
    ``nccl`` -> ``cuda:sollat``) is built with the sollat backend string instead. Raises
    UnsupportedError on a torch release outside TESTED_TORCH, or where the private names differ."""
    global _original
    import torch.distributed.distributed_c10d as c10d

    release = torch_release()
    if release not in TESTED_TORCH:
        raise UnsupportedError(f"${ENV}=1: the zero-change mode rests on private torch names and was tested on torch "
                               f"{', '.join(TESTED_TORCH)}, not {torch.__version__}; unset {ENV} and name the backend "
                               "instead: init_process_group('cpu:gloo,cuda:sollat')")
    if _original is not None:
        return
    helper = getattr(c10d, "_new_process_group_helper", None)
    world = getattr(c10d, "_world", None)
    params = list(inspect.signature(helper).parameters) if helper is not None else []
    if params[3:5] != ["backend", "store"] or not hasattr(world, "pg_map") or not hasattr(world, "pg_backend_config"):
        raise UnsupportedError(f"${ENV}=1: torch {torch.__version__} has no _new_process_group_helper(..., backend, "
                               "store, ...) or _world.pg_map; name the backend instead: "
                               "init_process_group('cpu:gloo,cuda:sollat')")
    table = {k.lower(): v for k, v in (rewrites or DEFAULT_REWRITES).items()}
    dist_backend.register()

    @functools.wraps(helper)
    def built(*args: Any, **kwargs: Any) -> Any:
        args_l = list(args)
        asked = kwargs["backend"] if "backend" in kwargs else args_l[3]
        swap = table.get(str(asked).lower())
        if swap is None:
            return helper(*args, **kwargs)
        if "backend" in kwargs:
            kwargs["backend"] = swap
        else:
            args_l[3] = swap
        pg, store = helper(*args_l, **kwargs)
        if pg in world.pg_map:  # a member of the group: it answers get_backend() as asked
            world.pg_map[pg] = (asked, world.pg_map[pg][1])
            world.pg_backend_config[pg] = str(c10d.BackendConfig(c10d.Backend(asked)))
        return pg, store

    c10d._new_process_group_helper = built
    _original = helper


def disable() -> None:
    """Turn the mode off (groups built meanwhile stay sollat groups)."""
    global _original
    import torch.distributed.distributed_c10d as c10d

    if _original is not None:
        c10d._new_process_group_helper = _original
        _original = None
