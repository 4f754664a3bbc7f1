"""CPU tests of the decode app: sharding math, greedy sampling, backends, memory, cost, arguments."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

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
from sollat.apps.decode import DecodeSession, compare_logits, cost_per_million_tokens, parse_args
from sollat.apps.llama import GIB, TPDecoder, full_logits, preset, rms_norm
from sollat.apps.llama_memory import estimate_memory, host_memory, largest_fitting, max_context

CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parents[2]
TINY = preset("tiny")


def model(tp: int, dtype: torch.dtype = torch.float64, **kw: int) -> TPDecoder:
    args = {"batch": 3, "context": 12, "max_len": 20} | kw
    return TPDecoder(TINY, tp=tp, ranks=range(tp), device=CPU, dtype=dtype, **args)


def backend(tp: int) -> ReferenceBackend:
    return ReferenceBackend(tp, name="cpu")


# ---- sharding math ---------------------------------------------------------------------------


@pytest.mark.parametrize("tp", [2, 4])
def test_sharded_weights_are_slices_of_the_unsharded_ones(tp: int) -> None:
    full, shard = model(1), model(tp)
    hd, d = TINY.head_dim, TINY.hidden
    q1 = full.shards[0].wqkv[0][:TINY.n_heads * hd]
    q_parts = [s.wqkv[0][:TINY.n_heads // tp * hd] for s in shard.shards]
    assert torch.equal(torch.cat(q_parts), q1)
    assert torch.equal(torch.cat([s.wo[1] for s in shard.shards], dim=1), full.shards[0].wo[1])
    assert torch.equal(torch.cat([s.w2[0] for s in shard.shards], dim=1), full.shards[0].w2[0])
    assert torch.equal(torch.cat([s.lm_head for s in shard.shards]), full.shards[0].lm_head)
    assert full.shards[0].w13[0].shape == (2 * TINY.ffn, d)
    # the prefilled cache is split by KV head
    assert torch.equal(torch.cat([c.k[0] for c in shard.caches], dim=1), full.caches[0].k[0])


@pytest.mark.parametrize("tp", [2, 4])
def test_sharded_layer_partials_sum_to_the_unsharded_layer(tp: int) -> None:
    """Each rank's attention / MLP output is a partial sum; the AllReduce of them is the full layer."""
    full, shard = model(1), model(tp)
    torch.manual_seed(0)
    h = torch.randn(3, TINY.hidden, dtype=torch.float64)
    pos = torch.tensor([12])
    cos, sin = full.cos.index_select(0, pos), full.sin.index_select(0, pos)
    invalid = full.positions > pos
    want_attn = full._attention(0, 0, h, cos, sin, pos, invalid)
    got_attn = backend(tp).all_reduce([shard._attention(i, 0, h, cos, sin, pos, invalid) for i in range(tp)])
    want_mlp = full._mlp(0, 1, h)
    got_mlp = backend(tp).all_reduce([shard._mlp(i, 1, h) for i in range(tp)])
    for got in got_attn:
        torch.testing.assert_close(got, want_attn, rtol=1e-12, atol=1e-12)
    for got in got_mlp:
        torch.testing.assert_close(got, want_mlp, rtol=1e-12, atol=1e-12)
    # the new keys went to the right heads of the right ranks
    k_full = full.caches[0].k[0][:, :, 12]
    k_shard = torch.cat([c.k[0][:, :, 12] for c in shard.caches], dim=1)
    torch.testing.assert_close(k_shard, k_full, rtol=0, atol=1e-12)


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
def test_sharded_decode_equals_unsharded(tp: int, dtype: torch.dtype, tol: float) -> None:
    full, shard = model(1, dtype), model(tp, dtype)
    start = torch.tensor([5, 100, 511])
    ref = DecodeSession(full, make_backend("noop", world_size=1, device=CPU, distributed=False),
                        start_tokens=start, use_graph=False)
    sh = DecodeSession(shard, backend(tp), start_tokens=start, use_graph=False)
    base, got, tokens = [], [], []
    for _ in range(6):
        base.append(full_logits(ref.step()))
        got.append(full_logits(sh.step()))
        tokens.append(sh.tokens.clone())
    assert torch.equal(ref.generated(), sh.generated())
    cmp = compare_logits(base, got, tol, tokens)
    assert cmp.max_abs_diff <= tol
    assert cmp.sampler_exact and cmp.ok and cmp.tokens_compared > 0
    assert len(sh.calls) == 2 * TINY.n_layers + 2
    assert [c.op for c in sh.calls[-2:]] == ["max", "min"]
    assert sh.calls[0].nbytes == 3 * TINY.hidden * torch.empty((), dtype=dtype).element_size()


