"""The engine integration tests run the real vLLM / SGLang in subprocesses (their imports are
heavy and patch process state), with the Python ``$SOLLAT_ENGINE_PYTHON`` names (default: this
one). Where that Python has no vLLM or SGLang the tests skip, unless ``$SOLLAT_REQUIRE_ENGINES=1``
(CI sets it), which turns the skip into a failure."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
# Variables of the engines and of the plugin that the workers set themselves.
_CLEARED = ("SOLLAT_ENGINE_PLUGIN", "SOLLAT_BATCH_INVARIANT", "VLLM_PLUGINS", "SGLANG_PLUGINS",
            "VLLM_BATCH_INVARIANT", "SGLANG_ENABLE_DETERMINISTIC_INFERENCE")


def engine_python() -> str:
    return os.environ.get("SOLLAT_ENGINE_PYTHON") or sys.executable


@functools.cache
def _has(module: str) -> str | None:
    """None when the engine Python can import ``module``'s package, else why not."""
    code = f"import importlib.util as u, sys; sys.exit(0 if u.find_spec({module!r}) else 3)"
    try:
        rc = subprocess.run([engine_python(), "-c", code], capture_output=True, timeout=60).returncode
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{engine_python()} cannot run: {exc}"
    return None if rc == 0 else f"{module} is not installed for {engine_python()}"


def need(module: str) -> None:
    why = _has(module)
    if why is None:
        return
    if os.environ.get("SOLLAT_REQUIRE_ENGINES") == "1":
        pytest.fail(f"SOLLAT_REQUIRE_ENGINES=1 but {why} (.ci/run installs vLLM and SGLang)")
    pytest.skip(why)


def run_worker(script: str, mode: str, tmp_path: Path, env: dict[str, str] | None = None,
               timeout_s: int = 400) -> dict[int, dict[str, Any]]:
    """Run ``script MODE OUT`` with the engine Python and this checkout first on the path; each
    process's JSON by rank."""
    full = {k: v for k, v in os.environ.items() if k not in _CLEARED}
    full.update({"PYTHONPATH": os.pathsep.join([str(ROOT), full.get("PYTHONPATH", "")]).rstrip(os.pathsep),
                 "VLLM_TARGET_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false",
                 **(env or {})})
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run([engine_python(), str(HERE / script), mode, str(out)], env=full, cwd=tmp_path,
                          capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        pytest.fail(f"{script} {mode} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return {int(p.stem): json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}
