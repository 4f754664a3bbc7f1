"""Live communicators by integer id: how the ``torch.library`` custom ops (``ops.py``) reach the
communicator that a traced call names, without importing the communicator modules."""

from __future__ import annotations

import itertools
import weakref
from typing import Any

from ..errors import SollatError

_registry: dict[int, weakref.ReferenceType[Any]] = {}
_ids = itertools.count(1)


def register(comm: Any) -> int:
    """A new id for ``comm`` (held weakly: the registry never keeps a communicator alive)."""
    comm_id = next(_ids)
    _registry[comm_id] = weakref.ref(comm)
    return comm_id


def lookup_comm(comm_id: int) -> Any:
    ref = _registry.get(comm_id)
    comm = ref() if ref is not None else None
    if comm is None:
        raise SollatError(f"sollat: communicator {comm_id} no longer exists")
    return comm