def test_session_reset_and_teacher_forcing_reproduce_steps() -> None:
    m = model(2)
    sess = DecodeSession(m, backend(2), start_tokens=torch.tensor([1, 2, 3]), use_graph=False)
    first = [full_logits(sess.step()) for _ in range(3)]
    toks = sess.generated().clone()
    sess.reset()
    again = [full_logits(sess.step()) for _ in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert torch.equal(sess.generated(), toks)
    # teacher forcing: step 2 fed with step 1's own output reproduces the free-running step 2
    sess.reset()
    sess.step()
    forced = full_logits(sess.step(force_tokens=toks[0]))
    assert torch.equal(forced, first[1])
    sess.reset()
    for _ in range(sess.capacity):
        sess.step()
    with pytest.raises(RuntimeError, match="KV cache"):
        sess.step()


def test_greedy_sampler_breaks_ties_to_the_lowest_index_across_shards() -> None:
    m = model(2)
    v = m.vocab_local
    a = torch.zeros(3, v, dtype=torch.float64)
    b = torch.zeros(3, v, dtype=torch.float64)
    a[0, 7] = b[0, 2] = 5.0  # tie across shards -> rank 0's index
    b[1, 3] = 4.0  # only rank 1 -> global index v + 3
    b[2, 9] = a[2, 9] = 1.0
    b[2, 1] = 1.0  # tie inside rank 1 and across ranks -> rank 0's 9
    got = m._greedy([a, b], backend(2))
    assert got.tolist() == [7, v + 3, 9]
    assert got.tolist() == torch.cat([a, b], dim=-1).argmax(-1).tolist()


def test_rms_norm_matches_definition() -> None:
    x = torch.randn(4, 16, dtype=torch.float64)
    w = torch.randn(16, dtype=torch.float64)
    want = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5) * w
    torch.testing.assert_close(rms_norm(x, w, 1e-5), want)


# ---- backends --------------------------------------------------------------------------------


def test_reference_backend_accumulates_16_bit_sums_in_fp32_in_rank_order() -> None:
    # 1 + 2**-8 + 2**-8 in bf16: sequential bf16 adds lose both halves; fp32 accumulation keeps them.
    one = torch.tensor([1.0], dtype=torch.bfloat16)
    tiny = torch.tensor([2.0 ** -8], dtype=torch.bfloat16)
    got = ReferenceBackend(3).all_reduce([one, tiny, tiny])
    assert got[0].item() == 1.0 + 2.0 ** -7
    assert all(torch.equal(g, got[0]) for g in got) and got[0].data_ptr() != got[1].data_ptr()
    xs = [torch.tensor([1.0, -2.0]), torch.tensor([3.0, -5.0])]
    assert rank_order_reduce(xs, "max").tolist() == [3.0, -2.0]
    assert rank_order_reduce(xs, "min").tolist() == [1.0, -5.0]


def test_backend_call_checks_and_tracing() -> None:
    be = ReferenceBackend(2)
    with pytest.raises(ValueError, match="expected 2 shard"):
        be.all_reduce([torch.zeros(2)])
    with pytest.raises(ValueError, match="op 'prod'"):
        be.all_reduce([torch.zeros(2), torch.zeros(2)], op="prod")
    with pytest.raises(ValueError, match="differ"):
        be.all_reduce([torch.zeros(2), torch.zeros(3)])
    with be.tracing() as calls:
        be.all_reduce([torch.zeros(4), torch.zeros(4)])
        be.all_reduce([torch.zeros(2, dtype=torch.float16)] * 2, op="max")
    be.all_reduce([torch.zeros(4), torch.zeros(4)])
    assert [(c.op, c.nbytes) for c in calls] == [("sum", 16), ("max", 4)]
    assert be.rank_order_for(calls) and be.algorithm_for(calls[0]) == "reference"


