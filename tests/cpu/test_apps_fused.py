"""CPU tests of decode's fused AllReduce + residual add + RMSNorm path (the ``sollat_fused`` backend).

The sollat communicators need a GPU, so the backends get stand-ins: ``all_reduce`` is the rank-order
sum and ``all_reduce_rmsnorm`` is ``sollat.rmsnorm.reference``, the kernel's arithmetic on the CPU.
"""

from __future__ import annotations

import json
import multiprocessing
import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from sollat.apps import decode
from sollat.apps.backends import (
    ReferenceBackend,
    make_backend,
    parse_backend_list,
    parse_backend_spec,
    rank_order_reduce,
)
from sollat.apps.decode import DecodeSession, compare_logits, parse_args
from sollat.apps.fused import FUSED_OP, SollatFusedDistBackend, SollatFusedVirtualBackend
from sollat.apps.llama import TPDecoder, full_logits, preset, rms_norm
from sollat.collectives import rmsnorm

CPU = torch.device("cpu")
TINY = preset("tiny")
NO_ENV: dict[str, str] = {}
TORCHRUN = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}


def fused_reference(xs: Sequence[torch.Tensor], residual: torch.Tensor, weight: torch.Tensor, eps: float,
                    algo: str, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every algorithm's bits are rmsnorm.reference's (no geometry, no world size: ``algo`` and
    ``world`` only name the call)."""
    return rmsnorm.algo_reference(algo, list(xs), residual, weight, eps)


class FakeVirtualComm:
    """A ``VirtualCommunicator`` stand-in; records the calls (``auto`` means ``self.auto``)."""

    def __init__(self, world: int, auto: str = "oneshot_ll") -> None:
        self.world = world
        self.auto = auto
        self.plain: list[tuple[str, str]] = []  # (op, algo)
        self.fused: list[tuple[str, float, torch.Tensor]] = []  # (algo, eps, weight)

    def all_reduce(self, shards: Sequence[torch.Tensor], op: str = "sum", algo: str = "auto") -> list[torch.Tensor]:
        self.plain.append((op, algo))
        total = rank_order_reduce(shards, op)
        return [total.clone() for _ in shards]

    def all_reduce_rmsnorm(self, xs: Sequence[torch.Tensor], residuals: Sequence[torch.Tensor], weight: torch.Tensor,
                           eps: float = 1e-6, algo: str = "auto") -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        self.fused.append((algo, eps, weight))
        name = self.auto if algo == "auto" else algo
        both = [fused_reference(xs, residuals[r], weight, eps, name, self.world) for r in range(self.world)]
        return [y for y, _ in both], [r for _, r in both]

    def selected_rmsnorm_algorithm(self, nbytes: int, dtype: torch.dtype, rows: int = 1) -> str:
        return self.auto


def model(tp: int, dtype: torch.dtype = torch.float32, ranks: Sequence[int] | None = None) -> TPDecoder:
    return TPDecoder(TINY, tp=tp, ranks=range(tp) if ranks is None else ranks, batch=3, context=12, max_len=20,
                     device=CPU, dtype=dtype)


def fused_backend(tp: int, algo: str = "auto") -> tuple[SollatFusedVirtualBackend, FakeVirtualComm]:
    comm = FakeVirtualComm(tp)
    return SollatFusedVirtualBackend(tp, CPU, algo, comm=comm), comm


START = torch.tensor([5, 100, 511])


def run_steps(m: TPDecoder, backend: Any, n: int = 5, forced: list[torch.Tensor] | None = None
              ) -> tuple[list[torch.Tensor], list[torch.Tensor], DecodeSession]:
    sess = DecodeSession(m, backend, start_tokens=START, use_graph=False)
    logits, tokens = [], []
    for i in range(n):
        logits.append(full_logits(sess.step(None if forced is None else forced[i])))
        tokens.append(sess.tokens.clone())
    return logits, tokens, sess


# ---- the model step --------------------------------------------------------------------------


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 0.125)])
def test_fused_step_matches_unfused(tp: int, dtype: torch.dtype, tol: float) -> None:
    """Teacher-forced with the unfused run's tokens, the fused path gives the same logits within the
    dtype's tolerance, the same greedy tokens where the margin decides, and an exact sampler."""
    m = model(tp, dtype)
    base, base_tokens, plain = run_steps(m, ReferenceBackend(tp, name="cpu"))
    be, comm = fused_backend(tp)
    got, tokens, sess = run_steps(m, be, forced=[START, *base_tokens[:-1]])
    cmp = compare_logits(base, got, tol, tokens)
    assert cmp.max_abs_diff <= tol and cmp.ok and cmp.sampler_exact and cmp.tokens_compared > 0
    # one fused call per sync point of a layer, the sampler's two plain calls (auto), nothing else
    n = 2 * TINY.n_layers
    assert [c.op for c in sess.calls] == [FUSED_OP] * n + ["max", "min"]
    assert [c.op for c in plain.calls] == ["sum"] * n + ["max", "min"]
    es = torch.empty((), dtype=dtype).element_size()
    assert (sess.calls[0].nbytes, sess.calls[0].hidden, sess.calls[0].eps) == (3 * TINY.hidden * es, TINY.hidden,
                                                                                TINY.norm_eps)
    assert len(comm.fused) == n * 6 and comm.plain == [("max", "auto"), ("min", "auto")] * 6  # 6 = traced + 5
    assert be.rank_order_for(sess.calls) is False


def test_fused_calls_use_the_norm_that_follows_each_allreduce() -> None:
    """Attention's AllReduce is fused with the layer's MLP norm, the MLP's with the next layer's
    attention norm, and the last one with the final norm."""
    m = model(2)
    be, comm = fused_backend(2)
    run_steps(m, be, n=1)
    w = m.shared
    want = []
    for layer in range(TINY.n_layers):
        want += [w.mlp_norm[layer], w.attn_norm[layer + 1] if layer + 1 < TINY.n_layers else w.final_norm]
    step = comm.fused[-len(want):]
    assert all(got is exp for (_, _, got), exp in zip(step, want, strict=True))
    assert all(eps == TINY.norm_eps and algo == "auto" for algo, eps, _ in step)


def test_fused_step_bits_are_the_fused_arithmetic(monkeypatch: pytest.MonkeyPatch) -> None:
    """In fp32 the unfused ``x + allreduce(partial)`` is the same bits as the fused ``round(sum +
    residual)``, so with the model's rms_norm replaced by the kernel's norm (the fused reference with
    nothing to reduce) both paths must give bitwise the same logits: a residual, weight or output
    mix-up in the fused path cannot hide under a tolerance here."""
    import sollat.apps.llama as llama

    def kernel_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        return fused_reference([torch.zeros_like(rows)], rows, weight, eps, "oneshot_sentinel", 2)[0].reshape(x.shape)

    # layer 0's input norm is not fused (nothing is reduced before it): both runs use kernel_norm there
    torch_norm = llama.rms_norm
    monkeypatch.setattr(llama, "rms_norm", kernel_norm)
    m = model(2, torch.float32)
    got, _, _ = run_steps(m, fused_backend(2, "oneshot_sentinel")[0], n=3)
    want, _, _ = run_steps(m, ReferenceBackend(2, name="cpu"), n=3)
    other, _, _ = run_steps(m, fused_backend(2, "oneshot_ll")[0], n=3)
    assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(want, other, strict=True))  # every algorithm: the same bits
    monkeypatch.setattr(llama, "rms_norm", torch_norm)
    plain, _, _ = run_steps(m, ReferenceBackend(2, name="cpu"), n=3)
    assert not all(torch.equal(a, b) for a, b in zip(want, plain, strict=True))  # the norm's order shows


