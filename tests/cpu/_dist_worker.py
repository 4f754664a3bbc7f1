"""Three CPU ranks on a ``sollat`` process group (``sollat.integrations.dist_backend``), with a
stand-in for the kernels: ``_double.RankOrderDouble`` (tests/integrations), which computes sollat's
rank-order arithmetic over the group's gloo backend, extended here with the AllGather,
ReduceScatter and ``library_path`` (a size rule: above LIBRARY_ABOVE_BYTES the library runs the
call) of ``sollat.Communicator``. Run as ``python _dist_worker.py MODE OUT``; each rank checks its
own results and writes ``OUT/<rank>.json`` with what it saw and any failure."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integrations"))

import _double  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from sollat.collectives.gather_scatter import (  # noqa: E402
    all_gather_reference,
    rank_order_reduce,
    reduce_scatter_reference,
)
from sollat.errors import CallMismatchError  # noqa: E402

WORLD = 3
LIBRARY_ABOVE_BYTES = 4096


class DistDouble(_double.RankOrderDouble):
    def library_path(self, kind: str, numel: int, dtype: torch.dtype, op: str = "sum") -> str | None:
        self.calls.append(("library_path", kind, numel))
        return "nccl" if numel * dtype.itemsize > LIBRARY_ABOVE_BYTES else None

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", algo: str = "auto", *,  # type: ignore[override]
                   out: torch.Tensor | None = None) -> torch.Tensor:
        y = super().all_reduce(tensor, op, algo)
        return y if out is None else out.copy_(y)

    def all_gather(self, tensor: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
        self.calls.append(("all_gather", tuple(tensor.shape), str(tensor.dtype)))
        return out.copy_(all_gather_reference(self._parts(tensor)).view(out.shape))

    def reduce_scatter(self, tensor: torch.Tensor, *, out: torch.Tensor, op: str = "sum") -> torch.Tensor:
        self.calls.append(("reduce_scatter", tuple(tensor.shape), str(tensor.dtype)))
        mine = reduce_scatter_reference(self._parts(tensor), op)[dist.get_rank(self.group)]
        return out.copy_(mine.view(out.shape))


def inputs(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    """Every rank's input of call ``seed`` (each process draws all of them alike)."""
    return [torch.randn(shape, generator=torch.Generator().manual_seed(1000 * seed + r)).to(dtype)
            for r in range(WORLD)]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a.view(ints), b.view(ints)))


def served() -> int:
    return sum(_double.counts(k) for k in ("all_reduce", "all_gather", "reduce_scatter"))


