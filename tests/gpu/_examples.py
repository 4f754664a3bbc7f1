"""The user-written collectives of examples/ (maxabs_allreduce.py, allgather.py), loaded as the user
would run them: each file on its own, not as part of sollat."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(name: str) -> ModuleType:
    """``examples/<name>.py`` as a module."""
    spec = importlib.util.spec_from_file_location(f"sollat_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
