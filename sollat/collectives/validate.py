"""Argument checks shared by both communicators: each says what was wrong and what is
supported, and every one runs before the GPU is looked for (so a bad argument is reported as such
on any machine)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..device import environment, faults, layout
from ..errors import UnsupportedError
from . import algorithms, select
from .algorithms import ALGORITHMS, Algorithm


def timeout(value: object) -> float:
    """``timeout_s=`` as given, else ``$SOLLAT_TIMEOUT_S``, else 30 s; validated."""
    return faults.validated_timeout(value, what="timeout_s", env="SOLLAT_TIMEOUT_S", default=faults.DEFAULT_TIMEOUT_S)


def default_timeout_s() -> float:
    """``$SOLLAT_TIMEOUT_S`` or 30 s (see faults.DEFAULT_TIMEOUT_S for why)."""
    return timeout(None)


def get_alg(name: str) -> Algorithm:
    return algorithms.get(name)


def check_world_size(world_size: object, who: str) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise UnsupportedError(f"{who}: world_size must be an int, got {world_size!r}")
    if not 2 <= world_size <= layout.MAX_RANKS:
        raise UnsupportedError(f"{who}: world_size must be 2..{layout.MAX_RANKS}, got {world_size}")


#: Values of ``algo=`` at call time that are not sollat algorithms: ``"auto"`` (the tuning table's
#: choice) and the library paths a ``Communicator`` hands a call to (``select.HANDOVERS``).
CALL_TIME_ALGOS = ("auto", *select.HANDOVERS)


def checked_algorithm_names(names: object, who: str) -> tuple[str, ...] | None:
    """``algorithms=`` of a communicator, checked without a world size: None (every algorithm
    that runs at the communicator's size), or a non-empty list of sollat AllReduce algorithm names.
    A name that is a value of ``algo=`` rather than an algorithm (``"auto"``, ``"nccl"``,
    ``"torch_twoshot"``) gets an error saying so: those need no enabling."""
    if names is None:
        return None
    known = ", ".join(ALGORITHMS)
    if isinstance(names, (str, bytes)) or not isinstance(names, Sequence):
        raise UnsupportedError(f"{who}: algorithms must be a list of sollat algorithm names ({known}), "
                               f"got {names!r}")
    out = tuple(names)
    if not out:
        raise UnsupportedError(f"{who}: algorithms must name at least one of {known}")
    for name in out:
        if name in CALL_TIME_ALGOS:
            raise UnsupportedError(
                f"{who}: algorithms= enables sollat's own AllReduce algorithms ({known}); {name!r} is not one "
                f"of them but a value of algo= at call time (all_reduce(x, algo={name!r})), which needs no "
                "enabling. Leave algorithms=None to enable every algorithm.")
        if name not in ALGORITHMS:
            raise UnsupportedError(f"{who}: algorithms names an unknown algorithm {name!r}; "
                                   f"sollat's AllReduce algorithms: {known}")
    return out


def algorithm_names(names: Sequence[str] | None, world_size: int = 2, who: str = "Communicator") -> tuple[str, ...]:
    """The AllReduce algorithms a communicator of ``world_size`` ranks enables: ``names`` (each
    must run at that size), or by default every algorithm that does (Algorithm.runs_on: LL128
    and the bulk two-shot stop at abi.PEER_WINDOW ranks, the wide one-shot starts above it)."""
    out = checked_algorithm_names(names, who)
    if out is None:
        return tuple(n for n, a in ALGORITHMS.items() if a.runs_on(world_size))
    for a in out:
        get_alg(a).check_world(world_size, who)
    return out


def checked_group(group: object, who: str) -> None:
    """``group=`` of a Communicator: None (the default process group) or a
    ``torch.distributed.ProcessGroup``; anything else (a name, a list of ranks) is an error."""
    import torch.distributed as dist

    if group is None:
        return
    if not dist.is_available() or not isinstance(group, dist.ProcessGroup):
        raise UnsupportedError(f"{who}: group must be a torch.distributed.ProcessGroup (for example from "
                               f"dist.new_group(ranks)) or None for the default group, got {group!r} "
                               f"({type(group).__name__})")


def checked_max_blocks(value: object, who: str, *, default: int) -> int:
    """``max_blocks=`` as given, else ``$SOLLAT_MAX_BLOCKS``, else ``default``: the blocks per rank
    a communicator sizes its scratch for (larger messages then run in fewer in-kernel passes)."""
    if value is None:
        from_env = environment.value("SOLLAT_MAX_BLOCKS")
        return default if from_env is None else int(from_env)
    src = "max_blocks"
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= layout.MAX_BLOCKS_LIMIT:
        raise UnsupportedError(f"{who}: {src} must be an integer 1..{layout.MAX_BLOCKS_LIMIT}, got {value!r}")
    return value


def checked_flag(value: object, what: str, who: str) -> bool:
    if not isinstance(value, bool):
        raise UnsupportedError(f"{who}: {what} must be True or False, got {value!r}")
    return value


BATCH_INVARIANT_ENV = "SOLLAT_BATCH_INVARIANT"


def checked_batch_invariant(value: object, who: str) -> bool:
    """``batch_invariant=`` as given (True or False), else ``$SOLLAT_BATCH_INVARIANT``: ``1`` on,
    ``0`` or unset off; any other value is an error (a typo must not silently turn the guarantee
    off; ``sollat.device.environment``)."""
    if value is None:
        return environment.flag(BATCH_INVARIANT_ENV)
    if not isinstance(value, bool):
        raise UnsupportedError(f"{who}: batch_invariant must be True, False or None (None: ${BATCH_INVARIANT_ENV}), "
                               f"got {value!r}")
    return value


def checked_byte_count(value: object, what: str, who: str) -> int:
    """An optional size in bytes (``None``: 0): an integer >= 0."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UnsupportedError(f"{who}: {what} must be an integer >= 0, got {value!r}")
    return value


def cuda_device(device: object, who: str) -> torch.device:
    """The CUDA device to use; argument errors are reported before a missing GPU is."""
    if device is not None and not isinstance(device, (torch.device, str, int)) or isinstance(device, bool):
        raise UnsupportedError(f"{who}: device must be a torch.device, 'cuda[:N]' or an index, got {device!r}")
    try:
        dev = None if device is None else torch.device(device)  # type: ignore[arg-type]
    except (RuntimeError, TypeError) as exc:
        raise UnsupportedError(f"{who}: device {device!r} is not a device ({exc})") from None
    if dev is not None and dev.type != "cuda":
        raise UnsupportedError(f"{who}: device must be a CUDA device, got {dev}")
    if not torch.cuda.is_available():
        raise UnsupportedError(f"{who}: no CUDA device is available (torch {torch.__version__}, "
                               f"CUDA {'built in' if torch.backends.cuda.is_built() else 'not built in'})")
    if dev is None or dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if dev.index >= torch.cuda.device_count():
        raise UnsupportedError(f"{who}: {dev} does not exist; {torch.cuda.device_count()} CUDA device(s) visible")
    return dev