def test_backend_specs() -> None:
    assert parse_backend_spec("sollat").algo == "auto"
    assert parse_backend_spec("sollat:oneshot_ll").label == "sollat:oneshot_ll"
    assert [s.label for s in parse_backend_list("nccl, sollat ,sollat:x")] == ["nccl", "sollat", "sollat:x"]
    for bad, msg in [("gloo", "unknown kind"), ("sollat:", "missing algorithm"), ("nccl:ring", "only sollat"),
                     ("nccl,nccl", "twice"), (",", "no backend")]:
        with pytest.raises(ValueError, match=msg):
            parse_backend_list(bad)
    assert make_backend("nccl", world_size=2, device=CPU, distributed=False).name == "nccl(reference)"
    assert make_backend("noop", world_size=4, device=CPU, distributed=False).n_local == 4
    with pytest.raises(ValueError, match="CUDA"):
        make_backend("sollat", world_size=2, device=CPU, distributed=False)


# ---- memory and cost -------------------------------------------------------------------------


@pytest.mark.parametrize("tp", [4, 8])
def test_full_70b_fits_a_141_gb_card_with_long_context(tp: int) -> None:
    cfg = preset("llama3.1-70b")
    assert cfg.params() == pytest.approx(70.55e9, rel=1e-3)
    budget = int(139 * GIB)  # what an H200 reports as total
    est = estimate_memory(cfg, tp=tp, n_local=1, batch=8, max_len=65536 + 256, dtype=torch.bfloat16)
    assert est.total < budget
    assert est.weights == pytest.approx(2 * (cfg.params() - cfg.vocab * cfg.hidden) / tp
                                        + 2 * cfg.vocab * cfg.hidden, rel=1e-3)
    assert max_context(cfg, tp=tp, n_local=1, batch=8, extra_tokens=256, dtype=torch.bfloat16,
                       budget=budget) > 100_000


def test_memory_estimate_refuses_the_whole_model_on_one_device() -> None:
    cfg = preset("llama3.1-70b")
    est = estimate_memory(cfg, tp=4, n_local=4, batch=8, max_len=4096, dtype=torch.bfloat16)
    assert est.total > 139 * GIB
    assert est.weights > 128 * GIB  # the whole model: no context fits beside it in 128 GiB
    assert max_context(cfg, tp=4, n_local=4, batch=8, extra_tokens=256, dtype=torch.bfloat16,
                       budget=128 * GIB) == 0
    small = replace(cfg, n_layers=2)
    ctx = max_context(small, tp=4, n_local=4, batch=8, extra_tokens=0, dtype=torch.bfloat16, budget=40 * GIB)
    assert estimate_memory(small, tp=4, n_local=4, batch=8, max_len=ctx, dtype=torch.bfloat16).total <= 40 * GIB
    assert estimate_memory(small, tp=4, n_local=4, batch=8, max_len=ctx + 1, dtype=torch.bfloat16).total > 40 * GIB


class _Allocated(Exception):
    """Raised by a stand-in TPDecoder: the run got past the memory check."""


def _no_model(*_args: object, **_kw: object) -> TPDecoder:
    raise _Allocated


