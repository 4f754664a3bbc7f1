"""The ``sollat`` torch.distributed backend on real ranks: one process per rank under torchrun
(``test_dist_backend_gpu.py`` launches it; N processes share GPU 0 where the host has fewer GPUs
than ranks, ``_procs``: the inner backend is then gloo, found by the backend itself).

    python -m torch.distributed.run --standalone --nproc-per-node=N tests/gpu/dist_worker.py

The group is ``init_process_group("cpu:gloo,cuda:sollat", device_id=...)``, user code unchanged
beyond that string. SECTIONS, in order:

* ``eager``: ``dist.all_reduce`` (sum, avg, max, min; float32, bfloat16, float16),
  ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` on fresh random inputs, outputs poisoned:
  each result bit for bit what the group's own communicator (``dist_backend.router().comm``) computes
  for the same input (the same kernel), max and min bit for bit the rank-order reference, sum within
  the summation bound, the gathers and scatters bit for bit their rank-order references; the router's
  counts show sollat served them; int32, a broadcast and a message the table hands over went to the
  inner backend and are right; ``async_op=True`` waited on another stream.
* ``graph``: ``dist.all_reduce`` (also with ``async_op=True`` and its ``wait()``) and
  ``funcol.all_reduce`` captured in a CUDA graph, replayed on fresh inputs, bit for bit the
  communicator's result.
* ``compile``: ``funcol.all_reduce`` / ``all_gather_tensor`` / ``reduce_scatter_tensor`` under
  ``torch.compile(fullgraph=True)`` and ``mode="reduce-overhead"``: the eager results' bits, and the
  counts grew.
* ``dtensor``: a tensor-parallel MLP and one decoder block (``parallelize_module``, Colwise /
  Rowwise), forward against the single-device reference, to tolerance; the counts grew.
* ``mismatch``: the middle rank calls another size (a shape new on every rank): ``CallMismatchError`` from ``dist.all_reduce`` on
  every rank; the group works after it.
* ``fault``: the last rank made absent (``sollat.testing.inject``): a sollat error (``SollatError``)
  from ``dist.all_reduce`` on every rank within the fault timeout; after ``reset()`` the group works.
* ``cross-rank``: every served output that is the same on every rank by definition (not a
  ReduceScatter's own shard) has the same digest on every rank (through the store).

With ``SOLLAT_TEST_ZERO_CHANGE=1`` the group is ``SOLLAT_DIST=1`` and an unchanged
``init_process_group("nccl")`` instead (ZERO_CHANGE_SECTIONS): ``get_backend()`` says ``nccl``, and
the eager section passes as above.

Per rank: ``RANK r PASS section (...)`` or ``RANK r FAIL section: why``, then ``RANK r SUMMARY
passed=X failed=Y``; exit status 1 when any failed.
"""

from __future__ import annotations

import inspect
import os
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

try:  # run as a script (torchrun) or imported as tests.gpu.dist_worker (the launcher)
    from . import _procs
    from . import _reference as ref
except ImportError:
    import _procs  # type: ignore[no-redef]
    import _reference as ref  # type: ignore[no-redef]

SECTIONS = ("eager", "graph", "compile", "dtensor", "mismatch", "fault", "cross-rank")
#: With ZERO_CHANGE_ENV=1: SOLLAT_DIST=1 and an unchanged init_process_group("nccl"), then these.
ZERO_CHANGE_ENV = "SOLLAT_TEST_ZERO_CHANGE"
ZERO_CHANGE_SECTIONS = ("zero-change", "eager", "cross-rank")
FAULT_TIMEOUT_S = "5"  # SOLLAT_TIMEOUT_S of the children: the fault section waits this long
CASES = [((7,), torch.float32), ((3, 1000), torch.float32), ((1, 4096), torch.bfloat16), ((5, 333), torch.float16),
         ((8, 8192), torch.bfloat16)]
OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Run:
    def __init__(self, rank: int, world: int, dev: torch.device) -> None:
        self.rank, self.world, self.dev = rank, world, dev
        self.passed = self.failed = 0
        self.digests: list[str] = []
        self.seed = 0

    def section(self, name: str, fn: Callable[[], None]) -> None:
        t0 = time.monotonic()
        try:
            fn()
        except Exception:
            self.failed += 1
            emit(f"RANK {self.rank} FAIL {name}: " + traceback.format_exc().replace("\n", " | "))
            return
        self.passed += 1
        emit(f"RANK {self.rank} PASS {name} ({time.monotonic() - t0:.1f} s)")

    def inputs(self, shape: tuple[int, ...], dtype: torch.dtype) -> list[torch.Tensor]:
        """Every rank's input of the next call (each process draws all of them alike)."""
        self.seed += 1
        g = torch.Generator(device=self.dev).manual_seed(ref.seed_of("dist", self.seed))
        return [torch.randn(shape, device=self.dev, generator=g).to(dtype) for _ in range(self.world)]

    def keep(self, t: torch.Tensor) -> None:
        self.digests.append(ref.digest(t))


def router() -> Any:
    from sollat.integrations import dist_backend

    return dist_backend.router()


def check_all_reduce(run: Run, y: torch.Tensor, xs: list[torch.Tensor], op: str, what: str) -> None:
    comm = router().comm
    mine = xs[run.rank].clone()
    comm.all_reduce(mine, "sum" if op == "avg" else op, out=mine)
    if op == "avg":
        mine.div_(run.world)
    ref.assert_bitwise(y, mine, f"{what}: the communicator's bits")
    if op in ("max", "min"):
        ref.assert_bitwise(y, ref.rank_order_reduce(xs, op), f"{what}: rank-order reference")
    elif op == "sum":
        ref.assert_within_sum_bound(y, xs, what)
    run.keep(y)