def checks(rank: int, got: dict[str, Any]) -> None:
    from sollat.integrations import dist_backend

    got["route"] = dist_backend.route()
    group = dist.group.WORLD
    seed = 1
    # all_reduce: sum, avg, max, min, served by the stand-in, bitwise its rank-order arithmetic
    for op, name in ((dist.ReduceOp.SUM, "sum"), (dist.ReduceOp.AVG, "avg"), (dist.ReduceOp.MAX, "max"),
                     (dist.ReduceOp.MIN, "min")):
        for dtype in (torch.float32, torch.bfloat16):
            seed += 1
            xs = inputs((4, 33), dtype, seed)
            x = xs[rank].clone()
            before = served()
            dist.all_reduce(x, op=op)
            want = rank_order_reduce(xs, "sum" if name == "avg" else name)
            if name == "avg":
                want = want / WORLD
            assert served() == before + 1, f"all_reduce {name} {dtype} was not served by sollat"
            assert same_bits(x, want), f"all_reduce {name} {dtype}: not sollat's bits"
    # the communicator's group: the sollat group itself where its C++ side holds a store (the backend
    # route), else a gloo group of the same ranks (symmetric memory's rendezvous needs the store)
    from sollat.integrations import dist_group

    built_on = _double.DOUBLES[0].group
    got["communicator_group"] = f"{type(built_on).__name__}:{dist.get_backend(built_on)}"
    if got["route"] == "process_group":
        assert not isinstance(built_on, dist_group.SollatProcessGroup), "the communicator sits on the store-less group"
        assert dist.get_process_group_ranks(built_on) == list(range(WORLD)), "the communicator's group has other ranks"
    else:
        assert built_on.group_name == group.group_name, "the backend route built the communicator on another group"
    # async_op: a Work whose wait() returns; the result is there
    seed += 1
    xs = inputs((100,), torch.float32, seed)
    x = xs[rank].clone()
    w = dist.all_reduce(x, async_op=True)
    w.wait()
    assert same_bits(x, rank_order_reduce(xs, "sum")), "async all_reduce"
    # above the communicator's table: the inner backend (gloo), not the stand-in
    seed += 1
    xs = inputs((2048,), torch.float32, seed)
    x = xs[rank].clone()
    before = served()
    dist.all_reduce(x)
    assert served() == before, "a message the table hands over reached sollat"
    torch.testing.assert_close(x, rank_order_reduce(xs, "sum"))
    xs = inputs((2048,), torch.float32, seed + 1)
    x = xs[rank].clone()
    dist.all_reduce(x, op=dist.ReduceOp.AVG)  # gloo has no avg: a sum there, then the division
    torch.testing.assert_close(x, rank_order_reduce(xs, "sum") / WORLD)
    seed += 1
    # a dtype sollat does not reduce: the inner backend
    xi = torch.arange(10, dtype=torch.int32) * (rank + 1)
    before = served()
    dist.all_reduce(xi)
    assert served() == before and torch.equal(xi, torch.arange(10, dtype=torch.int32) * 6), "int32 all_reduce"
    # all_gather_into_tensor and reduce_scatter_tensor, outputs poisoned first
    seed += 1
    xs = inputs((5, 7), torch.bfloat16, seed)
    out = torch.full((WORLD * 5, 7), float("nan"), dtype=torch.bfloat16)
    before = served()
    dist.all_gather_into_tensor(out, xs[rank])
    assert served() == before + 1 and same_bits(out, torch.cat(xs)), "all_gather_into_tensor"
    for op, name in ((dist.ReduceOp.SUM, "sum"), (dist.ReduceOp.AVG, "avg"), (dist.ReduceOp.MAX, "max")):
        seed += 1
        xs = inputs((WORLD * 4, 9), torch.float32, seed)
        out = torch.full((4, 9), float("nan"))
        before = served()
        dist.reduce_scatter_tensor(out, xs[rank], op=op)
        want = reduce_scatter_reference(xs, "sum" if name == "avg" else name)[rank]
        if name == "avg":
            want = want / WORLD
        assert served() == before + 1 and same_bits(out, want), f"reduce_scatter_tensor {name}"
    # everything else: the inner backend
    b = torch.full((6,), float(rank))
    dist.broadcast(b, src=1)
    assert torch.equal(b, torch.full((6,), 1.0)), "broadcast"
    dist.barrier()
    a2a = torch.arange(WORLD, dtype=torch.float32) + 10 * rank
    got_a2a = torch.empty(WORLD)
    dist.all_to_all_single(got_a2a, a2a)
    assert torch.equal(got_a2a, torch.tensor([10.0 * r + rank for r in range(WORLD)])), "all_to_all_single"
    lst = [torch.empty(3) for _ in range(WORLD)]
    dist.all_gather(lst, torch.full((3,), float(rank)))
    assert all(torch.equal(t, torch.full((3,), float(r))) for r, t in enumerate(lst)), "all_gather (list)"
    # the functional collectives reach sollat through the registered group
    import torch.distributed._functional_collectives as funcol

    seed += 1
    xs = inputs((8, 16), torch.float32, seed)
    before = served()
    y = funcol.all_reduce(xs[rank], "sum", group)
    y = funcol.wait_tensor(y) if hasattr(funcol, "wait_tensor") else y
    assert same_bits(y, rank_order_reduce(xs, "sum")), "funcol.all_reduce"
    g = funcol.all_gather_tensor(xs[rank], 0, group)
    assert same_bits(torch.as_tensor(g), torch.cat(xs)), "funcol.all_gather_tensor"
    xs = inputs((WORLD * 2, 16), torch.float32, seed + 1)
    s = funcol.reduce_scatter_tensor(xs[rank], "sum", 0, group)
    assert same_bits(torch.as_tensor(s), reduce_scatter_reference(xs, "sum")[rank]), "funcol.reduce_scatter_tensor"
    got["funcol_served"] = served() - before
    assert got["funcol_served"] == 3, f"the functional collectives reached sollat {got['funcol_served']} times, not 3"
    # ... and under torch.compile(fullgraph=True) (the traced graph keeps the functional collectives;
    # aot_eager runs them: Inductor's code generation needs no more of the backend)
    def step(x: torch.Tensor) -> torch.Tensor:
        return funcol.all_reduce(x * 2, "sum", group) + 1

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    xs = inputs((6, 10), torch.float32, seed + 4)
    before = served()
    y = compiled(xs[rank])
    assert served() == before + 1, "the compiled all_reduce did not reach sollat"
    assert same_bits(y, rank_order_reduce([x * 2 for x in xs], "sum") + 1), "compiled funcol.all_reduce"
    # a DTensor tensor-parallel MLP (Colwise, Rowwise): its all-reduce is sollat's
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(3)  # the same weights on every rank
    mlp = torch.nn.Sequential(torch.nn.Linear(12, 6 * WORLD, bias=False), torch.nn.SiLU(),
                              torch.nn.Linear(6 * WORLD, 12, bias=False))
    xin = inputs((4, 12), torch.float32, seed + 5)[0]
    with torch.no_grad():
        want = mlp(xin)
        parallelize_module(mlp, init_device_mesh("cpu", (WORLD,)), {"0": ColwiseParallel(), "2": RowwiseParallel()})
        before = served()
        got_mlp = mlp(xin)
    assert served() == before + 1, f"the DTensor MLP's all-reduce reached sollat {served() - before} times, not once"
    torch.testing.assert_close(got_mlp, want, rtol=1e-5, atol=1e-5)
    counts = dist_backend.router().counts
    assert counts["all_reduce"] >= 10 and counts["inner:all_reduce"] >= 3, f"the router's counts: {dict(counts)}"
    assert counts["all_gather"] >= 2 and counts["reduce_scatter"] >= 4, f"the router's counts: {dict(counts)}"
    # a subgroup gets its own communicator, built on its first call
    built = len(_double.DOUBLES)
    sub = dist.new_group([0, 2])
    if rank in (0, 2):
        xs2 = inputs((40,), torch.float32, seed + 2)
        x = xs2[rank].clone()
        dist.all_reduce(x, group=sub)
        assert same_bits(x, rank_order_reduce([xs2[0], xs2[2]], "sum")), "subgroup all_reduce"
        assert len(_double.DOUBLES) == built + 1, "the subgroup did not get its own communicator"
        dist.all_reduce(x, group=sub)
        assert len(_double.DOUBLES) == built + 1, "a second call built another communicator"
    got["doubles"] = len(_double.DOUBLES)
    # the cap on communicators: ranks 0 and 2 have two, rank 1 one; at a cap of 2 only rank 1 could
    # build another, so no rank serves the new group (agreed), and its calls go to gloo
    from sollat.integrations import dist_router

    os.environ[dist_router.MAX_COMMUNICATORS_ENV] = "2"
    capped = dist.new_group([0, 1, 2])
    xs = inputs((50,), torch.float32, seed + 6)
    x = xs[rank].clone()
    before = served()
    dist.all_reduce(x, group=capped)
    torch.testing.assert_close(x, rank_order_reduce(xs, "sum"))
    assert served() == before and dist_backend.router(capped).comm is None, "a group beyond the cap was served"
    del os.environ[dist_router.MAX_COMMUNICATORS_ENV]
    # a call that differs on one rank (the middle one): CallMismatchError on every rank, nothing run
    n = 64 if rank != 1 else 65
    try:
        dist.all_reduce(torch.ones(n))
        got["mismatch"] = "none"
    except CallMismatchError as exc:
        got["mismatch"] = type(exc).__name__
    # the group still works after it
    xs = inputs((64,), torch.float32, seed + 3)
    x = xs[rank].clone()
    dist.all_reduce(x)
    assert same_bits(x, rank_order_reduce(xs, "sum")), "all_reduce after a mismatch"


