"""The engine-free part of sollat's vLLM and SGLang plugins (no engine is imported here).

An engine shim (``vllm.py``, ``sglang.py``) builds one :class:`GroupAdapter` per tensor-parallel
group and asks it, call by call, to serve an all-reduce. The adapter answers with a tensor (sollat
served it) or ``None`` (the engine's own path must serve it). Everything here runs under
``torchrun`` on GPUs where the engines cannot be installed (``scripts/engine_adapter_real.py``).

The rule (``all_reduce_refusal``, ``rmsnorm_refusal``; pure functions of the call):

* the group's sollat communicator exists: constructed collectively, lazily, on every rank of the
  group (world size 2..72, every rank on one host, and the construction succeeded on every rank:
  symmetric memory mapped every peer's scratch; agreed through the process group's store with a
  timeout, so that no rank routes to sollat while another routes to the engine, and no rank
  waits on a peer that failed);
* the tensor lies on the communicator's device, is contiguous, has 1 .. ``MAX_ELEMENTS`` elements
  and a dtype sollat reduces (float32, bfloat16, float16, float64; the fused RMSNorm: the first
  three, a weight ``[hidden]`` of x's dtype, a residual of x's shape and dtype, hidden <= 65536,
  the FP8 scale one float32 element on the device);
* outside batch-invariant mode, the message (x) is at most the engine limit
  (``$SOLLAT_ENGINE_MAX_BYTES``, ``settings.py``), and at most the size above which the
  communicator's table picks an algorithm the engine's communicator leaves out
  (``GroupAdapter.own_limit``). In batch-invariant mode there is no size limit: a threshold would
  send one row through two implementations at two batch sizes, which that mode forbids (sollat
  cuts a large message into passes over the same scratch).

Everything else goes to the engine's path.

The factory seam: ``set_communicator_factory(f)`` makes every adapter built afterwards construct
its communicator as ``f(device_group, device, batch_invariant)`` (CPU tests inject a stand-in
that reduces in rank order over gloo; ``None`` restores :func:`sollat_communicator`).

Messages go to the logger the engine shim passes (a child of the engine's own logger, so they
carry the engine's prefix); a group that keeps the engine's all-reduce says so in one warning,
logged by the group's rank 0, naming the failed ranks and causes.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch

from ..collectives.rmsnorm import DTYPES_SUPPORTED as RMSNORM_DTYPES
from ..collectives.rmsnorm import MAX_HIDDEN
from ..comm import agree
from ..comm.base import MAX_ELEMENTS
from ..device import faults
from ..device.dtypes import DTYPES
from ..device.layout import MAX_RANKS
from ..errors import UnsupportedError
from . import settings
from .settings import BATCH_INVARIANT_ENV, MAX_BYTES_ENV, OPT_IN_ENV, opted_in

__all__ = ["ALL_REDUCE_DTYPES", "BATCH_INVARIANT_ENV", "MAX_BYTES_ENV", "OPT_IN_ENV", "GroupAdapter",
           "all_reduce_refusal", "domain_refusal", "opted_in", "rmsnorm_refusal", "set_communicator_factory",
           "sollat_batch_invariant_env", "sollat_communicator", "summary"]

logger = logging.getLogger("sollat.integrations")

ALL_REDUCE_DTYPES: tuple[torch.dtype, ...] = tuple(DTYPES)
MIN_WORLD_SIZE = 2


def sollat_batch_invariant_env(value: str | None) -> bool:
    """Whether ``$SOLLAT_BATCH_INVARIANT`` asks for sollat's batch-invariant mode on its own (the
    engine's mode turns it on too); only ``1`` does (the plugin has checked the value at start-up,
    ``settings.check_environment``)."""
    return value is not None and value.strip() == "1"


# ---- the rule -----------------------------------------------------------------------------------
def all_reduce_refusal(x: Any, device: torch.device | None, max_bytes: int | None = None) -> str | None:
    """``None`` when a sum all-reduce of ``x`` is sollat's to serve on a communicator on ``device``
    (``None``: no communicator) with the engine limit ``max_bytes`` (``None``: none), else why not
    (the engine serves it)."""
    if device is None:
        return "no sollat communicator"
    if not isinstance(x, torch.Tensor):
        return f"not a tensor ({type(x).__name__})"
    if x.device != device:
        return f"on {x.device}, the communicator is on {device}"
    if x.dtype not in DTYPES:
        return f"dtype {x.dtype}"
    n = x.numel()
    if n == 0:
        return "empty"
    if n > MAX_ELEMENTS:
        return f"{n} elements > {MAX_ELEMENTS}"
    if not x.is_contiguous():
        return "not contiguous"
    if max_bytes is not None and n * x.element_size() > max_bytes:
        return f"{n * x.element_size()} bytes > {MAX_BYTES_ENV} ({max_bytes})"
    return None


def rmsnorm_refusal(x: Any, residual: Any, weight: Any, device: torch.device | None,
                    fp8_scale: Any = None, max_bytes: int | None = None) -> str | None:
    """``None`` when AllReduce + residual add + RMSNorm (+ the static FP8 copy with ``fp8_scale``)
    is sollat's to serve in one call (``Communicator.all_reduce_rmsnorm``), else why not."""
    why = all_reduce_refusal(x, device, max_bytes)
    if why is not None:
        return why
    if x.dtype not in RMSNORM_DTYPES:
        return f"dtype {x.dtype} (the fused RMSNorm takes float32, bfloat16, float16)"
    if x.dim() < 1 or x.shape[-1] > MAX_HIDDEN:
        return f"hidden {x.shape[-1] if x.dim() else 0} > {MAX_HIDDEN}" if x.dim() else "a 0-d tensor"
    if (not isinstance(residual, torch.Tensor) or residual.shape != x.shape or residual.dtype != x.dtype
            or residual.device != x.device or not residual.is_contiguous()):
        return "residual is not a contiguous tensor of x's shape, dtype and device"
    if (not isinstance(weight, torch.Tensor) or tuple(weight.shape) != (x.shape[-1],) or weight.dtype != x.dtype
            or weight.device != x.device):
        return "weight is not [hidden] of x's dtype and device"
    if fp8_scale is not None and (not isinstance(fp8_scale, torch.Tensor) or fp8_scale.dtype != torch.float32
                                  or fp8_scale.numel() != 1 or fp8_scale.device != x.device):
        return "fp8 scale is not one float32 element on x's device"
    return None


