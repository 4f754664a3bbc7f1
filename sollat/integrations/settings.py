"""What the engine plugins read from the environment, and the communicator they build.

The environment is checked once, when the engine loads the plugin, before anything is patched:
a value that is not understood stops the engine with one line that names the variable and the
values it takes (``check_environment``; the engine shims add the engine's own variables). Every
variable the plugin or the communicator it builds reads is checked, so that no typo can turn a
mode off silently, or turn sollat off at the first collective.

The communicator (``communicator_options``) is sized for what the engines send sollat: the
one-shot AllReduce algorithms only (what ``auto`` picks for messages up to the engine limit on
every table sollat ships), the fused RMSNorm regions capped at ENGINE_RMSNORM_MAX_BLOCKS blocks,
no AllGather/ReduceScatter regions (the engines keep those collectives), the real-rank default
blocks per rank. ``scratch_bytes`` gives the symmetric memory per rank that costs
(docs/integrations.md states it for TP 2, 4 and 8).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..collectives.algorithms import ALGORITHMS, RMSNORM_MAX_BLOCKS, RMSNORM_TWOSHOT_ENV
from ..collectives.validate import BATCH_INVARIANT_ENV, algorithm_names, checked_max_blocks
from ..comm.state import scratch_bytes_per_rank
from ..device import faults, layout, topology
from ..errors import UnsupportedError

__all__ = ["BATCH_INVARIANT_ENV", "DEFAULT_MAX_BYTES", "ENGINE_ALGORITHMS", "ENGINE_RMSNORM_MAX_BLOCKS",
           "MAX_BYTES_ENV", "OPT_IN_ENV", "EnvironmentValueError", "Settings", "check_environment",
           "communicator_options", "format_bytes", "max_message_bytes", "not_understood", "opted_in",
           "scratch_bytes"]

OPT_IN_ENV = "SOLLAT_ENGINE_PLUGIN"
MAX_BYTES_ENV = "SOLLAT_ENGINE_MAX_BYTES"
#: The largest message sollat serves in an engine by default: a decode step's all-reduce (rows x
#: hidden x dtype, e.g. 64 x 8192 bf16) is at most this; larger ones go to the engine's own path.
DEFAULT_MAX_BYTES = 1 << 20
#: The AllReduce algorithms an engine's communicator has (those of them that run at its world
#: size): ``auto`` picks one of these for every message up to 1 MiB on the tables sollat ships for
#: an H200, except the generic table's two-shot at exactly 1 MiB (3 to 8 ranks), where the table's
#: next rule, the one-shot sentinel, serves it (tests/cpu/test_integrations_core.py lists it); every
#: one of them is deterministic (rank-order sum), so that swap changes no bit.
ENGINE_ALGORITHMS: tuple[str, ...] = ("oneshot_ll", "oneshot_sentinel", "oneshot_ll_wide")
#: Blocks per rank of the fused RMSNorm regions: the fused one-shot's row clusters are at most
#: abi.RMSNORM_MAX_ROW_BLOCKS (8) blocks wide and ``auto`` fuses at most two rows, so a fused call
#: ``auto`` makes never needs more; half the algorithms' own RMSNORM_MAX_BLOCKS.
ENGINE_RMSNORM_MAX_BLOCKS = RMSNORM_MAX_BLOCKS // 2
_UNITS = {"": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
_FLAG = "0 or 1 (or unset)"


class EnvironmentValueError(UnsupportedError):
    """An environment variable the plugin reads has a value it does not understand (the message
    is one line: the variable, its value, the values it takes)."""

    def __init__(self, name: str, value: str, allowed: str) -> None:
        super().__init__(not_understood(name, value, allowed))
        self.name = name
        self.value = value


def not_understood(name: str, value: str, allowed: str) -> str:
    return (f"sollat: {name}={value!r} is not understood; it takes {allowed}. The engine stops here, "
            "before sollat changes anything")


def opted_in(value: str | None) -> bool:
    """``$SOLLAT_ENGINE_PLUGIN``: unset, empty or ``0``: off; ``1``: on; anything else is an error."""
    v = "" if value is None else value.strip()
    if v in ("", "0"):
        return False
    if v == "1":
        return True
    raise EnvironmentValueError(OPT_IN_ENV, str(value), f"{_FLAG}: 1 routes the engine's tensor-parallel "
                                "all-reduce through sollat, 0 leaves the engine untouched")


def max_message_bytes(value: str | None) -> int:
    """``$SOLLAT_ENGINE_MAX_BYTES``: the largest message sollat serves in an engine (bytes, or
    with a KiB, MiB or GiB suffix); unset or empty: DEFAULT_MAX_BYTES."""
    v = "" if value is None else value.strip()
    if not v:
        return DEFAULT_MAX_BYTES
    m = re.fullmatch(r"(\d+)\s*([kKmMgG]i[bB])?", v)
    n = int(m.group(1)) * _UNITS[(m.group(2) or "").lower()] if m else 0
    if n < 1:
        raise EnvironmentValueError(MAX_BYTES_ENV, str(value), "a whole number of bytes >= 1, optionally with "
                                    f"KiB, MiB or GiB (e.g. 1MiB; unset: {format_bytes(DEFAULT_MAX_BYTES)})")
    return n


def format_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"


@dataclass(frozen=True)
class Settings:
    """The plugin's settings from the environment (checked)."""

    batch_invariant: bool  # SOLLAT_BATCH_INVARIANT=1 (the engine's own mode also turns it on)
    max_bytes: int  # SOLLAT_ENGINE_MAX_BYTES


