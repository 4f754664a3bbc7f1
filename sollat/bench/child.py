"""A peer measured in its own process: ``python -m sollat.bench.child JOB.json RESULT.json``.

Started by ``peers.run_jobs`` with RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT
and the NCCL settings of the job in its environment (as torchrun would set them), one child
per rank. Times every (dtype, size, algo) with ``timing.time_calls``, exactly like the sollat
rows, keeps per replay the slowest rank, and rank 0 writes ``{"rows": [...]}`` to RESULT.json.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .env import SAFETY_ENV
from .peers import ChildJob, nccl_unavailable
from .results import ERROR, OK, SKIPPED, UNSUPPORTED, Row
from .stats import Stats
from .timing import calls_for, sets_for, time_calls


def _reason(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return text if len(text) <= 300 else text[:297] + "..."


def mark_failed(row: Row, exc: BaseException, job: ChildJob, world: int) -> Row:
    """The status of a row whose call raised: n/a (skipped) where NCCL has no algorithm/protocol it
    was asked for, unsupported where the implementation refuses the size, else an error."""
    msg = str(exc)
    na = nccl_unavailable(job.env, msg, world)  # the full text: the NCCL part comes after torch's
    if na is not None:
        row.status, row.reason = SKIPPED, na
    else:
        row.status = UNSUPPORTED if ("must be" in msg or "Not implemented" in msg) else ERROR
        row.reason = _reason(exc)
    return row


class _Ctx:
    def __init__(self, job: ChildJob) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.job = torch, dist, job
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(self.device)
        self.symm: Any = None
        if job.kind in ("nccl-window", "torch-symm"):
            import torch.distributed._symmetric_memory as symm_mem

            self.symm = symm_mem
            if job.kind == "nccl-window":
                try:
                    symm_mem.set_backend("NCCL")
                except AttributeError:
                    raise RuntimeError("this torch has no symm_mem.set_backend: no NCCL windows") from None
            # torch-symm keeps torch's default backend: on torch 2.11 set_backend("CUDA") raises
            # "SymmetricMemory does not find allocation backend CUDA" although CUDA is the default
            # (the same ops run fine without the call).
        dist.init_process_group("nccl", device_id=self.device)
        self.group_name = dist.group.WORLD.group_name
        self.max_bytes = max(job.sizes)
        self.n_sets = sets_for(self.world * self.max_bytes, max_sets=job.max_sets)
        self.symm_bufs: list[Any] = []
        if self.symm is not None:
            for _ in range(self.n_sets):
                b = self.symm.empty(self.max_bytes, dtype=torch.uint8, device=self.device)
                self.symm.rendezvous(b, self.group_name)
                self.symm_bufs.append(b)

    def inputs(self, nbytes: int, dtype: Any) -> list[Any]:
        torch = self.torch
        n = max(1, nbytes // dtype.itemsize)
        if self.symm_bufs:
            xs = [b.view(dtype)[:n] for b in self.symm_bufs]
            for x in xs:
                x.copy_(torch.randn(n, device=self.device).to(dtype))
            return xs
        return [torch.randn(n, device=self.device).to(dtype) for _ in range(self.n_sets)]

    def op(self, algo: str, xs: list[Any]) -> tuple[Callable[[int], None], Callable[[], str]]:
        """(call(i), check()) of one peer algorithm on the input sets ``xs``."""
        torch, dist = self.torch, self.dist
        if self.job.kind in ("nccl", "nccl-window"):
            def call(i: int) -> None:
                dist.all_reduce(xs[i % len(xs)])  # in place: values grow, which NCCL does not care about

            return call, lambda: "n/a (in place)"
        if algo == "one_shot":
            outs = [torch.empty_like(x) for x in xs]

            def call1(i: int) -> None:
                s = i % len(xs)
                torch.ops.symm_mem.one_shot_all_reduce_out(xs[s], "sum", self.group_name, outs[s])

            def check1() -> str:
                for x, o in zip(xs, outs, strict=True):
                    ref = x.to(torch.float32, copy=True)  # .float() of float32 is x itself
                    dist.all_reduce(ref)
                    if not torch.allclose(o.float(), ref, rtol=2e-2, atol=2e-2):
                        return "mismatch (one_shot_all_reduce_out vs NCCL sum)"
                return "ok"

            return call1, check1
        if algo == "two_shot":
            def call2(i: int) -> None:
                torch.ops.symm_mem.two_shot_all_reduce_(xs[i % len(xs)], "sum", self.group_name)

            return call2, lambda: "n/a (in place)"
        raise ValueError(f"unknown algorithm {algo!r} for {self.job.kind}")

    def slowest(self, per_call: list[float]) -> list[float]:
        if self.world == 1:
            return per_call
        got: list[Any] = [None] * self.world
        self.dist.all_gather_object(got, per_call)
        return [max(v) for v in zip(*got, strict=True)]

    def sync(self) -> Callable[[], None] | None:
        return self.dist.barrier if self.world > 1 else None


def run(job: ChildJob) -> list[Row]:
    ctx = _Ctx(job)
    torch = ctx.torch
    rows: list[Row] = []
    for dname in job.dtypes:
        dtype = getattr(torch, dname)
        for nbytes in job.sizes:
            try:
                xs = ctx.inputs(nbytes, dtype)
            except Exception as exc:
                rows += [Row(job.impl, a, ctx.world, dname, nbytes, status=ERROR, reason=_reason(exc), env=job.env)
                         for a in job.algos]
                continue
            for algo in job.algos:
                row = Row(job.impl, algo, ctx.world, dname, nbytes, env=dict(job.env))
                calls = calls_for(nbytes, job.max_calls)
                try:
                    call, check = ctx.op(algo, xs)
                    t = time_calls(call, calls=calls, replays=job.replays, warmup=job.warmup, sync=ctx.sync(),
                                   device=ctx.device)
                    row.set_stats(Stats.of(ctx.slowest(t.per_call_us)))
                    row.calls_per_graph, row.replays, row.status = calls, job.replays, OK
                    row.check = check()
                except Exception as exc:
                    mark_failed(row, exc, job, ctx.world)
                rows.append(row)
    ctx.dist.destroy_process_group()
    return rows


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m sollat.bench.child JOB.json RESULT.json", file=sys.stderr)
        return 2
    os.environ.update(SAFETY_ENV)
    job = ChildJob.from_json(Path(args[0]).read_text())
    os.environ.update(job.env)
    rows = run(job)
    if int(os.environ.get("RANK", "0")) == 0:
        import torch

        doc = {"peer": job.peer, "env": job.env, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
               "rows": [r.to_dict() for r in rows]}
        Path(args[1]).write_text(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