def domain_refusal(world_size: int, hosts: Sequence[str]) -> str | None:
    """``None`` when a group of ``world_size`` ranks on ``hosts`` (one entry per rank) can be one
    sollat communicator: 2..72 ranks on one host (one NVLink domain; whether every peer's memory
    can really be mapped is what the construction itself finds out)."""
    if not MIN_WORLD_SIZE <= world_size <= MAX_RANKS:
        return f"world size {world_size} (sollat serves {MIN_WORLD_SIZE}..{MAX_RANKS} ranks)"
    if len(set(hosts)) > 1:
        return f"the group spans hosts {sorted(set(hosts))} (sollat serves one host's GPUs)"
    return None


# ---- the communicator and how it is made ----------------------------------------------------------
class CommunicatorLike(Protocol):
    """What an adapter uses of ``sollat.Communicator`` (and what a test double provides). The adapter
    also calls ``own_pick_limit()`` where the communicator has one (``GroupAdapter.own_limit``); a
    double without it is served at every size up to the engine limit."""

    device: torch.device

    def all_reduce(self, tensor: torch.Tensor, op: str = ..., algo: str = ..., *,
                   out: torch.Tensor | None = ...) -> torch.Tensor: ...

    def all_reduce_rmsnorm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = ...,
                           algo: str = ..., **kwargs: Any) -> tuple[torch.Tensor, ...]: ...


