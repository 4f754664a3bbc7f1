"""The engine plugins' adapter core on real ranks, no engine installed: one process per rank under
torchrun (``test_engine_processes.py`` launches it; N processes share GPU 0 over gloo where the host
has fewer GPUs than ranks, ``_procs``).

    python -m torch.distributed.run --standalone --nproc-per-node=N tests/gpu/engine_worker.py

What an engine shim does, done here: a ``core.GroupAdapter`` per tensor-parallel group over the
world group, built by the plugins' default factory (``settings.communicator_options``), calls routed
through it eagerly, inside a CUDA graph (in ``capture()``, as the engines' graph capture enters it)
and under ``torch.compile`` (an opaque custom op around the adapter, as vLLM's ``vllm.all_reduce``,
and the fused ops the vLLM compile pass inserts, ``sollat_vllm::all_reduce_rmsnorm[_fp8]``, pointed
at these adapters). SECTIONS, in order: for the default and the batch-invariant mode, ``rule``
(int32, non-contiguous, empty, CPU and above-limit calls go to the engine, not in batch-invariant
mode for the last; one communicator per group, with the engine options), then ``eager``, ``graph``
and ``compile`` (every routed result bit for bit sollat's reference, fresh random inputs on every
call, graph outputs poisoned before every replay); then ``failure:env|oom|rendezvous``: a group
whose construction fails on rank 1 only (a bad ``SOLLAT_BATCH_INVARIANT``; its scratch allocation
raising OutOfMemoryError; its rendezvous raising before it posts anything): every rank keeps the
engine's path with the same reason naming rank 1 and the cause, within the setup timeout, and one
warning (rank 0's). The faults are injected here, on rank 1, by replacing torch's symmetric-memory
functions or the environment for that construction (sollat has no hook for them); the rendezvous
comes last, as it leaves the healthy ranks' torch rendezvous sequence one step ahead of rank 1's.
Before the failures, ``disagree:max_bytes|batch_invariant``: rank 1 alone has another
``SOLLAT_ENGINE_MAX_BYTES`` (64 KiB) or asks for the batch-invariant mode; every rank uses the
smallest limit (the mode on), serves and declines the same calls (bit for bit sollat's reference
where served), and rank 0 logs one warning naming rank 1 and its value. Last, ``cross-rank``: every
output's raw-bit digest, compared across ranks through the store.

Every wait is bounded: the store's with a timeout, sollat's kernels by their fault timeout, the
whole process by WATCHDOG_S. Per rank: ``RANK r PASS section (...)`` or ``RANK r FAIL section: why``,
then ``RANK r SUMMARY passed=X failed=Y``; exit status 1 when any failed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

try:  # run as a script (torchrun) or imported as tests.gpu.engine_worker (the launcher)
    from . import _procs
    from . import _reference as ref
except ImportError:
    import _procs  # type: ignore[no-redef]
    import _reference as ref  # type: ignore[no-redef]

MODES = ("default", "batch_invariant")
FAILURES = ("env", "oom", "rendezvous")  # the rendezvous last (module docstring)
DISAGREEMENTS = ("max_bytes", "batch_invariant")  # what rank 1 alone sets otherwise
SECTIONS = (tuple(f"{s}:{m}" for m in MODES for s in ("rule", "eager", "graph", "compile"))
            + tuple(f"disagree:{d}" for d in DISAGREEMENTS) + tuple(f"failure:{f}" for f in FAILURES)
            + ("cross-rank",))  # the failures last: the rendezvous failure leaves rendezvous sequences apart
RANK1_MAX_BYTES = "64KiB"  # disagree:max_bytes: rank 1's SOLLAT_ENGINE_MAX_BYTES
EPS, REPLAYS, COMPILE_CALLS, STORE_WAIT_S, WATCHDOG_S = 1e-6, 6, 6, 300.0, 480.0
FAILURE_SETUP_TIMEOUT_S = 20.0  # the failure sections' SOLLAT_SETUP_TIMEOUT_S
# The last: exactly the engine limit, 1 MiB (declined where the table gives it to an algorithm the
# engine's communicator leaves out: GroupAdapter.own_limit).
ALL_REDUCE_CASES = [((1, 7), torch.float32), ((3, 1000), torch.float32), ((1, 4096), torch.bfloat16),
                    ((5, 333), torch.float16), ((2, 4096), torch.float64), ((8, 8192), torch.bfloat16),
                    ((64, 8192), torch.bfloat16)]
FUSED_CASES = [((1, 8192), torch.bfloat16, True), ((2, 4096), torch.float16, False), ((4, 8192), torch.bfloat16, True),
               ((3, 5120), torch.float32, False), ((16, 4096), torch.bfloat16, True)]
ABOVE_LIMIT = ((65, 8192), torch.bfloat16)  # 1 MiB + 16 KiB
INJECTED = "injected on rank 1 by tests/gpu/engine_worker.py"
CAUSES = {"env": "SOLLAT_BATCH_INVARIANT='yes' is not understood; it takes 0 or 1 (or unset)",
          "oom": f"OutOfMemoryError: CUDA out of memory ({INJECTED})",
          "rendezvous": f"RuntimeError: symmetric-memory rendezvous failed ({INJECTED})"}
ADAPTERS: dict[str, Any] = {}  # group name -> adapter, what the custom ops below resolve


emit = _procs.emit


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]).cpu()


@torch.library.custom_op("sollat_enginetest::all_reduce", mutates_args=())
def all_reduce_op(x: torch.Tensor, group_name: str) -> torch.Tensor:
    """The engines' opaque all-reduce op (vLLM's ``vllm.all_reduce``), on this test's adapters."""
    out = ADAPTERS[group_name].all_reduce(x)
    if out is None:  # an engine composes such a call itself; every call here is sollat's
        raise RuntimeError(f"the adapter declined {tuple(x.shape)} {x.dtype}")
    return out