def test_unfused_step_is_allreduce_add_norm() -> None:
    """The refactored step still does, for the other backends, x + allreduce(partial) then rms_norm."""
    m = model(2, torch.float64)
    logits = run_steps(m, ReferenceBackend(2, name="cpu"), n=1)[0][0]
    # an independent transcription of the pre-norm step on both ranks, unsharded sums in fp64
    pos = torch.tensor([m.context])
    fresh = model(2, torch.float64)  # the KV caches of ``m`` were written by the step above
    cos, sin, invalid = fresh.cos.index_select(0, pos), fresh.sin.index_select(0, pos), fresh.positions > pos
    x = torch.nn.functional.embedding(START, fresh.shared.embed)
    for layer in range(TINY.n_layers):
        h = rms_norm(x, fresh.shared.attn_norm[layer], TINY.norm_eps)
        x = x + sum(fresh._attention(i, layer, h, cos, sin, pos, invalid) for i in range(2))
        h = rms_norm(x, fresh.shared.mlp_norm[layer], TINY.norm_eps)
        x = x + sum(fresh._mlp(i, layer, h) for i in range(2))
    h = rms_norm(x, fresh.shared.final_norm, TINY.norm_eps)
    want = torch.cat([torch.nn.functional.linear(h, s.lm_head) for s in fresh.shards], dim=-1)
    torch.testing.assert_close(logits, want.float(), rtol=0, atol=1e-6)  # full_logits is fp32


