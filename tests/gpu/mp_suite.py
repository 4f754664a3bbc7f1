"""Real-rank test suite: one process per GPU under torchrun, ``sollat.Communicator``.

    python -m torch.distributed.run --standalone --nproc-per-node=N tests/gpu/mp_suite.py [--only a,b]

Sections (default: all but ``skew``; ``--only`` or ``SOLLAT_MP_SECTIONS`` picks, ``SOLLAT_MP_SKIP``
drops): values, rmsnorm, gather_scatter, auto, graphs, straggler, mismatch, dead_peer, graph_fault, two_comms,
streams, tear, and ``skew`` (compile skew: run it in its own launch with a fresh empty SOLLAT_CACHE_DIR).
(The option is ``--only``: torchrun abbreviates its own options anywhere on the line, and ``--only``
is a prefix of none of them.)

Every rank draws every rank's inputs from the same integer-hash seed (``_reference.make_inputs``),
so each checks the result alone: bitwise against the rank-order reference (deterministic
algorithms) or within the summation bound (LL128, NCCL); and every output's raw bits (NaN payloads
included) are compared across ranks through SHA-256 digests exchanged via the process group's
store at the end of each section.

Robustness: value checks record failures and continue, so every rank issues the same calls; an
exception ends only its section. Every cross-rank wait of the suite goes through the store with a
timeout; after each section the ranks meet (store, with a timeout), then every communicator on
the world group is reset. A watchdog ends the process when a section runs past twice its budget
plus 60 s (a hang inside CUDA or NCCL), and faulthandler backs it up without the GIL.

Output, per rank: ``RANK r PLAN ...``, ``RANK r START s``, detail lines ``RANK r   s: ...``, then
``RANK r PASS s (...)`` or ``RANK r FAIL s: ...``, and ``RANK r SUMMARY passed=X failed=Y``
(exit status 1 when any failed). The verdict: where the launcher sets ``SOLLAT_TEST_RESULTS`` (a
folder), each rank also writes it to ``rank<r>.json`` there after every section (``_procs.RankResult``:
the plan, each section's pass or failures, errors outside a section, the summary), which the
launcher reads instead of the interleaved output.

Environment: SOLLAT_MP_SECTIONS, SOLLAT_MP_SKIP (comma lists), SOLLAT_MP_TEAR_LINES (LL lines of the
tear stress, default 1e9), SOLLAT_MP_GRAPH_REPLAYS (default 100), SOLLAT_MP_BUDGET_SCALE (scales
every section's time budget, default 1).
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import math
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

import sollat
from sollat.collectives import select
from sollat.collectives.algorithms import ALGORITHMS, Algorithm
from sollat.collectives.handover import TORCH_SYMM_WORLD_SIZES
from sollat.device import layout

try:  # imported as tests.gpu.mp_suite (the pytest launcher) or run as a script (torchrun)
    from . import _procs
    from . import _reference as ref
    from ._examples import load_example
except ImportError:
    import _procs  # type: ignore[no-redef]
    import _reference as ref  # type: ignore[no-redef]
    from _examples import load_example  # type: ignore[no-redef]

NAN = float("nan")
POISON = 1234.5  # finite poison where an untouched output must show (a faulted call writes NaN or the result)
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
MAIN_TIMEOUT_S = 10.0  # the main communicator (the straggler sleeps 1.5 s)
FAST_TIMEOUT_S = 2.0  # fault sections: mismatch, dead peer, fault under a graph
SKEW_TIMEOUT_S = 3.0
SKEW_SLEEP_S = 5.0
STRAGGLER_SLEEP_S = 1.5
FAULT_SLACK_S = 5.0  # a fault must be raised within timeout_s + this
NCCL_TIMEOUT_S = 1800  # the process group's own watchdog: later than ours, which names the section
SHARED_GRAPH_REPLAYS = 10  # ranks on one GPU: 10 replays of 100 calls (1000 graph-replayed calls)
SHARED_DTYPES = (torch.float32, torch.bfloat16)  # the values section's dtypes on ranks sharing a GPU
SUM_CLASSES = ("nan", "inf", "negzero", "denormal", "huge", "bits", "mix")


def env_float(name: str, default: float) -> float:
    v = os.environ.get(name, "").strip()
    return float(v) if v else default


def emit(line: str) -> None:
    """One line in one write (ranks share the pipe: a line must not interleave with another rank's)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def dname(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


def esize(dt: torch.dtype) -> int:
    return torch.empty((), dtype=dt).element_size()


def dtypes_of(algo: str) -> list[torch.dtype]:
    return [d for d in DTYPES if d in ALGORITHMS[algo].dtypes]


def one_pass(alg: Algorithm, dt: torch.dtype, world: int, max_blocks: int) -> int:
    """Elements one scratch pass of the largest plan holds (beyond it a call iterates)."""
    return max_blocks * layout.MAX_THREADS * (alg.payload_bytes // esize(dt)) * (world if alg.two_shot else 1)


def is_deterministic(algo: str) -> bool:
    return algo in ALGORITHMS and ALGORITHMS[algo].deterministic


def testing_module() -> ModuleType:
    from sollat import testing  # the fault-injection hooks (inject / clear)

    return testing


def describe(e: BaseException) -> str:
    rank, peer = getattr(e, "rank", None), getattr(e, "peer", None)
    extra = f" rank={rank} peer={peer}" if rank is not None or peer is not None else ""
    return f"{type(e).__name__}{extra}"


def poll_fault(comm: sollat.Communicator, limit_s: float, *, sync: bool = True
               ) -> tuple[sollat.SollatError | None, float]:
    """Call comm.check() (or check(sync=False)) until it raises or limit_s passes: a rank whose own
    kernel completed raises only once a peer's fault record has reached it."""
    t0 = time.monotonic()
    while True:
        try:
            if sync:
                comm.check()
            else:
                comm.check(sync=False)  # type: ignore[call-arg]
        except sollat.SollatError as e:
            return e, time.monotonic() - t0
        if time.monotonic() - t0 > limit_s:
            return None, time.monotonic() - t0
        time.sleep(0.02)


# ---- the harness ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Section:
    name: str
    fn: Callable[[Suite], None]
    budget_s: float
    default: bool
    needs_gpus: str = ""  # why it needs one GPU per rank (NCCL between distinct GPUs); "" runs anywhere


SECTIONS: dict[str, Section] = {}


def section(name: str, budget_s: float, default: bool = True,
            needs_gpus: str = "") -> Callable[[Callable[[Suite], None]], Callable[[Suite], None]]:
    def deco(fn: Callable[[Suite], None]) -> Callable[[Suite], None]:
        SECTIONS[name] = Section(name, fn, budget_s, default, needs_gpus)
        return fn

    return deco


class Watchdog(threading.Thread):
    """Ends the process when a section runs past its hard limit (prints the stacks first)."""

    def __init__(self, suite: Suite) -> None:
        super().__init__(daemon=True)
        self.suite = suite
        self.deadline: float | None = None
        self.section = ""
        self.limit = 0.0

    def arm(self, name: str, limit_s: float) -> None:
        self.section, self.limit = name, limit_s
        self.deadline = time.monotonic() + limit_s
        faulthandler.dump_traceback_later(limit_s + 30, exit=True)  # needs no GIL

    def disarm(self) -> None:
        self.deadline = None
        faulthandler.cancel_dump_traceback_later()

    def run(self) -> None:
        while True:
            time.sleep(1.0)
            d = self.deadline
            if d is not None and time.monotonic() > d:
                s = self.suite
                emit(f"RANK {s.rank} FAIL {self.section}: hung past its hard limit of {self.limit:.0f} s; "
                      "stacks follow, exiting")
                s.result.error(f"{self.section}: hung past its hard limit of {self.limit:.0f} s")
                s.result.finish(s.passed, s.failed + 1)
                faulthandler.dump_traceback(all_threads=True)
                emit(f"RANK {s.rank} SUMMARY passed={s.passed} failed={s.failed + 1}")
                os._exit(3)


class Suite:
    """Per-rank state: communicators, the current section's failures and output digests."""

    def __init__(self, rank: int, world: int, dev: torch.device, store: Any, shared: bool = False) -> None:
        self.rank, self.world, self.dev = rank, world, dev
        self.store = store
        # Every rank on one GPU (gloo): the kernels time-slice, a call takes milliseconds; budgets
        # scale with the ranks and the graph section replays fewer times (SHARED_* below).
        self.shared = shared
        self.comm: sollat.Communicator | None = None  # main communicator (timeout MAIN_TIMEOUT_S)
        self._fast: sollat.Communicator | None = None
        self._invariant: sollat.Communicator | None = None
        self.second: sollat.Communicator | None = None  # two_comms' second world communicator
        self.world_comms: list[sollat.Communicator] = []  # reset after every section, creation order
        self.keep: list[Any] = []  # kept alive until exit (sub-group communicators)
        self.section = ""
        self.failures: list[str] = []
        self.digests: list[tuple[str, str, str]] = []
        self._labels: set[str] = set()
        self._seq = 0
        self.passed = 0
        self.failed = 0
        self.aborted = False
        self.scale = env_float("SOLLAT_MP_BUDGET_SCALE", float(world) if shared else 1.0)
        self.watchdog = Watchdog(self)
        self.result = _procs.RankResult(rank)  # this rank's verdict file (the launcher reads it)

    # -- reporting
    def log(self, msg: str) -> None:
        emit(f"RANK {self.rank}   {self.section}: {msg}")

    def fail(self, msg: str) -> None:
        self.failures.append(msg)
        if len(self.failures) <= 12:
            self.log(f"fail: {msg}")
        elif len(self.failures) == 13:
            self.log("fail: (further failures of this section are counted, not printed)")

    def expect(self, cond: bool, msg: str) -> bool:
        if not cond:
            self.fail(msg)
        return cond

    # -- communicators
    def new_comm(self, **kw: Any) -> sollat.Communicator:
        """A communicator on the world group (collective: every rank, same order)."""
        c = sollat.Communicator(**kw)
        self.world_comms.append(c)
        return c

    @property
    def main(self) -> sollat.Communicator:
        assert self.comm is not None
        return self.comm

    def batch_invariant_comm(self) -> sollat.Communicator:
        """A batch-invariant communicator on the world group, made on first use (collective)."""
        if self._invariant is None:
            self._invariant = self.new_comm(timeout_s=MAIN_TIMEOUT_S, batch_invariant=True)
        return self._invariant

    @property
    def fast(self) -> sollat.Communicator:
        """The fault-test communicator (timeout FAST_TIMEOUT_S), made on first use (collective)."""
        if self._fast is None:
            self._fast = self.new_comm(timeout_s=FAST_TIMEOUT_S)
        return self._fast

    # -- store-based rendezvous (every wait bounded)
    def exchange(self, name: str, value: str, timeout_s: float = 120.0) -> list[str]:
        """All-gather of one string per rank through the store; raises after timeout_s."""
        key = f"{self.section}/{name}"
        self.store.set(f"{key}/{self.rank}", value)
        keys = [f"{key}/{r}" for r in range(self.world)]
        self.store.wait(keys, timedelta(seconds=timeout_s))
        return [self.store.get(k).decode() for k in keys]

    def barrier(self, name: str = "barrier", timeout_s: float = 120.0) -> None:
        self._seq += 1
        self.exchange(f"{name}#{self._seq}", "1", timeout_s)

    # -- inputs and checks
    def inputs(self, kind: str, n: int, dt: torch.dtype, *parts: object) -> list[torch.Tensor]:
        return ref.make_inputs(kind, ref.seed_of(self.section, *parts), n, dt, self.dev, self.world)

    def add_digest(self, label: str, y: torch.Tensor) -> None:
        k = 2
        base = label
        while label in self._labels:
            label = f"{base}#{k}"
            k += 1
        self._labels.add(label)
        self.digests.append((label, ref.digest(y), ref.digest(y, canonical_nan=True)))

    def expect_bits(self, what: str, outputs: tuple[tuple[torch.Tensor, torch.Tensor, str], ...],
                    digest: bool = True) -> None:
        """Each (got, want, name): got (copied to the host) bit for bit want; its bits join the
        cross-rank comparison unless ``digest`` is False."""
        for got, want, name in outputs:
            got = got.cpu()
            if int(ref.bitwise_bad(got, want)):
                self.fail(f"{what}: {name}: {ref.first_difference(got, want)}")
            if digest:
                self.add_digest(f"{what} {name}", got)

    def verify(self, y: torch.Tensor, xs: list[torch.Tensor], algo: str, op: str, what: str,
               cross_rank: bool = True) -> bool:
        """Bitwise against the rank-order reference (deterministic sollat algorithms) or within the
        summation bound (LL128, NCCL); the raw bits join the cross-rank comparison."""
        ok = True
        if tuple(y.shape) != tuple(xs[0].shape):
            self.fail(f"{what}: output shape {tuple(y.shape)}, expected {tuple(xs[0].shape)}")
            return False
        if is_deterministic(algo):
            want = ref.rank_order_reduce(xs, op)
            if int(ref.bitwise_bad(y, want)):
                ok = self.expect(False, f"{what}: {ref.first_difference(y, want)}")
        else:
            if op != "sum":
                self.fail(f"{what}: non-deterministic path {algo!r} for op {op}")
                return False
            bad = int(ref.sum_bound_bad(y, xs))
            if bad:
                ok = self.expect(False, f"{what}: {bad} of {y.numel()} elements outside the summation bound")
        if cross_rank:
            self.add_digest(what, y)
        return ok

    def compare_digests(self, timeout_s: float) -> None:
        """Every output both ranks produced must have identical raw bits (NaN payloads included)."""
        lists = self.exchange("digests", json.dumps(self.digests), timeout_s)
        mine = {label: (raw, canon) for label, raw, canon in self.digests}
        compared = 0
        for r, text in enumerate(lists):
            if r == self.rank:
                continue
            theirs = {label: (raw, canon) for label, raw, canon in json.loads(text)}
            for label, (raw, canon) in mine.items():
                other = theirs.get(label)
                if other is None:
                    continue
                compared += 1
                if other[0] != raw:
                    how = "only in NaN payloads" if other[1] == canon else "in values"
                    self.fail(f"cross-rank: output of [{label}] differs from rank {r}'s ({how})")
        if compared:
            self.log(f"cross-rank: {compared} outputs compared with the other ranks' raw bits")

    # -- running
    def run_section(self, sec: Section) -> None:
        self.section, self.failures, self.digests, self._labels, self._seq = sec.name, [], [], set(), 0
        budget = sec.budget_s * self.scale
        if sec.name == "tear":  # grows with the line count asked for
            budget *= max(1.0, tear_lines() / 1e9)
        hard = 2 * budget + 60
        emit(f"RANK {self.rank} START {sec.name} (budget {budget:.0f} s, hard limit {hard:.0f} s)")
        self.watchdog.arm(sec.name, hard)
        t0 = time.monotonic()
        try:
            sec.fn(self)
        except Exception as e:
            tb = traceback.extract_tb(e.__traceback__)
            at = ", ".join(f"{os.path.basename(f.filename)}:{f.lineno}" for f in tb[-3:])
            self.fail(f"{type(e).__name__}: {e} [at {at}]")
        try:  # this rank's device work ends (sollat kernels end by their timeouts)
            torch.cuda.synchronize(self.dev)
        except Exception as e:
            self.fail(f"synchronize after the section: {type(e).__name__}: {e}")
            self.aborted = True
        if not self.aborted:
            try:
                self.compare_digests(max(60.0, hard - (time.monotonic() - t0)))
            except Exception as e:
                self.fail(f"cross-rank comparison: {type(e).__name__}: {e}")
            try:
                self.exchange("end", str(len(self.failures)), 60.0)
            except Exception as e:
                self.fail(f"the ranks did not meet after the section ({type(e).__name__}: {e}); stopping")
                self.aborted = True
        if not self.aborted:  # every rank is here: the collective resets line up
            try:
                hooks = _testing_or_none()
                for c in self.world_comms:
                    if hooks is not None:
                        hooks.clear(c)
                    c.reset()
            except Exception as e:
                self.fail(f"reset after the section: {type(e).__name__}: {e}; stopping")
                self.aborted = True
        dt = time.monotonic() - t0
        self.watchdog.disarm()
        if dt > budget:
            emit(f"RANK {self.rank} WARN {sec.name} took {dt:.1f} s, over its budget of {budget:.0f} s")
        self.result.section(sec.name, self.failures, dt)
        if self.failures:
            self.failed += 1
            more = f" (+{len(self.failures) - 1} more)" if len(self.failures) > 1 else ""
            emit(f"RANK {self.rank} FAIL {sec.name}: {self.failures[0]}{more} ({dt:.1f} s)")
        else:
            self.passed += 1
            emit(f"RANK {self.rank} PASS {sec.name} ({dt:.1f} s of {budget:.0f} s budget)")


def _testing_or_none() -> ModuleType | None:
    try:
        return testing_module()
    except ImportError:
        return None


# ---- 1. values ------------------------------------------------------------------------------


def value_case(s: Suite, comm: sollat.Communicator, algo: str, dt: torch.dtype, op: str, n: int,
               kind: str, lay: str, rep: int = 0) -> None:
    """One checked call. lay: out (poisoned out=), fresh (out=None), misaligned (input and output
    views 1 and 3 elements into their buffers), strided (non-contiguous input), inplace (out=x),
    transposed (a 2-D transposed input; the shape is kept), reshaped_out (out of shape (1, n))."""
    what = f"{algo} {dname(dt)} {op} n={n} {kind} {lay}" + (f" rep{rep}" if rep else "")
    xs = s.inputs(kind, n, dt, what)
    x = xs[s.rank]
    x_before = ref.raw_bits(x).clone()
    x_after = x  # what must still hold the input's bits after the call
    if lay == "out":
        out = torch.full_like(x, NAN)
        y = comm.all_reduce(x, op, algo, out=out)
        s.expect(y.data_ptr() == out.data_ptr(), f"{what}: the result is not `out`")
    elif lay == "fresh":
        y = comm.all_reduce(x, op, algo)
    elif lay == "misaligned":
        ibuf = torch.full((n + 8,), NAN, dtype=dt, device=s.dev)
        ibuf[1:1 + n].copy_(x)
        obuf = torch.full((n + 8,), NAN, dtype=dt, device=s.dev)
        y = comm.all_reduce(ibuf[1:1 + n], op, algo, out=obuf[3:3 + n])
        s.expect(y.data_ptr() == obuf[3:].data_ptr(), f"{what}: the result is not the `out` view")
        s.expect(bool(torch.isnan(obuf[:3]).all()) and bool(torch.isnan(obuf[3 + n:]).all()),
                 f"{what}: wrote outside the output view")
        x_after = ibuf[1:1 + n]
    elif lay == "strided":
        ibuf = torch.full((2 * n,), NAN, dtype=dt, device=s.dev)
        ibuf[::2].copy_(x)
        x_after = ibuf[::2]
        y = comm.all_reduce(x_after, op, algo)
    elif lay == "inplace":
        x = x.clone()
        y = comm.all_reduce(x, op, algo, out=x)
        s.expect(y.data_ptr() == x.data_ptr(), f"{what}: in place result is not the input tensor")
    elif lay == "reshaped_out":  # out of the input's element count in another shape: the same memory
        out = torch.full((1, n), NAN, dtype=dt, device=s.dev)
        y = comm.all_reduce(x, op, algo, out=out)
        s.expect(y is out, f"{what}: the result is not `out`")
        y = y.view(-1)
    elif lay == "transposed":
        xs = [t.view(64, n // 64).t() for t in xs]
        y = comm.all_reduce(xs[s.rank], op, algo)  # x_after: the flat storage under the view
    else:
        raise ValueError(lay)
    if lay != "inplace":
        s.expect(bool(torch.equal(ref.raw_bits(x_after).flatten(), x_before)), f"{what}: the input was modified")
    s.verify(y, xs, algo, op, what)


@section("values", 180)
def values(s: Suite) -> None:
    """Every algorithm x dtype x op x size x input class x layout, bitwise / bound + cross-rank."""
    comm = s.main
    calls = 0
    for algo in comm.algorithms:
        alg = ALGORITHMS[algo]
        t0 = time.monotonic()
        n_before = calls
        # Ranks sharing one GPU: the 32- and 16-bit float of each width (fp16 and fp64 run where
        # each rank has its own GPU); every size, input class and layout still.
        for dt in [d for d in dtypes_of(algo) if not s.shared or d in SHARED_DTYPES]:
            big = one_pass(alg, dt, s.world, comm.max_blocks)
            sizes = [1, 2, 3, 7, 31, 33, 1000, 4097, 65537, 3 * big + 5]
            for n in sizes:  # sum of random normals, every size; out= poisoned, then out=None
                for rep in range(2 if n <= 65537 else 1):
                    value_case(s, comm, algo, dt, "sum", n, "randn", "out" if rep == 0 else "fresh", rep)
                    calls += 1
            for kind in (SUM_CLASSES if alg.deterministic else tuple(k for k in ref.FINITE_CLASSES if k != "randn")):
                for n in (1, 33, 4097, big + 3):
                    value_case(s, comm, algo, dt, "sum", n, kind, "out")
                    calls += 1
            for op in ("max", "min"):
                if op not in alg.ops:
                    continue
                for kind in ref.NO_SIGNED_ZERO_CLASSES:
                    for n in ((1, 7, 33, 4097, 65537) if kind == "randn" else (33, 4097)):
                        value_case(s, comm, algo, dt, op, n, kind, "out")
                        calls += 1
            kind = "mix" if alg.deterministic else "randn"
            for lay in ("misaligned", "strided", "inplace", "reshaped_out"):
                for n in (5, 1000, 65537):
                    value_case(s, comm, algo, dt, "sum", n, kind, lay)
                    calls += 1
            value_case(s, comm, algo, dt, "sum", 64 * 33, kind, "transposed")
            calls += 1
        comm.check()
        s.log(f"{algo}: {calls - n_before} calls checked in {time.monotonic() - t0:.1f} s")
    x = torch.ones(1000, device=s.dev)
    comm.all_reduce(x)  # the call shape is known: the next calls would take the hot path if they could
    for bad, why in ((torch.empty(1000, dtype=torch.float64, device=s.dev), "dtype"),
                     (torch.empty(1001, device=s.dev), "number of elements"),
                     (torch.empty(2000, device=s.dev)[::2], "not contiguous"),
                     (torch.empty(1000), "cpu")):
        try:
            comm.all_reduce(x, out=bad)
            s.fail(f"out={why}: no error")
        except sollat.UnsupportedError as exc:
            s.expect(why in str(exc), f"out={why}: unclear error {exc}")
    s.log(f"{calls} calls in all")


def rmsnorm_algos() -> list[str]:
    """The fused algorithms to call: the experimental two-shot only with its variable set (as for
    the communicators, which accept it only then)."""
    from sollat.collectives import algorithms, rmsnorm

    return [a for a in rmsnorm.ALGOS if a in rmsnorm.AUTO_ALGOS or algorithms.rmsnorm_twoshot_enabled()] + [
        rmsnorm.UNFUSED]


@section("rmsnorm", 220)  # 150 before the two-shot calls (about a third more calls, 8 more modules)
def rmsnorm_values(s: Suite) -> None:
    """all_reduce_rmsnorm: both protocols x dtype x shape x input class (x from the hash inputs,
    the residual and the weight equal on every rank, as in tensor parallelism), out of place and
    with the residual updated in place; bitwise against sollat.rmsnorm.reference and across ranks.
    The two-shot algorithms (with their variable) the same way, with two input classes and a few
    more rows (fewer rows than ranks, rows not divisible by the ranks, many per block); the unfused
    hand-over (sollat's AllReduce, then the one-GPU epilogue) likewise, its AllReduce included."""
    from sollat.collectives import rmsnorm

    comm = s.main
    calls = 0
    for algo in rmsnorm_algos():
        one = algo in rmsnorm.AUTO_ALGOS
        shapes = ((1, 7), (3, 1000), (8, 8192), (17, 5120), (64, 4096), (2, 16384)) + (
            () if one else ((s.world - 1 or 1, 4096), (2 * s.world + 1, 1000), (300, 2048)))
        for dt in rmsnorm.DTYPES_SUPPORTED:
            for tokens, hidden in shapes:
                for kind in ("randn", "mix", "denormal", "huge") if one else ("randn", "mix"):
                    n = tokens * hidden
                    what = f"rmsnorm {algo} {dname(dt)} {tokens}x{hidden} {kind}"
                    xs = [x.view(tokens, hidden) for x in s.inputs(kind, n, dt, what)]
                    res = ref.make_input(kind, ref.seed_of(s.section, what, "res"), n, dt, s.dev).view(tokens, hidden)
                    w = ref.make_input("randn", ref.seed_of(s.section, what, "w"), hidden, dt, s.dev)
                    in_place = calls % 2 == 1
                    res_before = res.clone()
                    y, r = comm.all_reduce_rmsnorm(xs[s.rank], res, w, 1e-6, algo,
                                                   residual_out=res if in_place else None)
                    s.expect(not in_place or r.data_ptr() == res.data_ptr(), f"{what}: residual not updated in place")
                    want_y, want_r = rmsnorm_want(s, comm, algo, xs, res_before, w, 1e-6)
                    s.expect_bits(what, ((y, want_y, "y"), (r, want_r, "residual_out")))
                    calls += 1
    calls += _rmsnorm_fp8_calls(s, comm)
    comm.check()
    calls += _rmsnorm_batch_invariant_calls(s)
    s.log(f"{calls} calls checked")


def rmsnorm_want(s: Suite, comm: sollat.Communicator, algo: str, xs: list[torch.Tensor], res: torch.Tensor,
                 w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The bits ``all_reduce_rmsnorm(algo)`` must give: rmsnorm.reference of the rank-order sum,
    except where ``unfused`` hands its AllReduce to a library (NCCL, torch's two-shot: real ranks,
    large messages, outside batch-invariant mode), whose order of summation is not rank order from
    3 ranks on (docs/usage.md: which paths keep which bits): then the reference of the sum that library
    path gives (the same call again: every rank gets the same bits)."""
    from sollat import rmsnorm

    if algo == rmsnorm.UNFUSED and s.world > 2:
        x = xs[s.rank]
        path = comm.selected_algorithm(x.numel() * x.element_size(), x.dtype, "sum", deterministic=True)
        if path in select.LIBRARY_PATHS:
            lib_sum = comm.all_reduce(x, algo=path)
            return rmsnorm.reference([lib_sum], res, w, eps)
    return rmsnorm.algo_reference(algo, xs, res, w, eps)


def _rmsnorm_batch_invariant_calls(s: Suite) -> int:
    """A batch-invariant communicator's unfused path keeps rank order at every size and world
    size (its AllReduce never goes to a library): bitwise against rmsnorm.reference, the shapes
    where the plain communicator's hands over included."""
    from sollat import rmsnorm

    bi = s.batch_invariant_comm()
    calls = 0
    for dt in (torch.float32, torch.bfloat16):
        for tokens, hidden in ((300, 2048), (3, 1000), (64, 8192)):
            what = f"rmsnorm batch-invariant unfused {dname(dt)} {tokens}x{hidden}"
            n = tokens * hidden
            path = bi.selected_algorithm(n * esize(dt), dt, "sum", deterministic=True)
            s.expect(path not in select.LIBRARY_PATHS, f"{what}: its AllReduce goes to the library path {path!r}")
            xs = [x.view(tokens, hidden) for x in s.inputs("randn", n, dt, what)]
            res = ref.make_input("randn", ref.seed_of(s.section, what, "res"), n, dt, s.dev).view(tokens, hidden)
            w = ref.make_input("randn", ref.seed_of(s.section, what, "w"), hidden, dt, s.dev)
            y, r = bi.all_reduce_rmsnorm(xs[s.rank], res, w, 1e-6, rmsnorm.UNFUSED)
            want_y, want_r = rmsnorm.reference(xs, res, w, 1e-6)
            s.expect_bits(what, ((y, want_y, "y"), (r, want_r, "residual_out")))
            calls += 1
    bi.check()
    return calls


def _rmsnorm_fp8_calls(s: Suite, comm: sollat.Communicator) -> int:
    """A few calls with the FP8 copy (fp8_scale): y and residual_out bitwise as without it, the
    copy bit for bit against sollat.rmsnorm.fp8_reference (every NaN the byte 0x7F), into a
    poisoned fp8_out (every other call one byte into its buffer: misaligned rows) or a new one;
    the scale changes between calls on the same tensor (read on the device, never on the host)."""
    from sollat.collectives import rmsnorm

    scale = torch.empty(1, dtype=torch.float32, device=s.dev)
    calls = 0
    for algo in rmsnorm_algos():
        for dt in (torch.bfloat16, torch.float32) if algo in rmsnorm.AUTO_ALGOS else (torch.bfloat16,):
            for tokens, hidden in ((1, 7), (8, 8192), (17, 5120)):
                for kind, value in (("randn", 0.02), ("mix", 1.5)):
                    n = tokens * hidden
                    what = f"rmsnorm fp8 {algo} {dname(dt)} {tokens}x{hidden} {kind} scale={value}"
                    xs = [x.view(tokens, hidden) for x in s.inputs(kind, n, dt, what)]
                    res = ref.make_input(kind, ref.seed_of(s.section, what, "res"), n, dt, s.dev).view(tokens, hidden)
                    w = ref.make_input("randn", ref.seed_of(s.section, what, "w"), hidden, dt, s.dev)
                    scale.fill_(value)
                    q_out = None
                    if calls % 2 == 0:
                        buf = torch.full((n + 1,), 0x55, dtype=torch.uint8, device=s.dev)
                        q_out = buf[1:].view(torch.float8_e4m3fn).view(tokens, hidden)
                    y, r, q = comm.all_reduce_rmsnorm(xs[s.rank], res, w, 1e-6, algo, fp8_scale=scale, fp8_out=q_out)
                    s.expect(q_out is None or q is q_out, f"{what}: fp8_out not used")
                    want_y, want_r = rmsnorm.algo_reference(algo, xs, res, w, 1e-6)
                    s.expect_bits(what, ((y, want_y, "y"), (r, want_r, "residual_out")), digest=False)
                    got_q = q.cpu().view(torch.uint8)
                    want_q = rmsnorm.fp8_reference(want_y, scale).view(torch.uint8)
                    bad = (got_q != want_q).flatten().nonzero().flatten()
                    if bad.numel():
                        i = int(bad[0])
                        s.fail(f"{what}: fp8 copy: {bad.numel()} bytes differ; first at {i}: got "
                               f"{int(got_q.flatten()[i]):#04x}, expected {int(want_q.flatten()[i]):#04x}")
                    s.add_digest(f"{what} q", got_q.to(torch.int32))  # every rank: the same bytes
                    calls += 1
    return calls


@section("gather_scatter", 120)
def gather_scatter_values(s: Suite) -> None:
    """comm.all_gather / comm.reduce_scatter on real ranks: LL, sentinel and auto (which hands large
    messages to torch.distributed) x dtype x size x input class x op, into poisoned (NaN) outputs,
    every other call a misaligned view. all_gather bitwise against torch.stack of every rank's input
    (and across ranks: every rank holds the same bits); reduce_scatter bitwise against the
    rank-order reference of this rank's chunk (a call auto hands to NCCL: max/min bitwise, sum
    within the summation bound)."""
    from sollat.collectives import gather_scatter as gs

    comm = s.main
    w = s.world
    calls = 0
    for algo in ("ll", "sentinel", "auto"):
        for dt in DTYPES:
            for n in (1, 3, 1000, 4097, 65537, 300007):
                for kind in (("randn", "mix") if algo != "auto" else ("randn",)):
                    what = f"gather_scatter {algo} {dname(dt)} n={n} {kind}"
                    shift = 3 if calls % 2 else 0  # misaligned output views (and guard elements around them)
                    xs = s.inputs(kind, n, dt, what, "all_gather")
                    obuf = torch.full((w * n + 8,), NAN, dtype=dt, device=s.dev)
                    y = comm.all_gather(xs[s.rank], out=obuf[shift:shift + w * n].view(w, n), algo=algo)
                    want = gs.all_gather_reference(xs)
                    if int(ref.bitwise_bad(y, want)):
                        s.fail(f"{what} all_gather: {ref.first_difference(y, want)}")
                    s.expect(bool(torch.isnan(obuf[:shift]).all()) and bool(torch.isnan(obuf[shift + w * n:]).all()),
                             f"{what} all_gather: wrote outside the output view")
                    s.add_digest(f"{what} all_gather", y)
                    op = ("sum", "max", "min")[calls % 3]
                    xr = s.inputs(kind, w * n, dt, what, "reduce_scatter", op)
                    obuf = torch.full((n + 8,), NAN, dtype=dt, device=s.dev)
                    y = comm.reduce_scatter(xr[s.rank], out=obuf[shift:shift + n], op=op, algo=algo)
                    want = gs.reduce_scatter_reference(xr, op)[s.rank]
                    handed = algo == "auto" and gs.resolve("reduce_scatter", "auto", n * esize(dt), library=True,
                                                           enabled=True) == "nccl"
                    if handed and op == "sum":
                        bad = int(ref.sum_bound_bad(y, [x.view(w, n)[s.rank] for x in xr]))
                        s.expect(bad == 0, f"{what} reduce_scatter (NCCL) {op}: {bad} elements outside the bound")
                    elif int(ref.bitwise_bad(y, want)):
                        s.fail(f"{what} reduce_scatter {op}: {ref.first_difference(y, want)}")
                    s.expect(bool(torch.isnan(obuf[:shift]).all()) and bool(torch.isnan(obuf[shift + n:]).all()),
                             f"{what} reduce_scatter: wrote outside the output view")
                    calls += 1
    comm.check()
    s.log(f"{calls} all_gather + reduce_scatter pairs checked")


AUTO_BYTES = tuple(4 << (2 * k) for k in range(13))  # 4 B .. 64 MiB
AUTO_DETERMINISTIC_BYTES = (4, 4096, 1 << 20, 64 << 20)
TORCH_TWOSHOT_BYTES = 64 << 20  # the main communicator's torch two-shot buffer (handover path)


@section("auto", 60)
def auto(s: Suite) -> None:
    """algo="auto" from 4 B to 64 MiB (NCCL above the table), and deterministic=True."""
    comm = s.main
    picks: list[str] = []
    for dt in (torch.float32, torch.bfloat16):
        for nbytes in AUTO_BYTES:
            n = max(1, nbytes // esize(dt))
            pick = comm.selected_algorithm(n * esize(dt), dt, "sum")
            xs = s.inputs("randn", n, dt, "auto", nbytes)
            out = torch.full_like(xs[s.rank], NAN)
            y = comm.all_reduce(xs[s.rank], out=out)
            s.verify(y, xs, pick, "sum", f"auto {dname(dt)} {nbytes} B -> {pick}")
            picks.append(f"{dname(dt)}:{nbytes}->{pick}")
    for nbytes in AUTO_DETERMINISTIC_BYTES:
        n = nbytes // 4
        pick = comm.selected_algorithm(nbytes, torch.float32, "sum", deterministic=True)
        s.expect(pick not in ALGORITHMS or ALGORITHMS[pick].deterministic,
                 f"deterministic=True picked the non-deterministic {pick!r} at {nbytes} B")
        xs = s.inputs("randn", n, torch.float32, "auto-det", nbytes)
        y = comm.all_reduce(xs[s.rank], deterministic=True)
        s.verify(y, xs, pick, "sum", f"auto deterministic float32 {nbytes} B -> {pick}")
        picks.append(f"det:{nbytes}->{pick}")
    for nbytes in (4096, 1 << 20):  # algo="nccl" by name
        xs = s.inputs("randn", nbytes // 4, torch.float32, "nccl", nbytes)
        y = comm.all_reduce(xs[s.rank], algo="nccl", out=torch.full_like(xs[s.rank], NAN))
        s.verify(y, xs, "nccl", "sum", f"algo=nccl float32 {nbytes} B")
    # algo="torch_twoshot" by name: sizes around its chunking, in place and out of place; an odd
    # bfloat16 count, another op or fp16 is a clear error on every rank before anything runs. At a
    # world size torch has no kernel for (handover.TORCH_SYMM_WORLD_SIZES) it is never chosen, and
    # naming it is a clear error.
    if s.world not in TORCH_SYMM_WORLD_SIZES:
        s.expect(select.TORCH_TWOSHOT not in comm.handovers, f"torch's two-shot offered at {s.world} ranks")
        s.expect(all(not p.endswith(select.TORCH_TWOSHOT) for p in picks), f"auto picked torch's two-shot: {picks}")
        try:
            comm.all_reduce(torch.ones(8, device=s.dev), algo="torch_twoshot")
            s.fail(f"algo=torch_twoshot at {s.world} ranks: no error")
        except sollat.UnsupportedError as exc:
            s.expect(f"this group has {s.world}" in str(exc), f"algo=torch_twoshot at {s.world} ranks: unclear error {exc}")
        comm.check()
        s.log("picks " + " ".join(picks))
        return
    for dt in (torch.float32, torch.bfloat16):
        for n in (2, 6, 1000, 4098, 65536 + 2, (1 << 20) + 6, TORCH_TWOSHOT_BYTES // esize(dt)):
            xs = s.inputs("randn", n, dt, "torch_twoshot", n)
            what = f"algo=torch_twoshot {dname(dt)} n={n}"
            if n % 4:
                y = comm.all_reduce(xs[s.rank], algo="torch_twoshot", out=torch.full_like(xs[s.rank], NAN))
            else:
                y = xs[s.rank].clone()
                comm.all_reduce(y, algo="torch_twoshot", out=y)
            s.verify(y, xs, "torch_twoshot", "sum", what)
    for dt, n, op, why in ((torch.bfloat16, 7, "sum", "multiples of 4 bytes"), (torch.float16, 8, "sum", "float16"),
                           (torch.float32, 8, "max", "'max'"), (torch.float32, TORCH_TWOSHOT_BYTES // 4 + 1, "sum", "exceed")):
        try:
            comm.all_reduce(torch.ones(n, dtype=dt, device=s.dev), op=op, algo="torch_twoshot")
            s.fail(f"algo=torch_twoshot {dname(dt)} n={n} op={op}: no error")
        except sollat.UnsupportedError as exc:
            s.expect(why in str(exc), f"algo=torch_twoshot {dname(dt)} n={n} op={op}: unclear error {exc}")
    comm.check()
    s.log("picks " + " ".join(picks))


@section("symmetric", 60)
def symmetric(s: Suite) -> None:
    """Tensors in symmetric memory (comm.empty). In place, where auto hands over, torch's two-shot
    reduces them where they are (no copy), at aligned offsets; out of place, or misaligned, they
    take the ordinary paths and the input is left as it was; a call in place on such a tensor on
    one rank only is refused on every rank."""
    comm = s.main
    for dt in (torch.float32, torch.bfloat16):
        big = comm.empty((64 << 20) // esize(dt) + 4096, dtype=dt)
        for nbytes, offset in ((256, 0), (1 << 20, 0), (8 << 20, 0), (8 << 20, 1024), (8 << 20 | 64, 8),
                               (64 << 20, 0), (6 << 20, 3)):
            n = nbytes // esize(dt)
            plain = comm.selected_algorithm(n * esize(dt), dt, "sum")
            aligned = (offset * esize(dt)) % 16 == 0
            pick = comm.selected_algorithm(n * esize(dt), dt, "sum", symmetric=True) if aligned else plain
            if plain in select.HANDOVERS and aligned and s.world in TORCH_SYMM_WORLD_SIZES:
                s.expect(pick == select.TORCH_TWOSHOT_ZERO_COPY, f"symmetric {dname(dt)} {nbytes} B: auto picks "
                         f"{pick!r}, not the zero-copy two-shot (plain input: {plain!r})")
            if s.world not in TORCH_SYMM_WORLD_SIZES:  # torch has no kernel for this world size
                s.expect(pick != select.TORCH_TWOSHOT_ZERO_COPY, f"symmetric {dname(dt)} {nbytes} B: torch's "
                         f"two-shot picked at {s.world} ranks")
            xs = s.inputs("randn", n, dt, "symmetric", nbytes, offset)
            x = big[offset:offset + n]
            for in_place in (False, True):
                x.copy_(xs[s.rank])
                what = f"symmetric {dname(dt)} {nbytes} B offset {offset} {'in place' if in_place else 'out'}"
                y = comm.all_reduce(x, out=x if in_place else torch.full_like(x, NAN))
                s.verify(y.clone(), xs, pick if in_place else plain, "sum", f"{what} -> {pick if in_place else plain}")
                if not in_place:
                    s.expect(torch.equal(x, xs[s.rank]), f"{what}: the input changed")
    comm.check()
    # a new call, in place on a symmetric tensor on rank 0 only: refused on every rank before it
    # runs (a call shape is agreed on at its first use; later the library's own rules apply)
    n = (8 << 20) // 4 + 4096
    sym = comm.empty(n, dtype=torch.float32)
    x = sym if s.rank == 0 else torch.zeros(n, device=s.dev)
    try:
        comm.all_reduce(x, out=x)
        s.fail("in place on a symmetric tensor on rank 0 only: no error")
    except sollat.CallMismatchError as exc:
        s.log(f"symmetric on rank 0 only: {type(exc).__name__} raised")
    comm.reset()


# ---- 2. graphs -------------------------------------------------------------------------------


@dataclass
class GCall:
    algo: str
    dt: torch.dtype
    op: str
    n: int
    x: torch.Tensor
    out: torch.Tensor


def warm_and_capture(comm: sollat.Communicator, calls: list[GCall], dev: torch.device) -> torch.cuda.CUDAGraph:
    """Every call once eagerly on a side stream (compile, first-use agreement), as torch.cuda.graph
    captures on one, then all of them captured into one graph."""
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        for c in calls:
            comm.all_reduce(c.x, c.op, c.algo, out=c.out)
    torch.cuda.current_stream(dev).wait_stream(side)
    torch.cuda.synchronize(dev)
    comm.check()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            comm.all_reduce(c.x, c.op, c.algo, out=c.out)
    torch.cuda.synchronize(dev)
    return g


@section("graphs", 120)
def graphs(s: Suite) -> None:
    """One CUDA graph of 100 mixed calls, replayed >= 100 times with fresh inputs: >= 10,000 calls."""
    comm = s.main
    algos = comm.algorithms
    replays = int(env_float("SOLLAT_MP_GRAPH_REPLAYS", SHARED_GRAPH_REPLAYS if s.shared else 100))
    sizes = (1, 7, 128, 1000, 4097, 20000, 65536)
    calls: list[GCall] = []
    for k in range(100):
        algo = algos[(k // 3) % len(algos)]
        alg = ALGORITHMS[algo]
        dt = DTYPES[k % 4] if DTYPES[k % 4] in alg.dtypes else torch.float32
        op = "max" if (k % 5 == 4 and "max" in alg.ops) else "sum"
        n = sizes[(k * 3 + k // 7) % len(sizes)]
        calls.append(GCall(algo, dt, op, n, torch.zeros(n, dtype=dt, device=s.dev),
                           torch.full((n,), NAN, dtype=dt, device=s.dev)))
    g = warm_and_capture(comm, calls, s.dev)
    by_dtype: dict[torch.dtype, list[int]] = {}
    for i, c in enumerate(calls):
        by_dtype.setdefault(c.dt, []).append(i)
    t0 = time.monotonic()
    for rep in range(replays):
        xs_of: list[list[torch.Tensor]] = [[] for _ in calls]
        for dt, idx in by_dtype.items():  # one generation per (dtype, rank), sliced per call
            total = sum(calls[i].n for i in idx)
            bigs = [ref.make_input("randn", ref.seed_of("graphs", rep, dname(dt), r), total, dt, s.dev) for r in range(s.world)]
            off = 0
            for i in idx:
                n = calls[i].n
                xs_of[i] = [b[off:off + n] for b in bigs]
                off += n
        for c, xs in zip(calls, xs_of, strict=True):
            c.x.copy_(xs[s.rank])
            c.out.fill_(NAN)
        g.replay()
        bads = []
        for c, xs in zip(calls, xs_of, strict=True):
            if is_deterministic(c.algo):
                bads.append(ref.bitwise_bad(c.out, ref.rank_order_reduce(xs, c.op)))
            else:
                bads.append(ref.sum_bound_bad(c.out, xs))
        counts = torch.stack(bads).cpu().tolist()
        for k, (c, bad) in enumerate(zip(calls, counts, strict=True)):
            if bad:
                s.fail(f"replay {rep} call {k} ({c.algo} {dname(c.dt)} {c.op} n={c.n}): {bad} of {c.n} elements wrong")
        s.add_digest(f"replay {rep}", torch.cat([ref.raw_bits(c.out).view(torch.uint8) for c in calls]))
    comm.check()
    s.log(f"{replays * len(calls)} graph-replayed calls checked ({replays} replays of {len(calls)} calls) "
          f"in {time.monotonic() - t0:.1f} s")


# ---- 3. straggler ----------------------------------------------------------------------------


@section("straggler", 60)
def straggler(s: Suite) -> None:
    """One rank sleeps 1.5 s before a call (cached and first-use shapes): correct, no fault."""
    comm = s.main
    cases: list[tuple[str, int, int]] = []  # (algo, n, late rank)
    for i, algo in enumerate(comm.algorithms):
        cases.append((algo, 4097, s.world - 1))
        if not s.shared or i % 2 == 0:  # sharing a GPU: every other algorithm's first-use case
            cases.append((algo, 6001 + 10 * i, s.world - 1))  # a shape never used before
    if "oneshot_ll" in comm.algorithms:
        cases.append(("oneshot_ll", 4097, 0))
    for algo, n, late in cases:
        xs = s.inputs("randn", n, torch.float32, algo, n, late)
        if n == 4097:
            comm.all_reduce(xs[s.rank], algo=algo)  # the shape is cached before the straggling call
            comm.check()
        s.barrier("start")
        if s.rank == late:
            time.sleep(STRAGGLER_SLEEP_S)
        t0 = time.monotonic()
        y = comm.all_reduce(xs[s.rank], "sum", algo, out=torch.full_like(xs[s.rank], NAN))
        comm.check()
        waited = time.monotonic() - t0
        what = f"{algo} n={n} rank {late} late by {STRAGGLER_SLEEP_S} s"
        s.verify(y, xs, algo, "sum", what)
        s.log(f"{what}: no fault; this rank's call + check took {waited:.2f} s")


# ---- 4. mismatch -----------------------------------------------------------------------------
#
# A call that differs between ranks must never give any rank a finite result: every rank raises,
# from the call itself (the host agreement: first use of a call shape, or any call a library
# path serves) or from the next check (the kernels: the call signature rides with the data).
#
# Which ranks make the other call: the first, a middle one, the last, and half of them
# (DIFFERING). The matrix is not the full cross product (ops x algorithms x argument kinds x
# differing ranks, at 3 and 4 processes, would take tens of minutes where processes time-slice
# one GPU at milliseconds a call). Instead every (op or algorithm, argument kind) pair runs once,
# with the differing set number (algorithm index + kind index) % 4 in ``mismatch`` and (case
# index) % 4 in ``mismatch_other``, whose cases run kind by kind, 7 per algorithm. So every
# algorithm meets every differing set (it has 4 or more kinds) and every argument kind meets every
# differing set (it runs on 4 or more algorithms, each shifting the set by one or by three). The
# suite runs at 3 and at 4 processes (tests/gpu/test_multiprocess.py), where "middle" and "half"
# are other ranks (1 and [1, 2] of 3; 2 and [1, 2] of 4).
#
# A PeerTimeoutError passes only where the two calls run different kernels (another algorithm or
# protocol, or a library path against a kernel: a rank waits for lines no peer writes). Where both
# calls run the same kernel the signature must be seen: only CallMismatchError passes.


def differing_sets(world: int) -> list[tuple[str, tuple[int, ...]]]:
    """The ranks that make the other call: the first, a middle one, the last, and half of them
    (ranks 1..ceil(world / 2): ranks 1 and 2 of 3 or of 4)."""
    return [("first", (0,)), ("middle", (world // 2,)), ("last", (world - 1,)),
            ("half", tuple(range(1, 1 + (world + 1) // 2)))]


def differing(s: Suite, i: int) -> tuple[str, tuple[int, ...]]:
    """Case i's differing ranks: "name (ranks)" and the ranks."""
    name, ranks = differing_sets(s.world)[i % 4]
    return f"{name} {list(ranks)}", ranks


Spec = tuple[str, torch.dtype, str, int]  # (algo, dtype, op, n); algo may be "nccl" (the library path)


def serves(algo: str, dt: torch.dtype | None = None, op: str | None = None) -> bool:
    if algo == select.NCCL:
        return True
    alg = ALGORITHMS[algo]
    return (dt is None or dt in alg.dtypes) and (op is None or op in alg.ops)


def mismatch_specs(algos: tuple[str, ...], algo: str, kind: str, n: int) -> tuple[Spec, Spec] | None:
    """(what most ranks call, what the differing ranks call): they differ in one argument, with data
    that differs too (another size, another dtype over the same bytes, another op, another kernel)."""
    base: Spec = (algo, torch.float32, "sum", n)
    if kind == "size":
        return base, (algo, torch.float32, "sum", n + 64)
    if kind == "size_same_lines":  # one element more: the same lines, the same launch
        return base, (algo, torch.float32, "sum", n + 1)
    if kind == "dtype":
        return (base, (algo, torch.bfloat16, "sum", n)) if serves(algo, torch.bfloat16) else None
    if kind == "dtype_same_bytes":  # fp32 n against bf16 2n: the same bytes, lines and launch
        if algo == select.NCCL:  # float64 (every torch.distributed backend reduces it): n / 2
            return base, (algo, torch.float64, "sum", n // 2)
        return (base, (algo, torch.bfloat16, "sum", 2 * n)) if serves(algo, torch.bfloat16) else None
    if kind == "op":
        return (base, (algo, torch.float32, "max", n)) if serves(algo, op="max") else None
    others = [a for a in algos if a != algo]
    if kind == "algorithm":
        return (base, (others[algos.index(algo) % len(others)] if algo in algos else others[0], torch.float32, "sum",
                       n)) if others else None
    raise ValueError(kind)


MISMATCH_KINDS = ("size", "size_same_lines", "dtype", "dtype_same_bytes", "op", "algorithm")
# On shapes every rank used before: the kinds whose calls have the same bytes (only the signature
# can tell them apart) and the algorithm; "size" and "dtype" (other bytes) run on first use.
CACHED_KINDS = ("size_same_lines", "dtype_same_bytes", "op", "algorithm")


def spec_str(sp: Spec) -> str:
    return f"{sp[0]}/{dname(sp[1])}/{sp[2]}/n={sp[3]}"


def expect_no_finite_result(s: Suite, comm: sollat.Communicator, call: Callable[[], list[torch.Tensor]],
                            what: str) -> tuple[sollat.SollatError | None, str]:
    """Runs one mismatched call (its outputs poisoned with the finite POISON first: ``call`` does
    that and returns them) and checks what this rank must see: the call raises, or its output is
    NaN in every element and check() raises within timeout_s + FAULT_SLACK_S. A finite element is
    a result taken from a call with other arguments. Returns (error, where it was raised)."""
    t0 = time.monotonic()
    try:
        outs = call()
    except sollat.SollatError as e:
        return e, f"call after {time.monotonic() - t0:.2f} s"
    err, _ = poll_fault(comm, getattr(comm, "timeout_s", FAST_TIMEOUT_S) + FAULT_SLACK_S)
    where = f"check after {time.monotonic() - t0:.2f} s"
    if err is None:
        s.fail(f"{what}: the call returned and nothing was raised on this rank")
    for k, y in enumerate(outs):
        finite = int((~torch.isnan(y.float())).sum()) if y.is_floating_point() else int((y.view(torch.uint8) != 0x7F).sum())
        if finite:
            s.fail(f"{what}: output {k} kept {finite} finite elements of {y.numel()} (taken from a call with other "
                   "arguments; a mismatched call must leave NaN everywhere)")
    return err, where


def check_mismatch_error(s: Suite, err: sollat.SollatError | None, where: str, desc: str,
                         different_kernels: bool) -> None:
    """The error of a mismatched call: CallMismatchError; where the ranks ran different kernels
    (another algorithm or protocol, a library path against a kernel) a PeerTimeoutError also
    passes, since a rank may wait for lines no peer writes."""
    ok_types: tuple[type[Exception], ...] = (sollat.CallMismatchError,)
    if different_kernels:
        ok_types = (sollat.CallMismatchError, sollat.PeerTimeoutError)
    if err is None:
        return  # already failed in expect_no_finite_result
    if not isinstance(err, ok_types):
        s.fail(f"{desc}: expected {'/'.join(t.__name__ for t in ok_types)}, got {describe(err)}: {err}")
    else:
        own = "own" if getattr(err, "rank", None) == s.rank else "propagated"
        s.log(f"{desc}: {describe(err)} ({own}) raised by the {where}")


def correct_call(s: Suite, comm: sollat.Communicator, sp: Spec, tag: str) -> None:
    algo, dt, op, n = sp
    xs = s.inputs("randn", n, dt, tag, spec_str(sp))
    y = comm.all_reduce(xs[s.rank], op, algo, out=torch.full_like(xs[s.rank], NAN))
    # max and min have one result in any order: bitwise, also where a library reduces them
    s.verify(y, xs, "oneshot_ll" if algo == select.NCCL and op != "sum" else algo, op, f"{tag} {spec_str(sp)}")


def mismatched_all_reduce(s: Suite, comm: sollat.Communicator, base: Spec, alt: Spec, tag: str,
                          ranks: tuple[int, ...]) -> list[torch.Tensor]:
    """``ranks`` call `alt`, the others `base`, into an output poisoned with POISON."""
    sp = alt if s.rank in ranks else base
    algo, dt, op, n = sp
    x = s.inputs("randn", n, dt, tag, spec_str(sp))[s.rank]
    out = torch.full_like(x, POISON)
    comm.all_reduce(x, op, algo, out=out)
    return [out]


def all_reduce_matrix(algos: tuple[str, ...]) -> list[tuple[str, str, str, int]]:
    """The all_reduce mismatch cases: (phase, algorithm or library path, kind, differing set's
    number = algorithm index + kind index): on first use every algorithm and kind; on shapes every
    rank used before, every algorithm and the NCCL library path with CACHED_KINDS."""
    out = []
    for phase in ("first-use", "cached"):
        paths = algos if phase == "first-use" else (*algos, select.NCCL)
        for a, algo in enumerate(paths):
            for k, kind in enumerate(MISMATCH_KINDS if phase == "first-use" else CACHED_KINDS):
                out.append((phase, algo, kind, a + k))
    return out


@section("mismatch", 150)
def mismatch(s: Suite) -> None:
    """all_reduce calls that differ between ranks (the first, a middle one, the last or half of
    them) in size (also by one element: the same lines), dtype (also over the same bytes), op or
    algorithm, on every algorithm: (a) on first use (the host's agreement raises before any
    kernel), (b) on shapes every rank used before, every algorithm and the NCCL library path (the
    kernels must see it, the library path's agreement of every call raises before the library
    runs: every rank raises, and no rank keeps a finite element of the call); then reset() and a
    correct call. (c) The signature hook: one rank flips a bit of its signature."""
    f = s.fast
    algos = f.algorithms
    for i, (phase, algo, kind, pattern) in enumerate(all_reduce_matrix(algos), start=1):
        n = (21002 if phase == "first-use" else 31002) + 64 * i  # sizes no other section uses (even)
        specs = mismatch_specs(algos, algo, kind, n)
        what = f"{phase} {kind} mismatch on {algo}"
        if specs is None:
            s.log(f"{what}: not applicable ({algo} supports one {kind.split('_')[0]})")
            continue
        base, alt = specs
        who, ranks = differing(s, pattern)
        if phase == "cached":
            correct_call(s, f, base, "warm")
            correct_call(s, f, alt, "warm")
            f.check()
        s.barrier("mismatch")
        desc = f"{what} ({spec_str(base)} vs {spec_str(alt)} on the {who} rank(s))"
        err, where = expect_no_finite_result(
            s, f, lambda b=base, o=alt, w=what, r=ranks: mismatched_all_reduce(s, f, b, o, w, r), desc)
        if phase == "first-use":
            if not isinstance(err, sollat.CallMismatchError) or not where.startswith("call"):
                s.fail(f"{desc}: expected CallMismatchError from the call itself, got "
                       f"{'nothing' if err is None else describe(err)} from the {where}")
        else:
            check_mismatch_error(s, err, where, desc, different_kernels=base[0] != alt[0])
            if base[0] == alt[0] == select.NCCL:  # refused before the library ran
                s.expect(where.startswith("call"), f"{desc}: the library path's call did not raise itself")
        f.reset()
        correct_call(s, f, base, f"recovery after {what}")
        f.check()
    # (c) the signature hook: one rank flips a bit of its signature and sends its own data
    testing = testing_module()
    for a, algo in enumerate(algos):
        base = (algo, torch.float32, "sum", 4097)
        flipped = differing_sets(s.world)[a % 3][1][0]  # the first, a middle or the last rank
        correct_call(s, f, base, "warm")
        f.check()
        s.barrier("hook")
        testing.inject(f, mismatch=flipped)
        what = f"signature hook on rank {flipped}, {algo}"
        err, where = expect_no_finite_result(s, f, lambda b=base, w=what: mismatched_all_reduce(s, f, b, b, w, ()),
                                             what)
        if not isinstance(err, sollat.CallMismatchError):
            s.fail(f"{what}: expected CallMismatchError on every rank, got {'nothing' if err is None else describe(err)}")
        else:
            s.expect(flipped in (err.rank, err.peer) or (algo == "ll128" and err.peer == -1),
                     f"{what}: {describe(err)} names neither rank {flipped}")
            s.log(f"{what}: {describe(err)} raised by the {where}")
        testing.clear(f)
        f.reset()
        correct_call(s, f, base, f"recovery after hook {algo}")
        f.check()


def _gs_call(s: Suite, comm: sollat.Communicator, kind: str, algo: str, dt: torch.dtype, n: int, op: str,
             tag: str) -> list[torch.Tensor]:
    """One all_gather (n elements in) or reduce_scatter (world * n in) into a POISON output."""
    w = s.world
    if kind == "all_gather":
        x = s.inputs("randn", n, dt, tag)[s.rank]
        out = torch.full((w, n), POISON, dtype=dt, device=s.dev)
        comm.all_gather(x, out=out, algo=algo)
    else:
        x = s.inputs("randn", w * n, dt, tag)[s.rank]
        out = torch.full((n,), POISON, dtype=dt, device=s.dev)
        comm.reduce_scatter(x, out=out, op=op, algo=algo)
    return [out]


@dataclass(frozen=True)
class NormCall:
    """One all_reduce_rmsnorm call of the mismatch tests. fp8: "" (no FP8 copy), "copy"
    (fp8_scale and fp8_out given) or "scale" (fp8_scale given, fp8_out allocated by the call)."""

    algo: str
    rows: int
    hidden: int
    eps: float = 1e-6
    fp8: str = ""
    dtype: torch.dtype = torch.bfloat16

    def resolved(self, comm: Any) -> str:
        """The algorithm that runs: ``auto``'s pick, else the name."""
        if self.algo != "auto":
            return self.algo
        return comm.selected_rmsnorm_algorithm(self.rows * self.hidden * esize(self.dtype), self.dtype, self.rows)

    def kernel(self, comm: Any) -> str:
        """What runs on the device: the fused algorithm, or the unfused one's AllReduce."""
        name = self.resolved(comm)
        if name != "unfused":
            return name
        return "unfused:" + comm.selected_algorithm(self.rows * self.hidden * esize(self.dtype), self.dtype, "sum",
                                                    deterministic=True)


def _rmsnorm_call(s: Suite, comm: sollat.Communicator, c: NormCall, tag: str) -> list[torch.Tensor]:
    """One all_reduce_rmsnorm into POISON outputs (y, residual_out[, the FP8 copy as bytes])."""
    rows, hidden, dt = c.rows, c.hidden, c.dtype
    x = s.inputs("randn", rows * hidden, dt, tag)[s.rank].view(rows, hidden)
    res = ref.make_input("randn", ref.seed_of(s.section, tag, "res"), rows * hidden, dt, s.dev).view(rows, hidden)
    w = ref.make_input("randn", ref.seed_of(s.section, tag, "w"), hidden, dt, s.dev)
    y, r = torch.full_like(x, POISON), torch.full_like(res, POISON)
    if c.fp8:
        scale = torch.full((1,), 0.05, device=s.dev)
        q = torch.full((rows, hidden), 0, dtype=torch.float8_e4m3fn, device=s.dev) if c.fp8 == "copy" else None
        got = comm.all_reduce_rmsnorm(x, res, w, c.eps, c.algo, out=y, residual_out=r, fp8_scale=scale, fp8_out=q)
        return [y, r, got[2].view(torch.uint8)]
    comm.all_reduce_rmsnorm(x, res, w, c.eps, c.algo, out=y, residual_out=r)
    return [y, r]


def auto_unfused_shape(comm: Any) -> tuple[int, int] | None:
    """(rows, hidden) of a bf16 call where ``auto`` picks ``unfused`` (None: no such shape here)."""
    for rows, hidden in ((4, 1024), (8, 512), (3, 2048), (16, 256), (64, 1024)):
        if NormCall("auto", rows, hidden).resolved(comm) == "unfused":
            return rows, hidden
    return None


def rmsnorm_mismatch_cases(comm: Any) -> list[tuple[str, NormCall, NormCall, int]]:
    """(what, the call of most ranks, the differing ranks' call, the differing set's number: base
    index + kind index) for every algorithm (the fused one-shots, unfused, auto where it picks
    unfused and where it picks a fused one, and unfused on a library path) and every argument that
    changes a rank's output: eps, hidden at the same element count, rows, the FP8 copy (fp8_scale
    with fp8_out, and fp8_scale alone), dtype over the same bytes, algorithm. (The weight and the
    residual must have x's dtype and shape, so they cannot differ alone; their values, like x's and
    the scale's, are data.)"""
    bases = [NormCall("oneshot_ll", 4, 1024), NormCall("oneshot_sentinel", 4, 1024), NormCall("unfused", 4, 1024)]
    shape = auto_unfused_shape(comm)
    if shape is not None:
        bases.append(NormCall("auto", *shape))
    if NormCall("auto", 1, 1024).resolved(comm) != "unfused":
        bases.append(NormCall("auto", 1, 1024))
    out: list[tuple[str, NormCall, NormCall, int]] = []
    for g, b in enumerate(bases):
        tag = f"{b.algo}({b.resolved(comm)}) {b.rows}x{b.hidden}"
        other = {"oneshot_ll": "oneshot_sentinel", "oneshot_sentinel": "unfused"}.get(b.resolved(comm), "oneshot_ll")
        same_numel = replace(b, rows=b.rows * 2, hidden=b.hidden // 2)
        kinds = [(f"rmsnorm {tag} eps", b, replace(b, eps=1e-5)),
                 (f"rmsnorm {tag} hidden at the same element count", b, same_numel),
                 (f"rmsnorm {tag} rows", b, replace(b, rows=b.rows + 1)),
                 (f"rmsnorm {tag} fp8 copy", b, replace(b, fp8="copy")),
                 (f"rmsnorm {tag} fp8 scale", b, replace(b, fp8="scale")),
                 (f"rmsnorm {tag} dtype over the same bytes", b, replace(b, dtype=torch.float16)),
                 (f"rmsnorm {tag} algorithm", b, replace(b, algo=other))]
        out += [(*c, g + k) for k, c in enumerate(kinds)]
    # unfused where its AllReduce is handed to a library (the table's sizes above its last rule):
    # refused by the agreement of every library call, before the library runs
    big = NormCall("unfused", 1024, 4096)
    if big.kernel(comm) in ("unfused:" + p for p in select.LIBRARY_PATHS):
        tag = f"unfused ({big.kernel(comm)}) {big.rows}x{big.hidden}"
        out += [(f"rmsnorm {tag} eps", big, replace(big, eps=1e-5), 0),
                (f"rmsnorm {tag} hidden at the same element count", big, replace(big, rows=2048, hidden=2048), 1),
                (f"rmsnorm {tag} fp8 copy", big, replace(big, fp8="copy"), 3)]
    return out


@section("mismatch_other", 200)  # about 60 cases, a tenth of them waiting out a 2 s timeout
def mismatch_other(s: Suite) -> None:
    """The other collectives on shapes every rank used before, the differing ranks the first, a
    middle one, the last or half of them in turn: all_gather and reduce_scatter (size by one
    element, dtype over the same bytes, op, protocol), all_reduce_rmsnorm (rmsnorm_mismatch_cases:
    every algorithm, unfused and auto included, every argument) and a user-written collective
    (size, dtype over the same bytes): every rank raises and no rank keeps a finite element (the
    FP8 copy: no byte but the NaN byte) of the mismatched call."""
    maxabs = load_example("maxabs_allreduce")
    colls = {p: sollat.custom.Collective(f"maxabs_{p}", maxabs.SOURCE.read_text().replace("(maxabs,", f"(maxabs_{p},"),
                                         proto=p, max_slots=2) for p in ("ll", "sentinel")}
    f = s.new_comm(timeout_s=FAST_TIMEOUT_S, collectives=list(colls.values()))
    # (what, most ranks' call, the differing ranks' call, whether the two run different kernels,
    # the differing set's number: group + kind index, so that every group (an op on one algorithm)
    # and every argument kind meets every differing set, see above)
    cases: list[tuple[str, Callable[[], list[torch.Tensor]], Callable[[], list[torch.Tensor]], bool, int]] = []
    n = 4096 + 8
    group = 0
    for kind in ("all_gather", "reduce_scatter"):
        for algo, other in (("ll", "sentinel"), ("sentinel", "ll")):
            def gs(a: str = algo, k: str = kind, dt: torch.dtype = torch.float32, m: int = n, op: str = "sum",
                   tag: str = "") -> Callable[[], list[torch.Tensor]]:
                return lambda: _gs_call(s, f, k, a, dt, m, op, f"{k}-{a}-{tag}")
            kinds = [(f"{kind} {algo} size by one element", gs(), gs(m=n + 1), False),
                     (f"{kind} {algo} dtype over the same bytes", gs(), gs(dt=torch.bfloat16, m=2 * n), False),
                     (f"{kind} {algo} protocol", gs(), gs(a=other), True)]
            if kind == "reduce_scatter":
                kinds.append((f"{kind} {algo} op", gs(), gs(op="max"), False))
            cases += [(*c, group + k) for k, c in enumerate(kinds)]
            group += 1
    for what, b, alt, pattern in rmsnorm_mismatch_cases(f):
        cases.append((what, lambda c=b, w=what: _rmsnorm_call(s, f, c, w),
                      lambda c=alt, w=what: _rmsnorm_call(s, f, c, w), b.kernel(f) != alt.kernel(f), pattern))
    for g, (proto, coll) in enumerate(colls.items()):
        def run(dt: torch.dtype = torch.float32, m: int = 20000, c: Any = coll) -> Callable[[], list[torch.Tensor]]:
            def go() -> list[torch.Tensor]:
                x = s.inputs("randn", m, dt, f"custom-{c.name}")[s.rank]
                out = torch.full_like(x, POISON)
                f.run(c, x, out=out)
                return [out]
            return go
        cases += [(f"user collective {proto} size", run(), run(m=20004), False, 2 * g),
                  (f"user collective {proto} dtype", run(), run(dt=torch.bfloat16, m=40000), False, 2 * g + 1)]
    for what, base, alt, different_kernels, pattern in cases:
        for warm in (base, alt):  # both shapes known on every rank: only the device (or a library call's agreement) can tell
            outs = warm()
            torch.cuda.synchronize(s.dev)
            f.check()
            s.expect(all(not bool(torch.isnan(o.float()).all()) for o in outs if o.is_floating_point()),
                     f"{what}: a correct warm-up call left NaN")
        who, ranks = differing(s, pattern)
        desc = f"{what} (the {who} rank(s) differ)"
        s.barrier("mismatch_other")
        err, where = expect_no_finite_result(s, f, alt if s.rank in ranks else base, desc)
        check_mismatch_error(s, err, where, desc, different_kernels)
        f.reset()
        base()
        f.check()
    s.log(f"{len(cases)} mismatched calls checked")


# ---- 5. dead peer ----------------------------------------------------------------------------


def faulted_output_bad(algo: str, out: torch.Tensor, xs: list[torch.Tensor]) -> int:
    if is_deterministic(algo):
        return int(ref.nan_or_exact_bad(out, ref.rank_order_reduce(xs, "sum")))
    return int(ref.nan_or_within_bound_bad(out, xs))


def check_names_absent(s: Suite, err: sollat.SollatError | None, algo: str, what: str) -> None:
    absent = s.world - 1
    if not isinstance(err, sollat.PeerTimeoutError):
        s.fail(f"{what}: expected PeerTimeoutError, got {'nothing' if err is None else describe(err)}")
        return
    if err.peer == absent:
        return
    if algo == "ll128" and err.peer == -1:  # a line counter that did not reach R cannot name the peer
        s.log(f"{what}: peer -1 accepted for ll128 (an LL128 line counter cannot name the missing rank)")
        return
    s.fail(f"{what}: the error names peer {err.peer}, expected {absent}")


@section("dead_peer", 120)
def dead_peer(s: Suite) -> None:
    """The last rank's kernels return at once: every rank raises PeerTimeoutError naming it within
    timeout_s + a few s; outputs NaN or exact; a second call raises; reset() recovers."""
    f = s.fast
    testing = testing_module()
    absent = s.world - 1
    limit = getattr(f, "timeout_s", FAST_TIMEOUT_S) + FAULT_SLACK_S
    for algo in f.algorithms:
        xs = s.inputs("randn", 4097, torch.float32, "dead", algo)
        x = xs[s.rank]
        s.barrier("dead")
        testing.inject(f, absent=absent)
        out = torch.full_like(x, POISON)
        t0 = time.monotonic()
        err: sollat.SollatError | None = None
        try:
            f.all_reduce(x, "sum", algo, out=out)
        except sollat.SollatError as e:
            err = e
        t_call = time.monotonic() - t0
        if err is None:
            err, _ = poll_fault(f, limit)
        waited = time.monotonic() - t0 - t_call
        what = f"{algo} with rank {absent} absent"
        check_names_absent(s, err, algo, what)
        if err is not None:
            s.expect(waited <= limit, f"{what}: raised after {waited:.1f} s, limit {limit:.0f} s")
            own = "own" if getattr(err, "rank", None) == s.rank else "propagated"
            s.log(f"{what}: {describe(err)} ({own}) {waited:.2f} s after the call returned (call {t_call:.2f} s)")
        if s.rank != absent:
            bad = faulted_output_bad(algo, out, xs)
            s.expect(bad == 0, f"{what}: {bad} output elements are neither NaN nor the correct result")
        out2 = torch.full_like(x, POISON)
        try:
            f.all_reduce(x, "sum", algo, out=out2)
            f.check()
            s.fail(f"{what}: a second call before reset() returned without raising")
        except sollat.SollatError as e:
            s.log(f"{what}: second call before reset() raised {describe(e)}")
        testing.clear(f)
        f.reset()
        correct_call(s, f, (algo, torch.float32, "sum", 4097), f"recovery after {what}")
        f.check()
    # the fault is also raised by the next call, without check()
    algo = "oneshot_ll" if "oneshot_ll" in f.algorithms else f.algorithms[0]
    xs = s.inputs("randn", 4097, torch.float32, "dead-next", algo)
    s.barrier("dead-next")
    testing.inject(f, absent=absent)
    first: sollat.SollatError | None = None
    try:
        f.all_reduce(xs[s.rank], "sum", algo)
    except sollat.SollatError as e:
        first = e
    torch.cuda.synchronize(s.dev)
    s.barrier("dead-next-done")  # every rank's kernel has ended: the faults are recorded everywhere
    time.sleep(0.2)
    what = f"next call after {algo} with rank {absent} absent"
    try:
        f.all_reduce(xs[s.rank], "sum", algo)
        if s.rank != absent:
            s.fail(f"{what}: returned without raising")
            with contextlib.suppress(sollat.SollatError):
                f.check()
        else:
            # No kernel of the absent rank met the fault (they all returned at once), so no flag
            # was set here: the peers' record reaches this host at its next check.
            f.check(sync=False)
            s.fail(f"{what}: check(sync=False) on the absent rank did not raise")
    except sollat.SollatError as e:
        if first is None:
            check_names_absent(s, e, algo, what)
        s.log(f"{what}: raised {describe(e)}" + (f" (the faulting call itself raised {describe(first)})" if first else ""))
    testing.clear(f)
    f.reset()
    correct_call(s, f, (algo, torch.float32, "sum", 4097), "recovery after next-call fault")
    f.check()


# ---- 6. fault under a CUDA graph ----------------------------------------------------------------


@section("graph_fault", 90)
def graph_fault(s: Suite) -> None:
    """A captured graph; a clean replay (check(sync=False) silent), a replay with the last rank absent
    (injected after capture: check(sync=False) raises on every rank), reset(), a clean replay again."""
    f = s.fast
    testing = testing_module()
    absent = s.world - 1
    n = 4097
    testing.inject(f)  # no fault yet: the kernels that read the hooks, so the captured graph can fault later
    calls = [GCall(a, torch.float32, "sum", n, torch.zeros(n, device=s.dev), torch.full((n,), NAN, device=s.dev))
             for a in f.algorithms]
    g = warm_and_capture(f, calls, s.dev)

    def fill(tag: str, poison: float) -> list[list[torch.Tensor]]:
        xs_of = []
        for c in calls:
            xs = s.inputs("randn", n, torch.float32, tag, c.algo)
            c.x.copy_(xs[s.rank])
            c.out.fill_(poison)
            xs_of.append(xs)
        return xs_of

    def clean(tag: str) -> None:
        xs_of = fill(tag, NAN)
        g.replay()
        torch.cuda.synchronize(s.dev)
        try:
            f.check(sync=False)  # type: ignore[call-arg]
        except sollat.SollatError as e:
            s.fail(f"{tag}: check(sync=False) raised {describe(e)} after a clean replay: {e}")
        for c, xs in zip(calls, xs_of, strict=True):
            s.verify(c.out, xs, c.algo, "sum", f"{tag} {c.algo}")
        f.check()

    clean("clean replay")
    s.barrier("before-fault")
    testing.inject(f, absent=absent)
    xs_of = fill("faulted replay", POISON)
    t0 = time.monotonic()
    g.replay()
    torch.cuda.synchronize(s.dev)
    t_sync = time.monotonic() - t0
    s.barrier("replayed")  # every rank's replay has ended: the fault is recorded and propagated
    err, waited = poll_fault(f, FAULT_SLACK_S, sync=False)
    if err is None:
        s.fail(f"check(sync=False) did not raise within {FAULT_SLACK_S:.0f} s after every rank's replay ended")
        diag, _ = poll_fault(f, 0.0)
        s.log(f"diagnosis: check() (with sync) then raised {describe(diag) if diag else 'nothing'}")
    else:
        own = "own" if getattr(err, "rank", None) == s.rank else "propagated"
        s.log(f"faulted replay: check(sync=False) raised {describe(err)} ({own}); replay + synchronize "
              f"{t_sync:.2f} s, then {waited:.2f} s")
    if s.rank != absent:
        for c, xs in zip(calls, xs_of, strict=True):
            bad = faulted_output_bad(c.algo, c.out, xs)
            s.expect(bad == 0, f"faulted replay {c.algo}: {bad} output elements neither NaN nor the correct result")
    testing.clear(f)
    f.reset()
    clean("clean replay after reset")


# ---- 7. two communicators, sub-groups ---------------------------------------------------------


def subgroups(world: int) -> list[list[int]]:
    """Whole world for 2 ranks; a proper subset for 3; two disjoint halves from 4."""
    if world == 2:
        return [[0, 1]]
    if world == 3:
        return [[0, 1]]
    h = world // 2
    return [list(range(h)), list(range(h, world))]


@section("two_comms", 60)
def two_comms(s: Suite) -> None:
    """Two communicators on the world group, calls interleaved; communicators on sub-groups, their
    calls interleaved with calls on the world communicator."""
    c1 = s.main
    if s.second is None:
        s.second = s.new_comm(timeout_s=MAIN_TIMEOUT_S)
    c2 = s.second
    algos = c1.algorithms
    sizes = (1, 33, 1000, 4097, 65537)
    pending = []
    for k in range(80):
        c, name = (c1, "c1") if k % 2 == 0 else (c2, "c2")
        algo = algos[(k // 2) % len(algos)]
        dt = (torch.float32, torch.bfloat16)[(k // 10) % 2]
        n = sizes[(k // 2) % len(sizes)]
        xs = s.inputs("randn", n, dt, k)
        pending.append((c.all_reduce(xs[s.rank], "sum", algo), xs, algo, f"{name} call {k} {algo} {dname(dt)} n={n}"))
    for y, xs, algo, what in pending:  # checked only after every call was issued
        s.verify(y, xs, algo, "sum", what)
    c1.check()
    c2.check()
    s.log(f"{len(pending)} interleaved calls on two communicators checked")
    groups = subgroups(s.world)
    handles = [dist.new_group(m) for m in groups]  # every rank creates every group, in one order
    mine: list[tuple[list[int], sollat.Communicator]] = []
    for members, h in zip(groups, handles, strict=True):
        if s.rank not in members:
            s.log(f"not in sub-group {members}: constructs nothing on it")
            continue
        sc = sollat.Communicator(group=h, timeout_s=MAIN_TIMEOUT_S)  # collective over the members only
        s.keep.append(sc)
        me = members.index(s.rank)
        s.expect(sc.rank == me and sc.world_size == len(members),
                 f"sub-group {members}: rank {sc.rank} / world {sc.world_size}, expected {me} / {len(members)}")
        mine.append((members, sc))
    for k in range(2 * len(algos)):
        algo, n = algos[k % len(algos)], (33, 4097)[k // len(algos)]
        xw = s.inputs("randn", n, torch.float32, "world", k)
        yw = c1.all_reduce(xw[s.rank], "sum", algo)  # every rank, between the sub-group calls
        for members, sc in mine:
            xs = ref.make_inputs("randn", ref.seed_of("subgroup", members, algo, n), n, torch.float32, s.dev, len(members))
            y = sc.all_reduce(xs[sc.rank], "sum", algo)
            s.verify(y, xs, algo, "sum", f"sub-group {members} {algo} n={n}")
        s.verify(yw, xw, algo, "sum", f"world call {k} between sub-group calls")
    for members, sc in mine:
        sc.check()
        s.log(f"sub-group {members}: rank {sc.rank} of {sc.world_size}, {2 * len(algos)} calls checked")
    c1.check()


# ---- 8. streams --------------------------------------------------------------------------------


@section("streams", 60)
def streams(s: Suite) -> None:
    """Calls alternating between two streams, no user synchronisation between them: issue order."""
    comm = s.main
    algos = comm.algorithms
    rounds: list[tuple[str, Callable[[int], str]]] = []
    if "oneshot_ll" in algos:
        rounds.append(("oneshot_ll", lambda k: "oneshot_ll"))
    rounds.append(("mixed", lambda k: algos[k % len(algos)]))
    K, n = 400, 4096
    cur = torch.cuda.current_stream(s.dev)
    for name, algo_of in rounds:
        X = [ref.make_input("randn", ref.seed_of("streams", name, r), K * n, torch.float32, s.dev).view(K, n)
             for r in range(s.world)]
        s1, s2 = torch.cuda.Stream(s.dev), torch.cuda.Stream(s.dev)
        s1.wait_stream(cur)
        s2.wait_stream(cur)
        outs = []
        for k in range(K):
            with torch.cuda.stream(s1 if k % 2 == 0 else s2):
                outs.append(comm.all_reduce(X[s.rank][k], "sum", algo_of(k)))
        cur.wait_stream(s1)
        cur.wait_stream(s2)
        torch.cuda.synchronize(s.dev)
        if name == "oneshot_ll":
            s.verify(torch.stack(outs), X, "oneshot_ll", "sum", f"{K} oneshot_ll calls on 2 streams")
        else:
            for k, y in enumerate(outs):
                s.verify(y, [x[k] for x in X], algo_of(k), "sum", f"stream call {k} {algo_of(k)}")
        comm.check()
        s.log(f"{name}: {K} calls alternating between 2 streams checked")


# ---- 9. torch.compile -------------------------------------------------------------------------


@section("compile", 180)
def compiled(s: Suite) -> None:
    """torch.compile(fullgraph=True) of a function around all_reduce and all_reduce_rmsnorm (the
    sollat::* custom ops stay in the graph): bitwise against the references on every rank, for
    two sizes (one recompile), several calls each with fresh inputs."""
    from sollat import rmsnorm

    comm = s.main

    def step(x: torch.Tensor, res: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = comm.all_reduce(x * 2, algo="oneshot_ll") + 1
        z, r = comm.all_reduce_rmsnorm(y, res, w, 1e-6, "oneshot_sentinel")
        return y, z, r

    compiled_step = torch.compile(step, fullgraph=True)
    calls = 0
    for tokens, hidden in ((2, 1024), (5, 4096)):
        for k in range(3):
            what = f"compiled step {tokens}x{hidden} call {k}"
            n = tokens * hidden
            xs = [x.view(tokens, hidden) for x in s.inputs("randn", n, torch.float32, what)]
            res = ref.make_input("randn", ref.seed_of(s.section, what, "res"), n, torch.float32, s.dev).view(tokens, hidden)
            w = ref.make_input("randn", ref.seed_of(s.section, what, "w"), hidden, torch.float32, s.dev)
            y, z, r = compiled_step(xs[s.rank], res, w)
            want_y = ref.rank_order_reduce([x * 2 for x in xs], "sum") + 1
            want_z, want_r = rmsnorm.reference([want_y] * s.world, res, w, 1e-6)
            for got, want, name in ((y, want_y, "y"), (z.cpu(), want_z, "rmsnorm y"), (r.cpu(), want_r, "residual_out")):
                if int(ref.bitwise_bad(got, want.to(got.device))):
                    s.fail(f"{what}: {name}: {ref.first_difference(got, want.to(got.device))}")
                s.add_digest(f"{what} {name}", got)
            calls += 1
    comm.check()
    s.log(f"{calls} compiled steps checked (all_reduce and all_reduce_rmsnorm inside one fullgraph)")


# ---- 10. LL tear stress -------------------------------------------------------------------------


def tear_lines() -> int:
    return int(env_float("SOLLAT_MP_TEAR_LINES", 1e9))


@section("tear", 120, needs_gpus="its side traffic is NCCL between distinct GPUs, and 1e9 LL lines take hours "
                                 "when the ranks' kernels time-slice on one GPU")
def tear(s: Suite) -> None:
    """oneshot_ll fp32 with payloads that change every call (small integers: exact sums), >= 1e9 LL
    lines, NCCL all_reduce traffic on a side stream meanwhile; a torn line gives a wrong sum."""
    comm = s.main
    if "oneshot_ll" not in comm.algorithms:
        s.log("SKIP: oneshot_ll is not enabled")
        return
    target = tear_lines()
    M, A, B, C = 2039, 769, 7, 331  # x = ((i*A + k*B + r*C) mod M) - M//2; M prime, so call k != k-d
    H = M // 2
    sizes = (1 << 20, 1 << 18, 1 << 16, 4096)
    bufs = {}
    for n in sizes:
        base = ((torch.arange(n, dtype=torch.int64, device=s.dev) * A) % M).to(torch.int32)
        bufs[n] = (base, torch.empty_like(base), torch.empty_like(base), torch.empty(n, device=s.dev),
                   torch.empty(n, device=s.dev), torch.empty(n, device=s.dev))
    big = torch.zeros(16 << 20, device=s.dev)  # 64 MiB of NCCL traffic per op
    side = torch.cuda.Stream(s.dev)
    side.wait_stream(torch.cuda.current_stream(s.dev))
    torn = torch.zeros((), dtype=torch.int64, device=s.dev)
    lines = calls = nccl_ops = 0
    torch.cuda.synchronize(s.dev)
    t0 = time.monotonic()
    while lines < target:
        n = sizes[calls % len(sizes)]
        base, tmp, acc, x, y, e = bufs[n]
        shift = [(calls * B + r * C) % M for r in range(s.world)]
        torch.add(base, shift[s.rank], out=tmp)
        torch.remainder(tmp, M, out=tmp)
        x.copy_(tmp)
        x.sub_(H)
        acc.zero_()
        for r in range(s.world):
            torch.add(base, shift[r], out=tmp)
            torch.remainder(tmp, M, out=tmp)
            acc.add_(tmp)
        e.copy_(acc)
        e.sub_(s.world * H)
        comm.all_reduce(x, "sum", "oneshot_ll", out=y)
        torn += (y.view(-1, 2) != e.view(-1, 2)).any(1).sum()
        if calls % 2 == 0:
            with torch.cuda.stream(side):
                dist.all_reduce(big)
            nccl_ops += 1
        lines += s.world * (s.world - 1) * math.ceil(n * 4 / 8)
        calls += 1
    torch.cuda.synchronize(s.dev)
    secs = time.monotonic() - t0
    tears = int(torn)
    comm.check()
    s.expect(tears == 0, f"{tears} torn LL lines (wrong sums) in {calls} calls")
    s.log(f"{calls} oneshot_ll calls, {lines:.3e} LL lines delivered (all ranks), tears seen: {tears}, "
          f"{nccl_ops} NCCL all_reduces of 64 MiB on a side stream, {secs:.1f} s")


# ---- 9. compile skew (own launch) ---------------------------------------------------------------


@section("skew", 120, default=False)
def skew(s: Suite) -> None:
    """With an empty kernel cache, one rank sleeps longer than timeout_s before its first call of
    each new shape: the store agreement before the first launch means no false timeout."""
    c = s.new_comm(timeout_s=SKEW_TIMEOUT_S)
    shapes: list[Spec] = [("oneshot_ll", torch.float32, "sum", 777), ("twoshot_sentinel", torch.bfloat16, "sum", 5003),
                          ("oneshot_sentinel", torch.float64, "max", 129), ("twoshot_ll", torch.float16, "min", 999),
                          ("ll128", torch.float16, "sum", 3001)]
    shapes = [sp for sp in shapes if sp[0] in c.algorithms]
    for i, sp in enumerate(shapes):
        algo, dt, op, n = sp
        late = s.world - 1 if i % 2 == 0 else 0
        xs = s.inputs("randn", n, dt, spec_str(sp))
        s.barrier("skew")
        if s.rank == late:
            time.sleep(SKEW_SLEEP_S)
        t0 = time.monotonic()
        y = c.all_reduce(xs[s.rank], op, algo, out=torch.full_like(xs[s.rank], NAN))
        c.check()
        secs = time.monotonic() - t0
        s.verify(y, xs, algo, op, f"first call {spec_str(sp)}")
        y2 = c.all_reduce(xs[s.rank], op, algo)
        c.check()
        s.verify(y2, xs, algo, op, f"second call {spec_str(sp)}")
        s.log(f"{spec_str(sp)}: rank {late} slept {SKEW_SLEEP_S:.0f} s (timeout_s {SKEW_TIMEOUT_S:.0f}); "
              f"this rank's first call + check took {secs:.1f} s; no false timeout")


# ---- main --------------------------------------------------------------------------------------

DEFAULT_SECTIONS = tuple(name for name, sec in SECTIONS.items() if sec.default)


def selected(only: str | None) -> list[str]:
    spec = only or os.environ.get("SOLLAT_MP_SECTIONS", "")
    names = [x.strip() for x in spec.split(",") if x.strip()] or list(DEFAULT_SECTIONS)
    skip = {x.strip() for x in os.environ.get("SOLLAT_MP_SKIP", "").split(",") if x.strip()}
    unknown = [x for x in [*names, *skip] if x not in SECTIONS]
    if unknown:
        raise SystemExit(f"mp_suite: unknown sections {unknown}; known: {', '.join(SECTIONS)}")
    return [x for x in names if x not in skip]


def runnable(names: list[str], shared: bool) -> tuple[list[str], list[str]]:
    """(the sections to run, "name: why" of those skipped): with the ranks sharing one GPU, the
    sections that need one GPU per rank are skipped by name."""
    if not shared:
        return names, []
    return ([x for x in names if not SECTIONS[x].needs_gpus],
            [f"{x}: {SECTIONS[x].needs_gpus}" for x in names if SECTIONS[x].needs_gpus])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=None, help="comma list of sections (default: all but skew)")
    args = p.parse_args(argv)
    rank = int(os.environ["RANK"])
    try:
        rank, world, dev, shared = _procs.init_ranks(NCCL_TIMEOUT_S)
    except RuntimeError as e:
        emit(f"RANK {rank} FAIL init: {e}")
        emit(f"RANK {rank} SUMMARY passed=0 failed=1")
        failed_init = _procs.RankResult(rank)
        failed_init.error(f"init: {e}")
        failed_init.finish(0, 1)
        return 1
    names, skipped = runnable(selected(args.only), shared)
    store = dist.PrefixStore("sollat-mp-suite", dist.distributed_c10d._get_default_store())
    s = Suite(rank, world, dev, store, shared)
    mode = (f"{world} processes sharing {torch.cuda.get_device_name(dev)} (gloo)" if shared
            else f"world {world}, one {torch.cuda.get_device_name(dev)} per rank (NCCL)")
    emit(f"RANK {rank} PLAN {','.join(names)} ({mode}, torch {torch.__version__})")
    for why in skipped:
        emit(f"RANK {rank} SKIP {why}")
    s.result.plan(names, skipped)
    s.watchdog.start()
    s.section = "init"
    s.watchdog.arm("init", 600)
    try:
        s.comm = s.new_comm(timeout_s=MAIN_TIMEOUT_S, torch_twoshot_bytes=TORCH_TWOSHOT_BYTES)
        s.log(f"communicator: rank {s.comm.rank} of {s.comm.world_size}, algorithms {', '.join(s.comm.algorithms)}")
    except Exception as e:
        emit(f"RANK {rank} FAIL init: {type(e).__name__}: {e}")
        emit(f"RANK {rank} SUMMARY passed=0 failed=1")
        s.result.error(f"init: {type(e).__name__}: {e}")
        s.result.finish(0, 1)
        os._exit(1)
    s.watchdog.disarm()
    t0 = time.monotonic()
    for name in names:
        s.run_section(SECTIONS[name])
        if s.aborted:
            emit(f"RANK {rank} FAIL remaining sections not run after {name}")
            s.result.error(f"remaining sections not run after {name}")
            s.failed += 1
            break
    if not s.aborted:
        s.section = "exit"
        try:  # leave together: no rank tears down while a peer is still inside a collective
            s.exchange("done", "1", 120.0)
        except Exception as e:
            emit(f"RANK {rank} WARN the ranks did not meet before exit: {type(e).__name__}: {e}")
    emit(f"RANK {rank} SUMMARY passed={s.passed} failed={s.failed} ({time.monotonic() - t0:.0f} s)")
    s.result.finish(s.passed, s.failed)
    sys.stdout.flush()
    sys.stderr.flush()
    # no teardown of NCCL / symmetric memory: a peer that failed differently must not hang the exit
    os._exit(0 if s.failed == 0 else 1)


if __name__ == "__main__":
    sys.exit(main())