def eager(run: Run) -> None:
    from sollat.collectives.gather_scatter import reduce_scatter_reference

    r = router()
    for shape, dtype in CASES:
        for op, rop in OPS.items():
            xs = run.inputs(shape, dtype)
            x = xs[run.rank].clone()
            before = r.counts["all_reduce"]
            dist.all_reduce(x, op=rop)
            assert r.counts["all_reduce"] == before + 1, f"all_reduce {op} {shape} {dtype} not served: {dict(r.counts)}"
            check_all_reduce(run, x, xs, op, f"all_reduce {op} {shape} {dtype}")
    xs = run.inputs((3, 256), torch.bfloat16)
    out = torch.full((run.world * 3, 256), float("nan"), dtype=torch.bfloat16, device=run.dev)
    dist.all_gather_into_tensor(out, xs[run.rank])
    ref.assert_bitwise(out, torch.cat(xs), "all_gather_into_tensor")
    run.keep(out)
    for op in ("sum", "avg", "max"):
        xs = run.inputs((run.world * 2, 300), torch.float32)
        out = torch.full((2, 300), float("nan"), device=run.dev)
        dist.reduce_scatter_tensor(out, xs[run.rank], op=OPS[op])
        want = reduce_scatter_reference(xs, "sum" if op == "avg" else op)[run.rank]
        ref.assert_bitwise(out, want / run.world if op == "avg" else want, f"reduce_scatter_tensor {op}")
    assert r.counts["all_gather"] >= 1 and r.counts["reduce_scatter"] >= 3, dict(r.counts)
    # async_op: the waiting stream waits on the call's event, nothing on the host
    xs = run.inputs((4096,), torch.float32)
    x = xs[run.rank].clone()
    work = dist.all_reduce(x, async_op=True)
    side = torch.cuda.Stream(run.dev)
    with torch.cuda.stream(side):
        work.wait()
        y = x * 1
    torch.cuda.current_stream().wait_stream(side)
    check_all_reduce(run, y, xs, "sum", "async all_reduce")
    # the inner backend: int32, broadcast, and a message the communicator's table hands over
    before = r.counts["all_reduce"]
    xi = torch.full((10,), run.rank + 1, dtype=torch.int32, device=run.dev)
    dist.all_reduce(xi)
    assert torch.equal(xi, torch.full_like(xi, run.world * (run.world + 1) // 2)), "int32 all_reduce"
    b = torch.full((6,), float(run.rank), device=run.dev)
    dist.broadcast(b, src=1)
    assert torch.equal(b, torch.ones_like(b)), "broadcast"
    assert r.counts["all_reduce"] == before, "int32 reached sollat"
    n_big = 1 << 24
    path = r.comm.library_path("all_reduce", n_big, torch.float32, "sum")
    xs = run.inputs((n_big,), torch.float32)
    x = xs[run.rank].clone()
    before_inner = r.counts["inner:all_reduce"]
    dist.all_reduce(x)
    torch.testing.assert_close(x, ref.rank_order_reduce(xs, "sum"), rtol=1e-5, atol=1e-4)
    served_big = r.counts["inner:all_reduce"] == before_inner
    assert served_big == (path is None or path != "nccl"), f"64 MiB: library_path {path!r}, counts {dict(r.counts)}"
    emit(f"RANK {run.rank} INFO eager: 64 MiB float32 -> {'sollat' if served_big else 'inner backend'} "
         f"(library_path {path!r}); counts {dict(r.counts)}")


def graph(run: Run) -> None:
    import torch.distributed._functional_collectives as funcol

    r = router()
    x = torch.zeros(4096, device=run.dev)
    dist.all_reduce(x)  # warm: the shape's plan exists before the capture
    xf = torch.zeros(2048, dtype=torch.bfloat16, device=run.dev)
    funcol.wait_tensor(funcol.all_reduce(xf, "sum", dist.group.WORLD))
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    xa = torch.zeros(1000, device=run.dev)
    dist.all_reduce(xa, async_op=True).wait()
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        dist.all_reduce(x)
        yf = funcol.wait_tensor(funcol.all_reduce(xf, "sum", dist.group.WORLD))
        dist.all_reduce(xa, async_op=True).wait()  # the Work's event, recorded and waited on inside the capture
    before = r.counts["all_reduce"]
    for _ in range(4):
        xs, xfs, xas = run.inputs((4096,), torch.float32), run.inputs((2048,), torch.bfloat16), run.inputs((1000,), torch.float32)
        x.copy_(xs[run.rank])
        xf.copy_(xfs[run.rank])
        xa.copy_(xas[run.rank])
        yf.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        check_all_reduce(run, x.clone(), xs, "sum", "graph dist.all_reduce")
        check_all_reduce(run, yf.clone(), xfs, "sum", "graph funcol.all_reduce")
        check_all_reduce(run, xa.clone(), xas, "sum", "graph dist.all_reduce(async_op=True)")
    assert r.counts["all_reduce"] == before, "a replay went through the host"


def compiled(run: Run) -> None:
    import torch.distributed._functional_collectives as funcol

    r, group, ws = router(), dist.group.WORLD, run.world

    def step(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a = funcol.all_reduce(x @ w, "sum", group)
        g = funcol.all_gather_tensor(a[:8], 0, group)
        s = funcol.reduce_scatter_tensor(a[: 8 * ws], "sum", 0, group)
        return a * 2, g, s

    w = torch.randn(64, 64, device=run.dev, generator=torch.Generator(device=run.dev).manual_seed(5))
    for mode in ("default", "reduce-overhead"):
        fn = torch.compile(step, fullgraph=True, mode=None if mode == "default" else mode)
        before = r.counts["all_reduce"] + r.counts["all_gather"] + r.counts["reduce_scatter"]
        for i in range(4):
            xs = run.inputs((16 * ws, 64), torch.float32)
            got = [t.clone() for t in fn(xs[run.rank], w)]
            want = step(xs[run.rank], w)  # eager: the same collectives through the same backend
            for name, a, b in zip(("all_reduce", "all_gather", "reduce_scatter"), got, want, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=f"{mode} call {i}: {name}")
            run.keep(got[0])
        after = r.counts["all_reduce"] + r.counts["all_gather"] + r.counts["reduce_scatter"]
        emit(f"RANK {run.rank} INFO compile {mode}: {after - before} calls served by sollat")
        assert after > before, f"compile {mode}: no call reached sollat ({dict(r.counts)})"


class Mlp(torch.nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(dim, hidden, bias=False)
        self.down = torch.nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.silu(self.up(x)))


class Block(torch.nn.Module):
    """One pre-norm decoder block: causal attention (q, k, v colwise, o rowwise) and an MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.hd = heads, dim // heads
        self.wq, self.wk, self.wv, self.wo = (torch.nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.mlp = Mlp(dim, 2 * dim)
        self.n1, self.n2 = torch.nn.RMSNorm(dim), torch.nn.RMSNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = self.n1(x)
        q, k, v = (w(h).view(b, s, -1, self.hd).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(a.transpose(1, 2).reshape(b, s, -1))
        return x + self.mlp(self.n2(x))


def dtensor(run: Run) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    r, ws = router(), run.world
    mesh = init_device_mesh("cuda", (ws,))
    torch.manual_seed(7)  # the same weights on every rank
    mlp = Mlp(96, 64 * ws).to(run.dev)
    block = Block(96, 2 * ws).to(run.dev)
    x = torch.randn(2, 5, 96, device=run.dev, generator=torch.Generator(device=run.dev).manual_seed(8))
    # Every rank holds the same weights: each takes its shard locally where torch lets it (no scatter).
    local = {"src_data_rank": None} if "src_data_rank" in inspect.signature(parallelize_module).parameters else {}
    with torch.no_grad():
        want_mlp, want_block = mlp(x), block(x)
        parallelize_module(mlp, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()}, **local)
        parallelize_module(block, mesh, {"wq": ColwiseParallel(), "wk": ColwiseParallel(), "wv": ColwiseParallel(),
                                         "wo": RowwiseParallel(), "mlp.up": ColwiseParallel(),
                                         "mlp.down": RowwiseParallel()}, **local)
        before = r.counts["all_reduce"]
        got_mlp, got_block = mlp(x), block(x)
    for name, got, want in (("MLP", got_mlp, want_mlp), ("decoder block", got_block, want_block)):
        got = got.full_tensor() if hasattr(got, "full_tensor") else got
        torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-4, msg=f"DTensor {name}")
    served = r.counts["all_reduce"] - before
    emit(f"RANK {run.rank} INFO dtensor: {served} all-reduces served by sollat")
    assert served >= 3, f"DTensor: {served} all-reduces reached sollat, want 3 (MLP 1, block 2)"


def mismatch(run: Run) -> None:
    from sollat.errors import CallMismatchError

    # A call shape no rank has made before (so every rank agrees on its route through the store), and
    # the middle rank (at 2 ranks: rank 1) makes another. A shape some ranks have routed before runs
    # from their cache: there their kernels time out on the differing rank (the fault section's path).
    n = 1234 if run.rank != run.world // 2 else 1235
    try:
        dist.all_reduce(torch.ones(n, device=run.dev))
    except CallMismatchError:
        pass
    else:
        raise AssertionError(f"a call that differs on rank {run.world // 2} raised nothing")
    xs = run.inputs((1000,), torch.float32)
    x = xs[run.rank].clone()
    dist.all_reduce(x)
    check_all_reduce(run, x, xs, "sum", "all_reduce after a mismatch")


def fault(run: Run) -> None:
    from sollat import testing
    from sollat.errors import SollatError

    comm = router().comm
    x = torch.ones(4097, device=run.dev)
    dist.all_reduce(x)
    torch.cuda.synchronize()
    dist.barrier()
    absent = run.world - 1
    testing.inject(comm, absent=absent)
    err: BaseException | None = None
    t0 = time.monotonic()
    for _ in range(3):  # the fault is raised by the call that meets it or by the next one
        try:
            dist.all_reduce(torch.ones(4097, device=run.dev))
            torch.cuda.synchronize()
        except SollatError as exc:
            err = exc
            break
    torch.cuda.synchronize()
    dist.barrier()  # every rank's kernels have ended: the faults are recorded everywhere
    if err is None and run.rank == absent:  # the absent rank ran no kernel that met the fault itself
        try:
            comm.check(sync=False)
        except SollatError as exc:
            err = exc
    assert err is not None, "an absent peer raised nothing through dist.all_reduce"
    emit(f"RANK {run.rank} INFO fault: {type(err).__name__} after {time.monotonic() - t0:.1f} s: {err}")
    testing.clear(comm)
    comm.reset()
    xs = run.inputs((4097,), torch.float32)
    x = xs[run.rank].clone()
    dist.all_reduce(x)
    check_all_reduce(run, x, xs, "sum", "all_reduce after reset")


def cross_rank(run: Run) -> None:
    mine = "|".join(run.digests)
    got: list[Any] = [None] * run.world
    dist.all_gather_object(got, mine)
    bad = [r for r, d in enumerate(got) if d != mine]
    assert not bad, f"ranks {bad} computed other bits"


def main() -> None:
    os.environ.setdefault("SOLLAT_TIMEOUT_S", FAULT_TIMEOUT_S)
    from sollat.integrations import dist_backend

    for var, want in _procs.SAFETY.items():
        if os.environ.get(var) != want:
            raise RuntimeError(f"{var} must be {want} (NVLink multicast stays off)")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    shared = os.environ.get(_procs.SHARED_ENV) == "1"
    dev = torch.device("cuda", 0 if shared else int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(dev)
    zero_change = os.environ.get(ZERO_CHANGE_ENV) == "1"
    if zero_change:  # the user's code, unchanged: init_process_group("nccl")
        from sollat.integrations import dist_zero_change

        autoloaded = dist_zero_change.enabled()  # the torch.backends entry point, where sollat is installed
        dist_zero_change.enable()
        dist.init_process_group("nccl", device_id=dev, timeout=timedelta(seconds=300))
    else:
        dist_backend.register()  # torch >= 2.14 finds it by its entry point; older torch needs the call
        dist.init_process_group("cpu:gloo,cuda:sollat", device_id=dev, timeout=timedelta(seconds=300))
    run = Run(rank, world, dev)
    sections = ZERO_CHANGE_SECTIONS if zero_change else SECTIONS
    emit(f"RANK {rank} PLAN {','.join(sections)} (route {dist_backend.route()}, inner "
         f"{'gloo (shared GPU)' if shared else 'nccl'}, {torch.cuda.get_device_name(dev)}, torch {torch.__version__})")

    def zero_change_check() -> None:
        assert dist.get_backend() == "nccl", f"get_backend() says {dist.get_backend()!r}"
        emit(f"RANK {rank} INFO zero-change: started by {'the entry point' if autoloaded else 'enable()'}")

    fns = {"zero-change": zero_change_check, "eager": lambda: eager(run), "graph": lambda: graph(run),
           "compile": lambda: compiled(run), "dtensor": lambda: dtensor(run), "mismatch": lambda: mismatch(run),
           "fault": lambda: fault(run), "cross-rank": lambda: cross_rank(run)}
    for name in sections:
        run.section(name, fns[name])
    emit(f"RANK {rank} SUMMARY passed={run.passed} failed={run.failed}")
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(1 if run.failed else 0)


if __name__ == "__main__":
    main()