# ---- the backend -----------------------------------------------------------------------------


def test_fused_backend_checks_and_replay() -> None:
    be, comm = fused_backend(2, "oneshot_ll")
    x = [torch.randn(3, 8), torch.randn(3, 8)]
    w = torch.ones(8)
    with pytest.raises(ValueError, match="expected 2 partial"):
        be.all_reduce_rmsnorm(x[:1], x, w, 1e-5)
    with pytest.raises(ValueError, match="expected 2 residual"):
        be.all_reduce_rmsnorm(x, x[:1], w, 1e-5)
    with pytest.raises(ValueError, match="differ in shape"):
        be.all_reduce_rmsnorm(x, [x[0], x[1].double()], w, 1e-5)
    with pytest.raises(ValueError, match="one dtype"):
        be.all_reduce_rmsnorm(x, x, w.half(), 1e-5)
    with be.tracing() as calls:
        ys, rs = be.all_reduce_rmsnorm(x, x, w, 1e-5)
        be.all_reduce([torch.zeros(3)] * 2, op="max")
    assert comm.fused[-1][0] == "oneshot_ll" and comm.plain[-1] == ("max", "auto")
    torch.testing.assert_close(rs[1], x[0] + x[1] + x[1])  # rank 1: the sum plus its own residual
    torch.testing.assert_close(ys[0], rms_norm(rs[0], w, 1e-5))
    assert [be.algorithm_for(c) for c in calls] == ["oneshot_ll", "auto"]  # comm has no selector: auto
    for c in calls:  # "AR alone" replays each call on zero buffers of its own
        before = (len(comm.fused), len(comm.plain))
        be.replay_call(c, CPU)()
        assert (len(comm.fused), len(comm.plain)) == (before[0] + (c.op == FUSED_OP), before[1] + (c.op != FUSED_OP))
    auto, _ = fused_backend(2)
    assert auto.name == "sollat_fused" and auto.algorithm_for(calls[0]) == "oneshot_ll"  # what auto resolved to
    with pytest.raises(ValueError, match="unknown fused algorithm"):
        SollatFusedVirtualBackend(2, CPU, "twoshot", comm=FakeVirtualComm(2))