@all_reduce_op.register_fake
def _(x: torch.Tensor, group_name: str) -> torch.Tensor:
    return torch.empty_like(x)


class _Records(logging.Handler):
    def __init__(self, into: list[tuple[int, str]]) -> None:
        super().__init__(logging.DEBUG)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append((record.levelno, record.getMessage()))


class Run(_procs.Sections):
    def __init__(self, rank: int, world: int, dev: torch.device, store: Any) -> None:
        super().__init__(rank)
        self.world, self.dev, self.store = world, dev, store
        self.cpu_group = dist.new_group(backend="gloo")
        self.digests: dict[str, str] = {}
        self.calls = 0
        self.built = 0
        self.log = logging.getLogger("enginetest.plugins.sollat")  # what a shim passes: the engine's logger
        self.log.setLevel(logging.DEBUG)
        self.records: list[tuple[int, str]] = []
        self.log.addHandler(_Records(self.records))

    # -- bookkeeping
    def same(self, got: torch.Tensor | None, want: torch.Tensor, what: str) -> None:
        """Bit for bit; the output's digest joins the cross-rank comparison."""
        if not self.expect(got is not None, f"{what}: the adapter declined it"):
            return
        assert got is not None
        a, b = bits(got), bits(want.to(got.dtype))
        if a.shape != b.shape:
            self.expect(False, f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
        elif not torch.equal(a, b):
            n = int((a != b).sum())
            self.expect(False, f"{what}: {n} of {a.numel()} elements differ from sollat's reference")
        self.digests[f"{what}#{len(self.digests)}"] = ref.digest(got)

    def exchange(self, name: str, value: str) -> list[str]:
        keys = [f"{name}/{r}" for r in range(self.world)]
        self.store.set(keys[self.rank], value)
        self.store.wait(keys, timedelta(seconds=STORE_WAIT_S))
        return [self.store.get(k).decode() for k in keys]

    def inputs(self, tag: str, shape: tuple[int, ...], dtype: torch.dtype) -> list[torch.Tensor]:
        """Every rank's input of a new call (the same on every rank: seeds from the call's number)."""
        self.calls += 1
        out = []
        for r in range(self.world):
            g = torch.Generator(device=self.dev).manual_seed(ref.seed_of(tag, self.calls, r))
            out.append(torch.randn(shape, generator=g, device=self.dev).to(dtype))
        return out

    def adapter(self, name: str, batch_invariant: bool) -> Any:
        from sollat.integrations import core, settings

        ad = core.GroupAdapter(engine="test", name=name, device_group=dist.group.WORLD, cpu_group=self.cpu_group,
                               device=self.dev, world_size=self.world, batch_invariant=batch_invariant,
                               max_bytes=settings.DEFAULT_MAX_BYTES, log=self.log)
        ADAPTERS[name] = ad
        return ad

    # -- sections
    def rule(self, mode: str) -> None:
        from sollat.integrations import settings

        bi = mode == "batch_invariant"
        ad = self.adapter(f"tp:{mode}", bi)
        built = self.built
        self.expect(ad.all_reduce(torch.ones(4, 8, dtype=torch.int32, device=self.dev)) is None and ad.comm is None
                    and ad.unavailable is None, "int32 goes to the engine and builds nothing")
        if not self.expect(ad.ensure(), f"communicator built on every rank ({ad.unavailable})"):
            return
        comm = ad.comm
        self.expect(ad.ensure() and ad.comm is comm and self.built == built + 1, "one communicator for the group")
        opts = settings.communicator_options(self.world)
        sms = torch.cuda.get_device_properties(self.dev).multi_processor_count
        self.expect(tuple(comm.algorithms) == opts["algorithms"], f"algorithms {comm.algorithms}")
        self.expect(comm.scratch_bytes_per_rank == settings.scratch_bytes(self.world, sms),
                    f"scratch {comm.scratch_bytes_per_rank} bytes, settings.scratch_bytes says "
                    f"{settings.scratch_bytes(self.world, sms)}")
        self.expect(comm.batch_invariant == bi and ad.max_bytes == (None if bi else settings.DEFAULT_MAX_BYTES),
                    f"batch_invariant {comm.batch_invariant}, max_bytes {ad.max_bytes}")
        # Every decode size but the largest keeps sollat: the shipped tables leave out at most 1 MiB.
        self.expect(ad.own_limit == comm.own_pick_limit() and (ad.own_limit is None or ad.own_limit >= (1 << 20) - 1),
                    f"own_limit {ad.own_limit}, the communicator's {comm.own_pick_limit()}")
        f = torch.randn(8, 6, device=self.dev)
        for what, t in (("non-contiguous", f.t()), ("empty", f[:0]), ("on the CPU", f.cpu())):
            self.expect(ad.all_reduce(t) is None, f"{what} goes to the engine")
        shape, dtype = ABOVE_LIMIT
        xs = self.inputs("above", shape, dtype)
        out = ad.all_reduce(xs[self.rank])
        if bi:  # no limit: a row must not change implementation with its batch
            self.same(out, ref.rank_order_reduce(xs, "sum"), f"{mode} above the limit")
        else:
            self.expect(out is None, "above SOLLAT_ENGINE_MAX_BYTES goes to the engine")

    def eager(self, mode: str) -> None:
        from sollat.collectives.rmsnorm import fp8_reference, reference

        ad = ADAPTERS[f"tp:{mode}"]
        for shape, dtype in ALL_REDUCE_CASES:
            xs = self.inputs("ar", shape, dtype)
            torch.full(shape, float("nan"), dtype=dtype, device=self.dev)  # freed: a stale block holds NaN
            got = ad.all_reduce(xs[self.rank])
            what = f"eager {mode} all_reduce {shape} {dtype}"
            nbytes = xs[0].numel() * xs[0].element_size()
            if ad.batch_invariant or ad.own_limit is None or nbytes <= ad.own_limit:
                self.same(got, ref.rank_order_reduce(xs, "sum"), what)
            else:  # the table picks an algorithm the engine's communicator leaves out there
                self.expect(got is None, f"{what}: above own_limit {ad.own_limit}, served")
        scale = torch.tensor([0.05], device=self.dev)
        for shape, dtype, fp8 in FUSED_CASES:
            xs = self.inputs("fx", shape, dtype)
            res = self.inputs("fres", shape, dtype)[0]  # the residual is the same on every TP rank
            w = self.inputs("fw", shape[-1:], dtype)[0]
            want_y, want_r = reference(xs, res, w, EPS)
            got = ad.all_reduce_rmsnorm(xs[self.rank], res, w, EPS)
            what = f"eager {mode} all_reduce_rmsnorm {shape} {dtype}"
            if self.expect(got is not None, f"{what}: declined"):
                self.same(got[0], want_y, f"{what} y")
                self.same(got[1], want_r, f"{what} residual")
            if fp8:
                got8 = ad.all_reduce_rmsnorm(xs[self.rank], res, w, EPS, fp8_scale=scale)
                if self.expect(got8 is not None, f"{what} fp8: declined"):
                    self.same(got8[2], fp8_reference(want_y, scale), f"{what} fp8 q")

    def graph(self, mode: str) -> None:
        from sollat.collectives.rmsnorm import fp8_reference, reference

        ad, name, dev = ADAPTERS[f"tp:{mode}"], f"tp:{mode}", self.dev
        ar_shape, f_shape, dtype = (8, 4096), (2, 8192), torch.bfloat16
        x, x2, res = (torch.zeros(s, dtype=dtype, device=dev) for s in (ar_shape, f_shape, f_shape))
        w, scale = self.inputs("gw", f_shape[-1:], dtype)[0], torch.tensor([0.05], device=dev)

        def calls() -> tuple[torch.Tensor, ...]:
            out = ad.all_reduce(x)
            y, r = torch.ops.sollat_vllm.all_reduce_rmsnorm(x2, res, w, EPS, name)
            q, r8 = torch.ops.sollat_vllm.all_reduce_rmsnorm_fp8(x2, res, w, scale, EPS, name)
            return out, y, r, q, r8

        side = torch.cuda.Stream(dev)  # warm-up: every call shape's first use (compile, agreement) is eager
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            calls()
        torch.cuda.current_stream(dev).wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with ad.capture(), torch.cuda.graph(g):
            outs = calls()
        for _ in range(REPLAYS):
            xs, x2s = self.inputs("gx", ar_shape, dtype), self.inputs("gx2", f_shape, dtype)
            r0 = self.inputs("gres", f_shape, dtype)[0]
            x.copy_(xs[self.rank])
            x2.copy_(x2s[self.rank])
            res.copy_(r0)
            for t in outs:
                t.view(torch.uint8).fill_(0xFF)  # NaN in every float dtype here, fp8 e4m3 included
            g.replay()
            torch.cuda.synchronize(dev)
            want_y, want_r = reference(x2s, r0, w, EPS)
            self.same(outs[0], ref.rank_order_reduce(xs, "sum"), f"graph {mode} all_reduce")
            self.same(outs[1], want_y, f"graph {mode} fused y")
            self.same(outs[2], want_r, f"graph {mode} fused residual")
            self.same(outs[3], fp8_reference(want_y, scale), f"graph {mode} fused fp8 q")
            self.same(outs[4], want_r, f"graph {mode} fused fp8 residual")
        ad.comm.check()

    def compile(self, mode: str) -> None:
        from sollat.collectives.rmsnorm import fp8_reference, reference

        name, dev = f"tp:{mode}", self.dev

        @torch.compile(fullgraph=True, dynamic=False)
        def step(x: torch.Tensor, x2: torch.Tensor, res: torch.Tensor, w: torch.Tensor,
                 scale: torch.Tensor) -> tuple[torch.Tensor, ...]:
            s = torch.ops.sollat_enginetest.all_reduce(x * 2.0, name) + 1.0
            y, r = torch.ops.sollat_vllm.all_reduce_rmsnorm(x2, res, w, EPS, name)
            q, _ = torch.ops.sollat_vllm.all_reduce_rmsnorm_fp8(x2, res, w, scale, EPS, name)
            return s, y, r, q

        scale = torch.tensor([0.05], device=dev)
        for _ in range(COMPILE_CALLS):
            xs, x2s = self.inputs("cx", (4, 1024), torch.float32), self.inputs("cx2", (1, 8192), torch.bfloat16)
            r0, w = self.inputs("cres", (1, 8192), torch.bfloat16)[0], self.inputs("cw", (8192,), torch.bfloat16)[0]
            s, y, r, q = step(xs[self.rank], x2s[self.rank], r0, w, scale)
            want_y, want_r = reference(x2s, r0, w, EPS)
            self.same(s, ref.rank_order_reduce([v * 2.0 for v in xs], "sum") + 1.0, f"compile {mode} all_reduce")
            self.same(y, want_y, f"compile {mode} fused y")
            self.same(r, want_r, f"compile {mode} fused residual")
            self.same(q, fp8_reference(want_y, scale), f"compile {mode} fused fp8 q")

    @contextlib.contextmanager
    def fault(self, kind: str) -> Iterator[None]:
        """The failure on rank 1 only, for one construction."""
        import torch.distributed._symmetric_memory as symm_mem

        saved = (os.environ.get("SOLLAT_BATCH_INVARIANT"), symm_mem.empty, symm_mem.rendezvous)
        hit: list[str] = []
        def failing(error: Exception) -> Callable[..., Any]:
            def call(*args: Any, **kwargs: Any) -> Any:
                hit.append(kind)
                raise error
            return call

        if self.rank == 1 and kind == "env":
            os.environ["SOLLAT_BATCH_INVARIANT"] = "yes"
        elif self.rank == 1 and kind == "oom":
            symm_mem.empty = failing(torch.OutOfMemoryError(f"CUDA out of memory ({INJECTED})"))  # type: ignore[assignment]
        elif self.rank == 1:
            symm_mem.rendezvous = failing(RuntimeError(f"symmetric-memory rendezvous failed ({INJECTED})"))  # type: ignore[assignment]
        try:
            yield
        finally:
            if saved[0] is None:
                os.environ.pop("SOLLAT_BATCH_INVARIANT", None)
            else:
                os.environ["SOLLAT_BATCH_INVARIANT"] = saved[0]
            symm_mem.empty, symm_mem.rendezvous = saved[1], saved[2]  # type: ignore[assignment]
            if self.rank == 1 and kind != "env":
                self.expect(hit == [kind], f"the injected {kind} failure was reached ({hit})")

    def failure(self, kind: str) -> None:
        from sollat.integrations import core

        os.environ["SOLLAT_SETUP_TIMEOUT_S"] = str(FAILURE_SETUP_TIMEOUT_S)
        core.set_communicator_factory(None)  # the plugins' own factory
        ad = self.adapter(f"tp:failure-{kind}", False)
        seen = len(self.records)
        t0 = time.monotonic()
        with self.fault(kind):
            built = ad.ensure()
        dt = time.monotonic() - t0
        why = str(ad.unavailable)
        self.expect(not built and ad.comm is None, "no rank built it")
        self.expect(why.startswith("rank") and "rank 1: " in why and CAUSES[kind] in why,
                    f"the reason names rank 1 and the cause: {why}")
        self.expect(dt < FAILURE_SETUP_TIMEOUT_S, f"decided in {dt:.1f} s, the setup timeout is {FAILURE_SETUP_TIMEOUT_S:g} s")
        warnings = [m for lv, m in self.records[seen:] if lv >= logging.WARNING]
        self.expect(len(warnings) == (1 if self.rank == 0 else 0) and all(why in m for m in warnings),
                    f"one warning for the group, from rank 0: {warnings}")
        reasons = self.exchange(f"failure-{kind}/reason", why)
        self.expect(len(set(reasons)) == 1, f"every rank the same reason: {reasons}")
        self.expect(ad.all_reduce(torch.ones(4, device=self.dev)) is None, "its calls go to the engine")

    def disagree(self, what: str) -> None:
        """Rank 1 alone has another engine limit (its ``SOLLAT_ENGINE_MAX_BYTES``, read as the shims
        read it) or asks for the batch-invariant mode: every rank takes the same value (the smallest
        limit; the mode on), routes every call alike, and rank 0 logs one warning naming rank 1."""
        from sollat.integrations import core, settings

        core.set_communicator_factory(None)
        saved = os.environ.get(settings.MAX_BYTES_ENV)
        if what == "max_bytes" and self.rank == 1:
            os.environ[settings.MAX_BYTES_ENV] = RANK1_MAX_BYTES
        try:
            limit = settings.max_message_bytes(os.environ.get(settings.MAX_BYTES_ENV))
        finally:
            if saved is None:
                os.environ.pop(settings.MAX_BYTES_ENV, None)
            else:
                os.environ[settings.MAX_BYTES_ENV] = saved
        name = f"tp:disagree-{what}"
        ad = core.GroupAdapter(engine="test", name=name, device_group=dist.group.WORLD, cpu_group=self.cpu_group,
                               device=self.dev, world_size=self.world, max_bytes=limit, log=self.log,
                               batch_invariant=what == "batch_invariant" and self.rank == 1)
        ADAPTERS[name] = ad
        seen = len(self.records)
        if not self.expect(ad.ensure(), f"communicator built on every rank ({ad.unavailable})"):
            return
        small = settings.max_message_bytes(RANK1_MAX_BYTES)
        if what == "max_bytes":
            self.expect(ad.limit == small and ad.max_bytes == small and not ad.batch_invariant,
                        f"every rank uses the smallest limit: limit {ad.limit}, batch_invariant {ad.batch_invariant}")
            cases = [((8, 4096), torch.bfloat16, True), ((16, 4096), torch.bfloat16, False)]  # 64 KiB, 128 KiB
            want_warning = f"rank 1: {small}): every rank uses {small} (the smallest)"
        else:
            self.expect(ad.batch_invariant and ad.comm.batch_invariant and ad.max_bytes is None,
                        f"every rank in batch-invariant mode: adapter {ad.batch_invariant}, communicator "
                        f"{ad.comm.batch_invariant}, max_bytes {ad.max_bytes}")
            cases = [((8, 4096), torch.bfloat16, True), (*ABOVE_LIMIT, True)]  # above the limit: no limit here
            want_warning = "rank 1: true): every rank uses true (on where any rank asks for it)"
        for shape, dtype, served in cases:
            xs = self.inputs(f"disagree-{what}", shape, dtype)
            got = ad.all_reduce(xs[self.rank])
            if served:
                self.same(got, ref.rank_order_reduce(xs, "sum"), f"disagree {what} all_reduce {shape}")
            else:
                self.expect(got is None, f"disagree {what} {shape}: above the agreed limit, served")
        ad.comm.check()
        warnings = [m for lv, m in self.records[seen:] if lv >= logging.WARNING]
        if self.rank == 0:
            self.expect(len(warnings) == 1 and want_warning in warnings[0] and "rank 1: " in warnings[0],
                        f"one warning naming rank 1 ({want_warning!r}): {warnings}")
        else:
            self.expect(warnings == [], f"rank 0 alone warns: {warnings}")

    def cross_rank(self) -> None:
        lists = self.exchange("digests", json.dumps(self.digests))
        self.expect(len(self.digests) > 0, "outputs were recorded")
        for r, text in enumerate(lists):
            theirs = json.loads(text)
            self.expect(set(theirs) == set(self.digests), f"rank {r} recorded other outputs")
            bad = [k for k, v in self.digests.items() if theirs.get(k) != v]
            self.expect(not bad, f"{len(bad)} outputs differ from rank {r}'s bits, first {bad[:1]}")


def main() -> int:
    started = _procs.start_child("sollat-engine-worker", WATCHDOG_S)
    if started is None:
        return 1
    rank, world, dev, shared, store = started
    from sollat.integrations import core, vllm_pass

    run = Run(rank, world, dev, store)

    def counting(group: Any, device: torch.device, batch_invariant: bool) -> Any:
        run.built += 1
        return core.sollat_communicator(group, device, batch_invariant)

    core.set_communicator_factory(counting)
    vllm_pass._group = lambda group_name: group_name  # the vLLM pass's ops, on this test's adapters
    vllm_pass._adapter = lambda group_name: ADAPTERS[group_name]
    how = f"{world} processes sharing one GPU (gloo)" if shared else "one GPU per rank (NCCL)"
    emit(f"RANK {rank} PLAN {','.join(SECTIONS)} ({how}, {torch.cuda.get_device_name(dev)}, torch {torch.__version__})")
    t0 = time.monotonic()
    for name in SECTIONS:
        what, _, arg = name.partition(":")
        fn = {"rule": run.rule, "eager": run.eager, "graph": run.graph, "compile": run.compile,
              "failure": run.failure, "disagree": run.disagree}.get(what)
        run.section(name, run.cross_rank if fn is None else (lambda fn=fn, arg=arg: fn(arg)))
    with contextlib.suppress(Exception):  # leave together: no rank exits while a peer still needs the store
        run.exchange("done", "1")
    emit(f"RANK {rank} SUMMARY passed={run.passed} failed={run.failed} ({time.monotonic() - t0:.0f} s)")
    sys.stderr.flush()
    os._exit(0 if run.failed == 0 else 1)  # no teardown: a peer that failed differently must not hang the exit


if __name__ == "__main__":
    sys.exit(main())