def test_memory_check_refuses_on_the_cpu_before_allocating(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check runs on every device: with 20 GiB of host RAM the default 70B shape stops with the
    options that would make it fit, before any weight is allocated."""
    monkeypatch.setattr(decode, "available_memory", lambda device: (20 * GIB, 24 * GIB))
    monkeypatch.setattr(decode, "TPDecoder", _no_model)
    args = parse_args(["--device", "cpu"], NO_ENV)
    with pytest.raises(MemoryError) as exc:
        decode.run(args)
    msg = str(exc.value)
    assert "\n" not in msg and "on cpu but 20.0 GiB are free" in msg
    assert "--layers 1," in msg and "--model tiny" in msg and "--context" in msg and "--batch" in msg
    # a run that fits gets past the check
    monkeypatch.setattr(decode, "available_memory", lambda device: (4096 * GIB, 4096 * GIB))
    with pytest.raises(_Allocated):
        decode.run(args)


@pytest.mark.parametrize("extra", [[], ["--check-unsharded", "--virtual-tp", "2"]])
def test_memory_advice_names_the_largest_values_that_fit(extra: list[str]) -> None:
    args = parse_args(["--device", "cpu", "--layers", "8", "--context", "65536", *extra], NO_ENV)
    cfg, n_local = preset(args.model, args.layers), args.tp
    need = decode.peak_memory(cfg, args, n_local)[1]
    free = need * 2 // 3
    msg = decode.too_big_message(cfg, args, n_local, device=CPU, need=need, free=free)
    ways = dict(w.split() for w in msg.split("one of: ")[1].split(", or ")[0].split(", ") if w.startswith("--"))
    assert set(ways) == {"--layers", "--context", "--batch", "--model"}, msg

    def peak(**kw: int) -> int:
        layers = kw.get("layers", args.layers)
        return decode.peak_memory(replace(cfg, n_layers=layers), replace(args, **kw), n_local)[1]

    for opt, field in (("--layers", "layers"), ("--context", "context"), ("--batch", "batch")):
        best = int(ways[opt])
        assert peak(**{field: best}) <= free < peak(**{field: best + 1}), opt
    assert ("no --check-unsharded" in msg) == (decode.peak_memory(cfg, replace(args, check_unsharded=False),
                                                                  n_local)[1] <= free)


def test_host_memory_reads_meminfo_and_a_cgroup_limit(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:         1000000 kB\n"
                       "MemAvailable:   20000000 kB\nHugePages_Total:       0\n")
    assert host_memory(str(meminfo), str(tmp_path / "no-cgroup")) == (20000000 * 1024, 24000000 * 1024)
    (tmp_path / "memory.max").write_text("max\n")
    (tmp_path / "memory.current").write_text("1000\n")
    assert host_memory(str(meminfo), str(tmp_path)) == (20000000 * 1024, 24000000 * 1024)
    (tmp_path / "memory.max").write_text(f"{8 * GIB}\n")
    (tmp_path / "memory.current").write_text(f"{3 * GIB}\n")
    assert host_memory(str(meminfo), str(tmp_path)) == (5 * GIB, 8 * GIB)
    avail, total = host_memory(str(tmp_path / "no-meminfo"), str(tmp_path / "no-cgroup"))  # sysconf
    assert 0 < avail <= total
    free, total = decode.available_memory(CPU)
    assert 0 < free <= total


def test_largest_fitting() -> None:
    assert largest_fitting(lambda x: x <= 7, 80) == 7
    assert largest_fitting(lambda x: True, 80) == 80
    assert largest_fitting(lambda x: False, 80) == 0
    assert largest_fitting(lambda x: x <= 1, 1) == 1


def test_default_run_on_this_cpu_refuses_at_once_or_fits() -> None:
    """No arguments on a machine without a GPU: the 70B shape does not fit in the host RAM of a
    test machine, and the program must say so (exit 3) within seconds instead of allocating."""
    args = parse_args(["--device", "cpu"], NO_ENV)  # what the child sees with no GPU visible
    need = decode.peak_memory(preset(args.model, args.layers), args, args.tp)[1]
    if need <= host_memory()[0]:
        pytest.skip("this machine has the RAM for the default run")
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")} | {"CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-m", "sollat.apps.decode"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("decode: needs about") and "--layers" in lines[0], proc.stderr
    assert "built the model" not in proc.stdout


def test_cost_per_million_tokens() -> None:
    # $2/GPU-hour on 4 GPUs at 1000 tokens/s: $8 per 3.6 M tokens.
    assert cost_per_million_tokens(2.0, 4, 1000.0) == pytest.approx(8 / 3.6)
    assert cost_per_million_tokens(0.0, 8, 5.0) == 0.0
    # twice the throughput halves the cost; twice the GPUs doubles it
    assert cost_per_million_tokens(3.0, 8, 2000.0) == pytest.approx(cost_per_million_tokens(3.0, 8, 1000.0) / 2)
    assert cost_per_million_tokens(3.0, 8, 1000.0) == pytest.approx(2 * cost_per_million_tokens(3.0, 4, 1000.0))
    for bad in [(-1.0, 4, 10.0), (1.0, 0, 10.0), (1.0, 4, 0.0)]:
        with pytest.raises(ValueError):
            cost_per_million_tokens(*bad)


# ---- arguments -------------------------------------------------------------------------------

NO_ENV: dict[str, str] = {}
TORCHRUN = {"WORLD_SIZE": "4", "RANK": "1", "LOCAL_RANK": "1"}


def test_parse_defaults_and_torchrun() -> None:
    a = parse_args(["--device", "cpu"], NO_ENV)
    assert (a.layers, a.batch, a.tp, a.distributed, a.graph) == (80, 8, 1, False, False)
    assert a.dtype == torch.float32 and [s.label for s in a.backends] == ["cpu"]
    a = parse_args(["--backends", "nccl,sollat:oneshot_ll", "--layers", "4"], TORCHRUN)
    assert (a.tp, a.device, a.distributed, a.layers) == (4, "cuda:1", True, 4)
    assert a.dtype == torch.bfloat16 and a.logit_tol == decode.LOGIT_TOL[torch.bfloat16]
    assert a.max_len == a.context + a.warmup + a.steps


@pytest.mark.parametrize("argv,env,msg", [
    (["--batch", "0"], NO_ENV, "--batch must be >= 1"),
    (["--context", "-5"], NO_ENV, "--context must be >= 1"),
    (["--warmup", "-1"], NO_ENV, "--warmup must be >= 0"),
    (["--layers", "0"], NO_ENV, "--layers must be >= 1"),
    (["--price", "-2"], NO_ENV, "--price must be >= 0"),
    (["--virtual-tp", "3"], NO_ENV, "TP 3 must divide the 8 KV heads"),
    (["--virtual-tp", "0"], NO_ENV, "--virtual-tp must be >= 1"),
    (["--backends", "gloo"], NO_ENV, "unknown kind"),
    (["--backends", "noop"], NO_ENV, "only used internally"),
    (["--backends", "sollat", "--device", "cpu"], NO_ENV, "needs a CUDA device"),
    (["--virtual-tp", "2"], TORCHRUN, "do not combine it with torchrun"),
    (["--backends", "reference"], TORCHRUN, "only with --virtual-tp"),
    (["--check-unsharded"], TORCHRUN, "use --virtual-tp"),
    (["--model", "gpt"], NO_ENV, "invalid choice"),
])
def test_argument_errors(argv: list[str], env: dict[str, str], msg: str,
                         capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv if env else ["--device", "cpu", *argv], env)
    assert exc.value.code == 2
    assert msg in capsys.readouterr().err


def test_main_runs_tiny_model_on_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "decode.json"
    rc = decode.main(["--model", "tiny", "--device", "cpu", "--virtual-tp", "4", "--context", "16",
                      "--steps", "4", "--warmup", "1", "--check-steps", "3", "--check-unsharded",
                      "--backends", "cpu,reference", "--price", "4.5", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "result: ok" in text and "bitwise equal to cpu: yes" in text
    report = json.loads(out.read_text())
    assert report["ok"] and report["backends"] == ["cpu", "reference"]
    res = report["results"]["reference"]
    assert res["allreduces_per_step"] == 2 * TINY.n_layers + 2
    assert res["cost_per_million_tokens"] == pytest.approx(cost_per_million_tokens(4.5, 1, res["tokens_per_s"]))
    assert report["checks"]["reference"]["bitwise_vs_first"] is True