def _flag(env: Mapping[str, str], name: str, strip: bool = False) -> None:
    raw = env.get(name)
    if raw is not None and (raw.strip() if strip else raw) not in ("", "0", "1"):
        raise EnvironmentValueError(name, raw, _FLAG)


def _timeout(env: Mapping[str, str], name: str, default: float) -> None:
    raw = env.get(name)
    if raw is None:
        return
    try:
        faults.validated_timeout(float(raw), what=name, env=name, default=default)
    except (ValueError, UnsupportedError):
        raise EnvironmentValueError(name, raw, f"a number of seconds > 0 and at most {faults.MAX_TIMEOUT_S:g} "
                                    f"(unset: {default:g})") from None


def _max_blocks(env: Mapping[str, str]) -> None:
    raw = env.get("SOLLAT_MAX_BLOCKS")
    if not raw:  # unset or empty: the default (validate.checked_max_blocks)
        return
    try:
        checked_max_blocks(int(raw), "sollat", default=0)
    except (ValueError, UnsupportedError):
        raise EnvironmentValueError("SOLLAT_MAX_BLOCKS", raw, f"an integer 1..{layout.MAX_BLOCKS_LIMIT} "
                                    "(unset: the real-rank default for the world size)") from None


def check_environment(env: Mapping[str, str] | None = None,
                      engine_checks: Callable[[], None] | None = None) -> Settings:
    """Every variable the plugin and its communicator read, checked (``env``: default
    ``os.environ``); ``engine_checks`` checks the engine's own, as the engine reads them. Raises
    EnvironmentValueError on the first value that is not understood."""
    import os

    env = os.environ if env is None else env
    opted_in(env.get(OPT_IN_ENV))
    raw = env.get(BATCH_INVARIANT_ENV)
    if raw is not None and raw not in ("", "0", "1"):  # what validate.checked_batch_invariant accepts
        raise EnvironmentValueError(BATCH_INVARIANT_ENV, raw, f"{_FLAG}: 1 turns sollat's batch-invariant "
                                    "mode on (the engine's own deterministic mode does too)")
    max_bytes = max_message_bytes(env.get(MAX_BYTES_ENV))
    _timeout(env, "SOLLAT_TIMEOUT_S", faults.DEFAULT_TIMEOUT_S)
    _timeout(env, "SOLLAT_SETUP_TIMEOUT_S", faults.DEFAULT_SETUP_TIMEOUT_S)
    _max_blocks(env)
    _flag(env, RMSNORM_TWOSHOT_ENV)
    _flag(env, topology.ALLOW_PCIE_ENV, strip=True)
    if engine_checks is not None:
        engine_checks()
    return Settings(batch_invariant=env.get(BATCH_INVARIANT_ENV) == "1", max_bytes=max_bytes)


# ---- the communicator an engine builds -------------------------------------------------------------
def communicator_options(world_size: int) -> dict[str, Any]:
    """``sollat.Communicator`` keyword arguments for an engine's tensor-parallel group."""
    return {"algorithms": tuple(n for n in ENGINE_ALGORITHMS if ALGORITHMS[n].runs_on(world_size)),
            "gather_scatter": False, "rmsnorm_max_blocks": ENGINE_RMSNORM_MAX_BLOCKS}


def scratch_bytes(world_size: int, sms: int | None = None) -> int:
    """Symmetric scratch per rank of an engine's communicator of ``world_size`` ranks, on a GPU of
    ``sms`` SMs (None: enough for the real-rank default blocks; ``$SOLLAT_MAX_BLOCKS`` changes
    it), as ``Communicator`` allocates it."""
    opts = communicator_options(world_size)
    blocks = layout.default_max_blocks_real(world_size)
    if sms is not None:
        blocks = min(sms, blocks)
    names = algorithm_names(opts["algorithms"], world_size, "sollat")
    return scratch_bytes_per_rank(world_size, names, blocks, (), opts["gather_scatter"], opts["rmsnorm_max_blocks"])