def test_fused_dist_backend_passes_one_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 4)

    class Comm:
        seen: list[tuple[Any, ...]] = []

        def all_reduce_rmsnorm(self, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
            self.seen.append(args)
            return args[0] + 1, args[1] + 2

        def all_reduce(self, x: torch.Tensor, op: str = "sum", algo: str = "auto") -> torch.Tensor:
            self.seen.append((op, algo))
            return x

    comm = Comm()
    be = SollatFusedDistBackend(None, "oneshot_sentinel", comm=comm)
    assert (be.world_size, be.n_local, be.name) == (4, 1, "sollat_fused:oneshot_sentinel")
    x, r, w = torch.zeros(2, 4), torch.zeros(2, 4), torch.ones(4)
    ys, rs = be.all_reduce_rmsnorm([x], [r], w, 1e-5)
    assert comm.seen[0] == (x, r, w, 1e-5, "oneshot_sentinel")
    assert torch.equal(ys[0], x + 1) and torch.equal(rs[0], r + 2)
    be.all_reduce([x], op="min")
    assert comm.seen[1] == ("min", "auto")


def test_fused_specs_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_backend_spec("sollat_fused") == parse_backend_spec(" sollat_fused ")
    assert parse_backend_spec("sollat_fused").label == "sollat_fused"
    assert parse_backend_spec("sollat_fused:oneshot_ll").label == "sollat_fused:oneshot_ll"
    assert [s.label for s in parse_backend_list("nccl,sollat,sollat_fused")] == ["nccl", "sollat", "sollat_fused"]
    for bad, msg in [("sollat_fused:", "missing algorithm name after 'sollat_fused:'"),
                     ("sollat_fused:twoshot", "unknown fused algorithm"),
                     ("sollat_fused,sollat_fused", "twice"), ("sollatfused", "unknown kind")]:
        with pytest.raises(ValueError, match=msg):
            parse_backend_list(bad)
    with pytest.raises(ValueError, match="CUDA"):
        make_backend("sollat_fused", world_size=2, device=CPU, distributed=False)
    a = parse_args(["--backends", "nccl,sollat,sollat_fused,sollat_fused:oneshot_sentinel"], TORCHRUN)
    assert [s.kind for s in a.backends] == ["nccl", "sollat", "sollat_fused", "sollat_fused"]
    for argv, env, msg in [(["--device", "cpu", "--backends", "sollat_fused"], NO_ENV, "needs a CUDA device"),
                           (["--backends", "sollat_fused:ring"], TORCHRUN, "unknown fused algorithm")]:
        with pytest.raises(SystemExit) as exc:
            parse_args(argv, env)
        assert exc.value.code == 2 and msg in capsys.readouterr().err


# ---- the app ---------------------------------------------------------------------------------


def test_decode_run_reports_the_fused_backend(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The whole app on the CPU with the stand-in: checked against the unsharded model, timed, and
    in the ITL table beside the cpu backend and the no-AllReduce step."""
    real = decode.make_backend

    def make(spec: Any, **kw: Any) -> Any:
        if getattr(spec, "kind", spec) == "sollat_fused":
            return fused_backend(kw["world_size"], spec.algo)[0]
        return real(spec, **kw)

    monkeypatch.setattr(decode, "make_backend", make)
    out = tmp_path / "decode.json"
    args = parse_args(["--model", "tiny", "--device", "cpu", "--virtual-tp", "2", "--context", "16", "--steps", "3",
                       "--warmup", "1", "--check-steps", "3", "--check-unsharded", "--json", str(out)], NO_ENV)
    args = replace(args, backends=parse_backend_list("cpu,sollat_fused"))
    report = decode.run(args)
    text = capsys.readouterr().out
    assert report["ok"], text
    table = text.split("timing:")[1].split("AllReduces:")[0]
    names = [line.split("  ")[0] for line in table.strip().splitlines()[2:]]
    assert names == ["cpu", "sollat_fused", "no AllReduce (noop)"], table
    assert "sollat_fused: 6 per step: 4 x 2 KiB float32 sum+rmsnorm [oneshot_ll]" in text
    assert re.search(r"sollat_fused +max\|diff\|.*bitwise equal to cpu: .* \(not required\)  ok", text), text
    saved = json.loads(out.read_text())
    res = saved["results"]["sollat_fused"]
    assert [c["op"] for c in res["allreduce_calls"]] == [FUSED_OP] * 4 + ["max", "min"]
    assert res["isolated_ar_ms_per_step"] > 0 and not res["rank_order"]
    assert saved["checks"]["sollat_fused"]["ok"] and saved["checks"]["sollat_fused"]["bitwise_expected"] is False
    assert saved["noop"]["itl_ms_p50"] == saved["noop_step_ms"] > 0


# ---- two processes (gloo): the torchrun path -------------------------------------------------


class FakeDistComm:
    """A ``sollat.Communicator`` stand-in over a gloo group: gathers the partials, then the reference."""

    def all_reduce(self, x: torch.Tensor, op: str = "sum", algo: str = "auto") -> torch.Tensor:
        return rank_order_reduce(self._gather(x), op)

    def all_reduce_rmsnorm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                           algo: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
        return fused_reference(self._gather(x), residual, weight, eps, "oneshot_ll", 2)

    @staticmethod
    def _gather(x: torch.Tensor) -> list[torch.Tensor]:
        import torch.distributed as dist

        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return parts


def _dist_worker(rank: int, init: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        be = SollatFusedDistBackend(None, comm=FakeDistComm())
        logits, tokens, _ = run_steps(model(2, ranks=(rank,)), be, n=3)
        gathered = []
        for lg in logits:  # logits here are this rank's vocabulary shard
            parts = [torch.empty_like(lg) for _ in range(2)]
            dist.all_gather(parts, lg)
            gathered.append(torch.cat(parts, dim=-1))
        if rank == 0:
            torch.save({"logits": gathered, "tokens": tokens}, out)
    finally:
        dist.destroy_process_group()


def test_fused_backend_under_two_processes_equals_virtual_ranks(tmp_path: Path) -> None:
    """The torchrun path (one rank per process, ``Communicator``-shaped calls) gives bitwise the
    virtual-rank path's logits and tokens."""
    ctx = multiprocessing.get_context("spawn")
    out = tmp_path / "dist.pt"
    procs = [ctx.Process(target=_dist_worker, args=(r, f"file://{tmp_path / 'pg'}", str(out))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    dist_run = torch.load(out)
    want, tokens, _ = run_steps(model(2), fused_backend(2)[0], n=3)
    assert all(torch.equal(a, b) for a, b in zip(want, dist_run["logits"], strict=True))
    assert all(torch.equal(a, b) for a, b in zip(tokens, dist_run["tokens"], strict=True))
