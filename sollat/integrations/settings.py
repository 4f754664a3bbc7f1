"""What the engine plugins read from the environment, and the communicator they build.

The environment is checked once, when the engine loads the plugin, before anything is patched:
a value that is not understood stops the engine with one line that names the variable and the
values it takes (``check_environment``; the engine shims add the engine's own variables). Every
``SOLLAT_*`` variable is checked (``sollat.device.environment``, the library's one parser), so
that no typo can turn a mode off silently, or turn sollat off at the first collective.

The communicator (``communicator_options``) is sized for what the engines send sollat: the
one-shot AllReduce algorithms only (what ``auto`` picks for messages up to the engine limit on
every table sollat ships), the fused RMSNorm regions capped at ENGINE_RMSNORM_MAX_BLOCKS blocks,
no AllGather/ReduceScatter regions (the engines keep those collectives), the real-rank default
blocks per rank. ``scratch_bytes`` gives the symmetric memory per rank that costs
(docs/integrations.md states it for TP 2, 4 and 8).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..collectives.algorithms import ALGORITHMS, RMSNORM_MAX_BLOCKS
from ..collectives.validate import BATCH_INVARIANT_ENV, algorithm_names
from ..comm.state import scratch_bytes_per_rank
from ..device import environment, layout
from ..device.environment import format_bytes
from ..errors import EnvironmentValueError

__all__ = ["BATCH_INVARIANT_ENV", "DEFAULT_MAX_BYTES", "ENGINE_ALGORITHMS", "ENGINE_RMSNORM_MAX_BLOCKS",
           "MAX_BYTES_ENV", "OPT_IN_ENV", "STOPS", "EnvironmentValueError", "Settings", "check_environment",
           "communicator_options", "engine_max_bytes", "format_bytes", "max_message_bytes", "not_understood",
           "opted_in", "plugin_opted_in", "scratch_bytes"]

OPT_IN_ENV = "SOLLAT_ENGINE_PLUGIN"
MAX_BYTES_ENV = "SOLLAT_ENGINE_MAX_BYTES"
#: The largest message sollat serves in an engine by default: a decode step's all-reduce (rows x
#: hidden x dtype, e.g. 64 x 8192 bf16) is at most this; larger ones go to the engine's own path.
DEFAULT_MAX_BYTES = environment.DEFAULT_ENGINE_MAX_BYTES
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
#: What the plugin appends to the error a value not understood raises at start-up.
STOPS = "The engine stops here, before sollat changes anything"


def not_understood(name: str, value: str, allowed: str) -> str:
    return str(EnvironmentValueError(name, value, allowed, consequence=STOPS))


def opted_in(value: str | None) -> bool:
    """``$SOLLAT_ENGINE_PLUGIN``'s text ``value`` (None: unset): off unless ``1`` (the boolean
    grammar of ``sollat.device.environment``); anything else is an error."""
    return bool(environment.value(OPT_IN_ENV, {} if value is None else {OPT_IN_ENV: value}, consequence=STOPS))


def plugin_opted_in() -> bool:
    """``$SOLLAT_ENGINE_PLUGIN`` of this process, as ``opted_in`` reads it."""
    return bool(environment.value(OPT_IN_ENV, consequence=STOPS))


def max_message_bytes(value: str | None) -> int:
    """``$SOLLAT_ENGINE_MAX_BYTES``'s text ``value`` (None: unset): the largest message sollat
    serves in an engine (bytes, or with a KiB, MiB or GiB suffix); unset or empty: DEFAULT_MAX_BYTES."""
    return int(environment.value(MAX_BYTES_ENV, {} if value is None else {MAX_BYTES_ENV: value}, consequence=STOPS))


def engine_max_bytes() -> int:
    """``$SOLLAT_ENGINE_MAX_BYTES`` of this process, as ``max_message_bytes`` reads it."""
    return int(environment.value(MAX_BYTES_ENV, consequence=STOPS))


@dataclass(frozen=True)
class Settings:
    """The plugin's settings from the environment (checked)."""

    batch_invariant: bool  # SOLLAT_BATCH_INVARIANT=1 (the engine's own mode also turns it on)
    max_bytes: int  # SOLLAT_ENGINE_MAX_BYTES


def check_environment(env: Mapping[str, str] | None = None,
                      engine_checks: Callable[[], None] | None = None) -> Settings:
    """Every variable the plugin and its communicator read, checked (``env``: default
    ``os.environ``); ``engine_checks`` checks the engine's own, as the engine reads them. Raises
    EnvironmentValueError on the first value that is not understood."""
    environment.check(env, consequence=STOPS)
    if engine_checks is not None:
        engine_checks()
    return Settings(batch_invariant=environment.flag(BATCH_INVARIANT_ENV, env),
                    max_bytes=int(environment.value(MAX_BYTES_ENV, env)))


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
