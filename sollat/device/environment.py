"""Every ``SOLLAT_*`` environment variable sollat reads, and the one parser that reads them.

The same rules hold for every variable (docs/settings.md lists them all):

* surrounding whitespace is stripped, and an empty value means the variable is unset (its default);
* a boolean takes ``0`` (off) or ``1`` (on), nothing else;
* a value that is not understood raises ``EnvironmentValueError``: one line naming the variable,
  the value and the values it takes. Nothing falls back to a default silently.

The library reads a variable where it needs it (``flag``, ``value``); the engine plugins check
every one at start-up (``check``, from ``sollat.integrations.settings.check_environment``).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import EnvironmentValueError
from . import layout

__all__ = ["BOOLEAN", "DEFAULT_CACHE_ROOT", "DEFAULT_ENGINE_MAX_BYTES", "DEFAULT_SETUP_TIMEOUT_S",
           "DEFAULT_TIMEOUT_S", "INTERCONNECTS", "MAX_TIMEOUT_S", "MIN_ENGINE_MAX_BYTES", "VARIABLES",
           "EnvironmentValueError", "Variable", "byte_count", "check", "flag", "format_bytes", "raw", "value"]

DEFAULT_TIMEOUT_S = 30.0
"""Bound of every device spin. Long enough for ordinary skew between ranks (a rank that is
collecting garbage, writing a checkpoint or finishing a torch.compile warm-up while its peers
already wait); first-use compiles never count against it (ranks agree on every new call shape on
the host first). NCCL's own watchdog waits 10 minutes."""
DEFAULT_SETUP_TIMEOUT_S = 600.0
"""Bound of the host-side agreements (construction, first use of a call shape): a peer may be
compiling kernels or still loading a model."""
MAX_TIMEOUT_S = 7 * 24 * 3600.0
BOOLEAN = "0 or 1 (or unset)"
DEFAULT_CACHE_ROOT = "~/.cache/sollat"
#: The smallest engine limit taken, one 16-bit row of hidden size 512: an engine's all-reduce is
#: at least one row of the model's hidden size, and the LLMs served with tensor parallelism have
#: hidden sizes in the thousands, so a smaller limit would leave sollat nothing to serve (a typo,
#: such as a count of KiB without its unit).
MIN_ENGINE_MAX_BYTES = 1 << 10
DEFAULT_ENGINE_MAX_BYTES = 1 << 20
INTERCONNECTS = ("nvlink", "pcie", "any")  # the ``interconnect`` keys of the tuning tables
INNER_BACKENDS = ("nccl", "gloo")  # what the torch.distributed backend hands the calls it does not serve to
DEFAULT_DIST_MAX_COMMUNICATORS = 8
_UNITS = {"": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
_COMMIT = re.compile(r"[A-Za-z0-9._+/-]{1,100}")


class _Bad(ValueError):
    """A value a parser does not take (``check`` and ``value`` turn it into EnvironmentValueError)."""


@dataclass(frozen=True)
class Variable:
    """One variable: its name, the values it takes (as the error and docs/settings.md state them),
    its default (as the docs state it), what it does, and its parser (stripped, non-empty text ->
    the value; raises on anything else)."""

    name: str
    values: str
    default: str
    does: str
    parse: Callable[[str], Any]
    unset: Any = None  # what ``value`` returns when the variable is unset or empty


def _boolean(text: str) -> bool:
    if text not in ("0", "1"):
        raise _Bad(text)
    return text == "1"


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise _Bad(text) from None
    if not math.isfinite(v) or v <= 0 or v > MAX_TIMEOUT_S:
        raise _Bad(text)
    return v


def _max_blocks(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= layout.MAX_BLOCKS_LIMIT:
        raise _Bad(text)
    return int(text)


def byte_count(text: str) -> int:
    """``4096``, ``64KiB``, ``1 MiB`` (suffix case-insensitive) -> bytes; raises ValueError otherwise."""
    m = re.fullmatch(r"(\d+)\s*([kKmMgG]i[bB])?", text)
    if not m:
        raise _Bad(text)
    return int(m.group(1)) * _UNITS[(m.group(2) or "").lower()]


def _engine_max_bytes(text: str) -> int:
    n = byte_count(text)
    if n < MIN_ENGINE_MAX_BYTES:
        raise _Bad(text)
    return n


def _interconnect(text: str) -> str:
    v = text.lower()
    if v not in INTERCONNECTS:
        raise _Bad(text)
    return v


def _inner_backend(text: str) -> str:
    v = text.lower()
    if v not in INNER_BACKENDS:
        raise _Bad(text)
    return v


def _count(text: str) -> int:
    if not text.isdigit():
        raise _Bad(text)
    return int(text)


def _commit(text: str) -> str:
    if not _COMMIT.fullmatch(text):
        raise _Bad(text)
    return text


def _cache_root(text: str) -> Path:
    path = Path(text).expanduser()
    if path.exists():
        if not path.is_dir():
            raise _Bad(text)
    elif not path.parent.is_dir():
        raise _Bad(text)
    return path


def format_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"


def _seconds_values() -> str:
    return f"a number of seconds > 0 and at most {MAX_TIMEOUT_S:g}"


_VARIABLE_LIST = (
    Variable("SOLLAT_ALLOW_PCIE_PEERS", BOOLEAN, "0",
             "1 (on every rank) accepts pairs of GPUs of one host that reach each other over PCIe only",
             _boolean, False),
    Variable("SOLLAT_BATCH_INVARIANT", BOOLEAN, "0",
             "the default of batch_invariant=: 1 turns sollat's batch-invariant mode on "
             "(an engine's own deterministic mode does too)", _boolean, False),
    Variable("SOLLAT_CACHE_DIR", "a directory, or a directory to create in an existing directory",
             DEFAULT_CACHE_ROOT,
             "root of the caches: compiled kernels in cubin/, tuning tables from `sollat tune` in tuning/. "
             "Only the directory itself is created (its parent must exist); the default is created with "
             "its parents", _cache_root),
    Variable("SOLLAT_CLUSTER_RANKS", BOOLEAN, "1",
             "the default of VirtualCommunicator(cluster_ranks=): 0 launches virtual ranks without "
             "thread-block clusters", _boolean, True),
    Variable("SOLLAT_COMMIT", "a commit id or name: letters, digits and . _ + / - (no spaces), "
             "at most 100 characters", "git rev-parse --short HEAD",
             "the commit `sollat bench` writes into its results (wins over git)", _commit),
    Variable("SOLLAT_DIST", BOOLEAN, "0",
             "1 makes an unchanged init_process_group(\"nccl\") come up with the sollat backend serving "
             "the small collectives (docs/torch-distributed.md; tested torch releases only)", _boolean, False),
    Variable("SOLLAT_DIST_INNER", f"{', '.join(INNER_BACKENDS)} (any case)",
             "gloo where two ranks share a GPU or without CUDA, else nccl",
             "the inner backend of the sollat torch.distributed backend: what serves every call sollat "
             "does not", _inner_backend),
    Variable("SOLLAT_DIST_MAX_COMMUNICATORS", "an integer >= 0", str(DEFAULT_DIST_MAX_COMMUNICATORS),
             "the most process groups of one process the sollat torch.distributed backend builds a "
             "communicator (and its scratch) for; a group past it hands every call to its inner backend",
             _count, DEFAULT_DIST_MAX_COMMUNICATORS),
    Variable("SOLLAT_ENGINE_MAX_BYTES",
             f"a whole number of bytes >= {MIN_ENGINE_MAX_BYTES} ({format_bytes(MIN_ENGINE_MAX_BYTES)}), "
             "optionally with KiB, MiB or GiB (e.g. 1MiB)", format_bytes(DEFAULT_ENGINE_MAX_BYTES),
             "the largest all-reduce message sollat serves in an engine; larger ones take the engine's path",
             _engine_max_bytes, DEFAULT_ENGINE_MAX_BYTES),
    Variable("SOLLAT_ENGINE_PLUGIN", BOOLEAN, "0",
             "1 routes a vLLM or SGLang tensor-parallel all-reduce through sollat; 0 leaves the engine "
             "untouched", _boolean, False),
    Variable("SOLLAT_EXPERIMENTAL_RMSNORM_TWOSHOT", BOOLEAN, "0",
             "1 (on every rank) gives a communicator the experimental fused two-shot "
             "(algo=\"rmsnorm_twoshot_sentinel\")", _boolean, False),
    Variable("SOLLAT_INTERCONNECT", f"{', '.join(INTERCONNECTS)} (any case: NVLink is nvlink)",
             "detected (NVML)",
             "the interconnect key of the tuning table algo=\"auto\" uses, instead of the one NVML reports",
             _interconnect),
    Variable("SOLLAT_MAX_BLOCKS", f"an integer 1..{layout.MAX_BLOCKS_LIMIT}",
             "the default of the communicator kind",
             "the default of max_blocks=: blocks per rank a communicator sizes its scratch for", _max_blocks),
    Variable("SOLLAT_SETUP_TIMEOUT_S", _seconds_values(), f"{DEFAULT_SETUP_TIMEOUT_S:g}",
             "how long a Communicator's construction waits for every rank at each step", _seconds,
             DEFAULT_SETUP_TIMEOUT_S),
    Variable("SOLLAT_TIMEOUT_S", _seconds_values(), f"{DEFAULT_TIMEOUT_S:g}",
             "the default of timeout_s=: how long a kernel waits for a peer before it records a fault",
             _seconds, DEFAULT_TIMEOUT_S),
)
VARIABLES: dict[str, Variable] = {v.name: v for v in _VARIABLE_LIST}


def raw(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The variable's text, stripped; None when it is unset or empty."""
    if name not in VARIABLES:
        raise KeyError(f"{name} is not a variable sollat reads (sollat.device.environment.VARIABLES)")
    text = (os.environ if env is None else env).get(name)
    text = None if text is None else text.strip()
    return text or None


def value(name: str, env: Mapping[str, str] | None = None, *, consequence: str = "") -> Any:
    """The variable's value, parsed (its ``unset`` value when unset or empty); raises
    EnvironmentValueError (with ``consequence`` appended) on a value it does not take."""
    var = VARIABLES[name]
    text = raw(name, env)
    if text is None:
        return var.unset
    try:
        return var.parse(text)
    except ValueError:
        original = (os.environ if env is None else env).get(name, "")
        raise EnvironmentValueError(name, original, var.values, consequence=consequence) from None


def flag(name: str, env: Mapping[str, str] | None = None) -> bool:
    """A boolean variable: ``0``/``1``, else its default."""
    if VARIABLES[name].values != BOOLEAN:
        raise KeyError(f"{name} is not a boolean")
    return bool(value(name, env))


def check(env: Mapping[str, str] | None = None, *, consequence: str = "") -> None:
    """Every variable, parsed: raises EnvironmentValueError on the first one not understood."""
    for name in VARIABLES:
        value(name, env, consequence=consequence)