def setup_string(rank: int, got: dict[str, Any]) -> None:
    """``cpu:gloo,cuda:sollat`` comes up on a machine without CUDA; CPU tensors go to gloo."""
    x = torch.full((5,), float(rank + 1))
    dist.all_reduce(x)
    assert torch.equal(x, torch.full((5,), 6.0)), "cpu all_reduce on cpu:gloo,cuda:sollat"
    got["backend"] = str(dist.get_backend())


def zero_change(rank: int, got: dict[str, Any]) -> None:
    """The zero-change mode with gloo standing in for NCCL: init_process_group("gloo") built a sollat
    group that still says gloo; so does a new group."""
    got["backend"] = str(dist.get_backend())
    xs = inputs((3, 11), torch.float32, 77)
    x = xs[rank].clone()
    before = served()
    dist.all_reduce(x)
    assert served() == before + 1 and same_bits(x, rank_order_reduce(xs, "sum")), "zero-change all_reduce"
    sub = dist.new_group([0, 1, 2])
    got["sub_backend"] = str(dist.get_backend(sub))
    x = xs[rank].clone()
    dist.all_reduce(x, group=sub)
    assert served() == before + 2 and same_bits(x, rank_order_reduce(xs, "sum")), "zero-change subgroup all_reduce"


def _rank(rank: int, mode: str, port: int, out: Path) -> None:
    from sollat.integrations import core, dist_backend

    got: dict[str, Any] = {"rank": rank}
    try:
        if os.environ.get("SOLLAT_TEST_ENTRY_POINT") != "1":
            dist_backend.register()
        if mode in ("checks", "zero_change"):
            dist_backend.serve_device_type("cpu")
            core.set_communicator_factory(DistDouble)
            backend = "cpu:sollat"
        if mode == "zero_change":
            from sollat.integrations import dist_zero_change

            dist_zero_change.enable({"gloo": "cpu:sollat"})
            backend = "gloo"
        elif mode != "checks":
            backend = "cpu:gloo,cuda:sollat"
        store = dist.TCPStore("127.0.0.1", port, WORLD, rank == 0, timeout=timedelta(seconds=60))
        dist.init_process_group(backend, store=store, rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
        {"checks": checks, "zero_change": zero_change, "setup": setup_string}[mode](rank, got)
        dist.barrier()
        dist.destroy_process_group()
        # Rank 0 hosts the store: it leaves last, once every rank has torn its group down (a peer
        # still tearing down against a store that is gone aborts in torch's C++ threads).
        store.add("left", 1)
        deadline = time.monotonic() + 60
        while rank == 0 and store.add("left", 0) < WORLD and time.monotonic() < deadline:
            time.sleep(0.01)
    except BaseException:
        got["error"] = traceback.format_exc()
    (out / f"{rank}.json").write_text(json.dumps(got))


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(mode, port, out), nprocs=WORLD)


if __name__ == "__main__":
    main()
