"""The engine-free part of sollat's vLLM and SGLang plugins (no engine is imported here).

An engine shim (``vllm.py``, ``sglang.py``) builds one :class:`GroupAdapter` per tensor-parallel
group and asks it, call by call, to serve an all-reduce. The adapter answers with a tensor (sollat
served it) or ``None`` (the engine's own path must serve it). Everything here runs under
``torchrun`` on GPUs where the engines cannot be installed (``scripts/engine_adapter_real.py``).

The rule (``rule.py``: ``all_reduce_refusal``, ``rmsnorm_refusal``, ``domain_refusal``; pure
functions of the call) says which calls sollat serves; everything else goes to the engine's path.

Every input of that rule that is not the call itself is agreed between the ranks when the
communicator is built (``GroupAdapter.ensure``), so that no rank routes a call to sollat while
another routes it to the engine (both would wait for ever): each rank posts its engine limit and
batch-invariant mode through the store, then whether its communicator was built and its
``own_pick_limit``. Where the ranks differ, every rank takes the same value, and the group's rank 0
logs one warning naming every rank and its value:

* the engine limit and ``own_limit``: the smallest (a smaller limit only sends more calls to the
  engine, which is correct at every size; a larger one would hand a rank calls its peers' settings
  refuse);
* the batch-invariant mode: on where any rank asks for it (a rank that asked relies on its bits
  not depending on the batch; it costs the others no correctness; and a rank with
  ``SOLLAT_BATCH_INVARIANT=1`` builds its communicator in that mode whatever the adapter asks,
  so "off" could not be agreed by the communicators, which compare the mode themselves);
* the communicator: it serves the group only where it was built on every rank.

Until then the first call that the rule admits at some size (the size limit is not known yet:
it is agreed there) builds it, the same call on every rank.

The factory seam: ``set_communicator_factory(f)`` makes every adapter built afterwards construct
its communicator as ``f(device_group, device, batch_invariant)`` (CPU tests inject a stand-in
that reduces in rank order over gloo; ``None`` restores :func:`sollat_communicator`).

Messages go to the logger the engine shim passes (a child of the engine's own logger, so they
carry the engine's prefix); a group that keeps the engine's all-reduce says so in one warning,
logged by the group's rank 0, naming the failed ranks and causes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch

from ..comm import agree
from ..device import environment, faults
from ..device.layout import MAX_RANKS
from ..errors import UnsupportedError
from . import settings
from .rule import ALL_REDUCE_DTYPES, MIN_WORLD_SIZE, all_reduce_refusal, domain_refusal, rmsnorm_refusal
from .rule import MAX_ELEMENTS as MAX_ELEMENTS  # re-exported: what the rule and the vLLM pass name
from .rule import RMSNORM_DTYPES as RMSNORM_DTYPES
from .settings import BATCH_INVARIANT_ENV, MAX_BYTES_ENV, OPT_IN_ENV, opted_in

__all__ = ["ALL_REDUCE_DTYPES", "BATCH_INVARIANT_ENV", "MAX_BYTES_ENV", "OPT_IN_ENV", "GroupAdapter",
           "all_reduce_refusal", "domain_refusal", "opted_in", "rmsnorm_refusal", "set_communicator_factory",
           "sollat_batch_invariant_env", "sollat_communicator", "summary"]

logger = logging.getLogger("sollat.integrations")

def sollat_batch_invariant_env() -> bool:
    """Whether ``$SOLLAT_BATCH_INVARIANT`` asks for sollat's batch-invariant mode on its own (the
    engine's mode turns it on too; the plugin has checked the value at start-up,
    ``settings.check_environment``)."""
    return environment.flag(BATCH_INVARIANT_ENV)


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


def _smallest(values: Any) -> int | None:
    """The smallest of byte limits where ``None`` is no limit (``None`` only where every one is)."""
    limits = [int(v) for v in values if v is not None]
    return min(limits) if limits else None


def _own_pick_limit(comm: Any) -> int | None:
    limit = getattr(comm, "own_pick_limit", None)
    return limit() if callable(limit) else None


def _agreed(posted: Sequence[dict[str, Any]], key: str, what: str, rule: Callable[[list[Any]], Any], how: str,
            differ: list[str]) -> Any:
    """``rule`` over every rank's ``posted[r][key]``; where the ranks posted different values, a note
    for the group's warning names every rank with its value and what every rank uses."""
    values = [p[key] for p in posted]
    chosen = rule(values)
    if isinstance(chosen, bool) or all(isinstance(v, bool) for v in values):
        chosen = bool(chosen)
    if len({json.dumps(v) for v in values}) > 1:
        by_value: dict[str, list[int]] = {}
        for r, v in enumerate(values):
            by_value.setdefault(json.dumps(v), []).append(r)
        ranks = "; ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}: {v}"
                          for v, rs in by_value.items())
        differ.append(f"{what} differs ({ranks}): every rank uses {json.dumps(chosen)} ({how})")
    return chosen


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
                 log: logging.Logger | None = None, fallback: str = "the engine's all-reduce",
                 refusal: Callable[[], str | None] | None = None) -> None:
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
        # This rank's own reason not to build a communicator (None: none), asked before any rank builds
        # one: where any rank has one, no rank enters the (collective) construction.
        self._refusal = refusal

    @property
    def max_bytes(self) -> int | None:
        """The largest message sollat serves for this group (``None``: any, in batch-invariant mode)."""
        return None if self.batch_invariant else self.limit

    # -- construction --
    def ensure(self) -> bool:
        """Build the communicator if it is not built yet (collective over the group); whether it
        exists. Every input of the routing decision is agreed here, through the store, before the
        adapter serves anything: the engine limit, the batch-invariant mode, ``own_limit`` and
        whether the communicator exists (``_agreed``); a rank whose value differs is named in one
        warning."""
        if self.comm is not None:
            return True
        if self.unavailable is not None or _capturing() or torch.compiler.is_compiling():
            return False
        why = domain_refusal(self.world_size, [""] * self.world_size)
        if why is not None:  # the same on every rank: nothing to agree on
            return self._keep_engine(why, 0)
        import torch.distributed as dist

        rank = dist.get_rank(self.cpu_group)
        differ: list[str] = []
        try:
            return self._build(rank, differ)
        finally:
            if differ:  # one warning for the group (its rank 0 logs it), every disagreement in it
                self.log.log(logging.WARNING if rank == 0 else logging.DEBUG,
                             "sollat: %s group %s: the ranks' settings differ; every rank uses the same: %s",
                             self.engine, self.name, "; ".join(differ))

    def _build(self, rank: int, differ: list[str]) -> bool:
        exchange = self._exchanger(rank)
        mine = {"host": socket.gethostname(), "max_bytes": self.limit, "batch_invariant": bool(self.batch_invariant),
                "refusal": self._refusal() if self._refusal is not None else None}
        try:
            posted = [json.loads(p) for p in exchange(json.dumps(mine), 1.0)]
        except Exception as exc:  # a rank that never arrived: the same decision on every rank that did
            return self._keep_engine(_reason(exc, rank), rank)
        # The same lists on every rank, hence the same values and the same notes.
        self.limit = _agreed(posted, "max_bytes", MAX_BYTES_ENV, _smallest, "the smallest", differ)
        self.batch_invariant = _agreed(posted, "batch_invariant", "batch-invariant mode", any,
                                       "on where any rank asks for it", differ)
        refused = list(dict.fromkeys(f"rank {r}: {p['refusal']}" for r, p in enumerate(posted) if p.get("refusal")))
        why = "; ".join(refused) if refused else domain_refusal(self.world_size, [p["host"] for p in posted])
        comm: CommunicatorLike | None = None
        if why is None:
            reason, own = "", None
            try:
                comm = self._factory(self.device_group, self.device, self.batch_invariant)
                own = _own_pick_limit(comm)
                if bool(getattr(comm, "batch_invariant", self.batch_invariant)) != self.batch_invariant:
                    raise UnsupportedError(f"its communicator's batch_invariant is "
                                           f"{getattr(comm, 'batch_invariant', None)}, the group's {self.batch_invariant}")
            except Exception as exc:  # reported and agreed on below: this rank's reason, every rank's decision
                reason = _reason(exc, rank)
            # Every rank learns every rank's outcome: sollat serves the group only where it was built
            # on all. The wait covers a peer that spends the setup timeout in the constructor's own
            # gates before it gives up (it never waits longer: comm/agree.py).
            try:
                outcomes = [json.loads(p) for p in exchange(json.dumps({"reason": reason, "own_limit": own}), 2.0)]
            except Exception as exc:
                outcomes = [{"reason": _reason(exc, rank), "own_limit": None}]
            failed = list(dict.fromkeys(o["reason"] for o in outcomes if o["reason"]))  # each once, rank order
            why = "; ".join(failed) if failed else None
            if why is None:
                self.own_limit = _agreed(outcomes, "own_limit", "own_limit (the communicator's own_pick_limit)",
                                         _smallest, "the smallest", differ)
        if why is not None:
            return self._keep_engine(why, rank)
        self.comm = comm
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
        setup = faults.setup_timeout()
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
        if comm is None and all_reduce_refusal(x, self.device) is None and self.ensure():
            comm = self.comm
        why = all_reduce_refusal(x, None if comm is None else comm.device, self.max_bytes)
        return why is None and self._beyond_own_picks(x) is None

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor | None:
        """The sum over the group of ``x`` (a new tensor), or ``None``: the engine must serve it."""
        comm = self.comm
        if comm is None and all_reduce_refusal(x, self.device) is None and self.ensure():
            comm = self.comm  # built on the first call the rule admits at some size (the same call on every rank)
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
        if comm is None and rmsnorm_refusal(x, residual, weight, self.device, fp8_scale) is None and self.ensure():
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