Factory = Callable[[Any, torch.device, bool], CommunicatorLike]


def sollat_communicator(device_group: Any, device: torch.device, batch_invariant: bool) -> CommunicatorLike:
    """The default factory: ``sollat.Communicator(device_group, **settings.communicator_options(R))``
    on ``device`` (collective; the engine's footprint: ``settings.py``), in batch-invariant mode
    when ``batch_invariant`` (otherwise sollat's own default, which ``$SOLLAT_BATCH_INVARIANT``
    sets). On a machine without CUDA it still enters the constructor, whose first gate reports the
    missing GPU on every rank alike."""
    import torch.distributed as dist

    from ..comm.real import Communicator

    if device.type != "cuda":
        raise UnsupportedError(f"a sollat communicator needs a CUDA device, got {device}")
    kwargs: dict[str, Any] = {"batch_invariant": True} if batch_invariant else {}
    if dist.is_initialized():  # else the constructor says what is missing
        kwargs.update(settings.communicator_options(dist.get_world_size(device_group)))
    with torch.cuda.device(device) if torch.cuda.is_available() else contextlib.nullcontext():
        return Communicator(device_group, **kwargs)


_factory: Factory = sollat_communicator


def set_communicator_factory(factory: Factory | None) -> None:
    """Adapters built after this call construct their communicator with ``factory`` (``None``: the
    default, :func:`sollat_communicator`). The seam the CPU tests use."""
    global _factory
    if factory is not None and not callable(factory):
        raise TypeError(f"set_communicator_factory: expected a callable or None, got {type(factory).__name__}")
    _factory = sollat_communicator if factory is None else factory


def _reason(exc: BaseException, rank: int) -> str:
    """What a rank posts about its failure: a construction failure's own summary (the same text on
    every rank: ``rank r: cause``), else ``rank r: Type: message``."""
    summary = getattr(exc, "summary", None)
    return summary if isinstance(summary, str) and summary else f"rank {rank}: {agree.cause(exc)}"


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


# ---- one tensor-parallel group ------------------------------------------------------------------
class GroupAdapter:
    """sollat for one tensor-parallel group of an engine.

    ``device_group``: the group sollat's communicator is built over (NCCL on GPUs; its library
    hand-overs use it). ``cpu_group``: a gloo group of the same ranks (its rank numbering is the
    group's). The communicator is built by :meth:`ensure` (collective), at the latest on the first
    call the rule would give it; never inside a CUDA-graph capture or a ``torch.compile`` trace
    (such a call goes to the engine, on every rank alike, and the next eager call builds it).
    ``max_bytes``: the engine limit (``None``: none); batch-invariant mode has none. ``log``: the
    engine's logger for this plugin. ``counts`` records what was routed: ``"all_reduce"``,
    ``"all_reduce_rmsnorm"``, ``"declined:<reason>"``."""

    def __init__(self, *, engine: str, name: str, device_group: Any, cpu_group: Any, device: torch.device,
                 world_size: int, batch_invariant: bool, max_bytes: int | None = None,
                 log: logging.Logger | None = None, fallback: str = "the engine's all-reduce") -> None:
        self.engine = engine
        self.name = name
        self.device_group = device_group
        self.cpu_group = cpu_group
        self.device = torch.device(device)
        self.world_size = world_size
        self.batch_invariant = batch_invariant
        self.limit = max_bytes
        self.log = log or logger
        self.fallback = fallback  # what serves the group's calls without sollat, as the warning names it
        self.comm: CommunicatorLike | None = None
        # Above this size the communicator's table picks an algorithm the engine's communicator does
        # not build (its footprint): the engine serves those calls (set with the communicator).
        self.own_limit: int | None = None
        self.unavailable: str | None = None  # why there is no communicator (set once, on every rank alike)
        self.capturing = False
        self.counts: Counter[str] = Counter()
        self._factory = _factory

    @property
    def max_bytes(self) -> int | None:
        """The largest message sollat serves for this group (``None``: any, in batch-invariant mode)."""
        return None if self.batch_invariant else self.limit

    # -- construction --
    def ensure(self) -> bool:
        """Build the communicator if it is not built yet (collective over the group); whether it exists."""
        if self.comm is not None:
            return True
        if self.unavailable is not None or _capturing() or torch.compiler.is_compiling():
            return False
        why = domain_refusal(self.world_size, [""] * self.world_size)
        if why is not None:  # the same on every rank: nothing to agree on
            return self._keep_engine(why, 0)
        import torch.distributed as dist

        rank = dist.get_rank(self.cpu_group)
        exchange = self._exchanger(rank)
        try:
            hosts = exchange(socket.gethostname(), 1.0)
        except Exception as exc:  # a rank that never arrived: the same decision on every rank that did
            return self._keep_engine(_reason(exc, rank), rank)
        why = domain_refusal(self.world_size, hosts)
        comm: CommunicatorLike | None = None
        if why is None:
            reason = ""
            try:
                comm = self._factory(self.device_group, self.device, self.batch_invariant)
            except Exception as exc:  # reported and agreed on below: this rank's reason, every rank's decision
                reason = _reason(exc, rank)
            # Every rank learns every rank's outcome: sollat serves the group only where it was built
            # on all. The wait covers a peer that spends the setup timeout in the constructor's own
            # gates before it gives up (it never waits longer: comm/agree.py).
            try:
                reasons = exchange(reason, 2.0)
            except Exception as exc:
                reasons = [_reason(exc, rank)]
            failed = list(dict.fromkeys(r for r in reasons if r))  # each distinct reason once, rank order
            why = "; ".join(failed) if failed else None
        if why is not None:
            return self._keep_engine(why, rank)
        self.comm = comm
        self.batch_invariant = bool(getattr(comm, "batch_invariant", self.batch_invariant))
        limit = getattr(comm, "own_pick_limit", None)
        self.own_limit = limit() if callable(limit) else None
        return True

    def _beyond_own_picks(self, x: torch.Tensor) -> str | None:
        """Why a call the rule gives sollat still goes to the engine: above ``own_limit`` a plain
        communicator would run an algorithm this one was built without (not in batch-invariant
        mode, which never hands a call over)."""
        nbytes = x.numel() * x.element_size()
        if self.batch_invariant or self.own_limit is None or nbytes <= self.own_limit:
            return None
        return f"{nbytes} bytes > {self.own_limit}, above which the table picks an algorithm the engine's communicator leaves out"

    def _exchanger(self, rank: int) -> Callable[[str, float], list[str]]:
        """``exchange(value, k)``: every rank's value, through the store, within k x the setup
        timeout (without a store: the gloo group's all_gather_object, unbounded)."""
        import torch.distributed as dist

        store = agree.default_store(self.cpu_group)
        try:
            setup = faults.validated_timeout(None, what="setup timeout", env="SOLLAT_SETUP_TIMEOUT_S",
                                             default=faults.DEFAULT_SETUP_TIMEOUT_S)
        except UnsupportedError:  # checked at start-up; a value changed since: the default
            setup = faults.DEFAULT_SETUP_TIMEOUT_S
        if store is None:
            def gathered(value: str, k: float) -> list[str]:
                out: list[Any] = [None] * self.world_size
                dist.all_gather_object(out, value, group=self.cpu_group)
                return [str(v) for v in out]

            return gathered
        # Keyed by the torch group's own name: unique per group, where an engine's names ("tp:0") repeat
        # across the TP groups of a pipeline- or data-parallel job, which share one store.
        ag = agree.Agreement(store, f"engine/{self.cpu_group.group_name}", rank, self.world_size, setup)
        return lambda value, k: ag.exchange(value, k * setup)

    def _keep_engine(self, why: str, rank: int) -> bool:
        """The group keeps the engine's all-reduce; one warning for the group (its rank 0 logs it)."""
        self.unavailable = why
        level = logging.WARNING if rank == 0 else logging.DEBUG
        self.log.log(level, "sollat: %s group %s keeps %s: %s", self.engine, self.name, self.fallback, why)
        return False

    # -- calls --
    def serves(self, x: torch.Tensor) -> bool:
        """Whether :meth:`all_reduce` would serve ``x`` (builds the communicator as it would)."""
        comm = self.comm
        if comm is None and all_reduce_refusal(x, self.device, self.max_bytes) is None and self.ensure():
            comm = self.comm
        why = all_reduce_refusal(x, None if comm is None else comm.device, self.max_bytes)
        return why is None and self._beyond_own_picks(x) is None

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor | None:
        """The sum over the group of ``x`` (a new tensor), or ``None``: the engine must serve it."""
        comm = self.comm
        if comm is None and all_reduce_refusal(x, self.device, self.max_bytes) is None and self.ensure():
            comm = self.comm  # built on the first call the rule gives it (the same call on every rank)
        why = all_reduce_refusal(x, None if comm is None else comm.device, self.max_bytes) or self._beyond_own_picks(x)
        if why is not None:
            self.counts["declined:" + why] += 1
            return None
        self.counts["all_reduce"] += 1
        assert comm is not None
        return comm.all_reduce(x)

    def all_reduce_rmsnorm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                           fp8_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, ...] | None:
        """``(y, residual_out)`` (with ``fp8_scale``: ``(y, residual_out, q)``) of AllReduce +
        residual add + RMSNorm in one sollat call, or ``None``: the caller must compose it itself."""
        comm = self.comm
        if (comm is None and rmsnorm_refusal(x, residual, weight, self.device, fp8_scale, self.max_bytes) is None
                and self.ensure()):
            comm = self.comm
        why = (rmsnorm_refusal(x, residual, weight, None if comm is None else comm.device, fp8_scale, self.max_bytes)
               or self._beyond_own_picks(x))
        if why is not None:
            self.counts["declined:" + why] += 1
            return None
        self.counts["all_reduce_rmsnorm"] += 1
        assert comm is not None
        if fp8_scale is None:
            return comm.all_reduce_rmsnorm(x, residual, weight, float(eps))
        return comm.all_reduce_rmsnorm(x, residual, weight, float(eps), fp8_scale=fp8_scale)

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        """Entered around an engine's CUDA-graph capture. sollat's calls need nothing registered
        (epochs live in device memory, scratch is fixed at construction), so this only builds the
        communicator before the capture starts (collective, as the engine's capture is) and marks
        the adapter as capturing."""
        self.ensure()
        self.capturing = True
        try:
            yield
        finally:
            self.capturing = False

    def describe(self) -> str:
        state = "built" if self.comm is not None else (f"unavailable ({self.unavailable})" if self.unavailable
                                                       else "not built yet")
        return (f"{self.engine} group {self.name}: {self.world_size} ranks on {self.device}, "
                f"batch_invariant={self.batch_invariant}, communicator {state}")


def summary(engine: str, what: str, batch_invariant: bool, max_bytes: int, also: str = "") -> str:
    """The plugin's one log line."""
    dtypes = ", ".join(str(d).replace("torch.", "") for d in ALL_REDUCE_DTYPES)
    size = ("every size (batch-invariant mode)" if batch_invariant
            else f"messages up to {settings.format_bytes(max_bytes)} ({MAX_BYTES_ENV})")
    return (f"sollat: {engine} {what} -> sollat (batch_invariant={batch_invariant}, {size}, world sizes "
            f"{MIN_WORLD_SIZE}..{MAX_RANKS}, dtypes {dtypes}){also}; everything else stays the engine's; "
            f"{OPT_IN_ENV}=0 turns it off")
