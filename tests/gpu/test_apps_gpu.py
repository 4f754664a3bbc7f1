"""GPU checks of the apps with virtual ranks on one GPU (run with -s to see the measured differences).

* decode: Llama-3.1-70B shapes with 2 layers, TP 2 and 4 as virtual ranks, CUDA graphs. Every backend
  (rank-order reference, sollat auto, each sollat algorithm forced) is teacher-forced with the
  unsharded model's tokens; logits must agree with the unsharded model within LOGIT_TOL, greedy
  tokens wherever the top-two margin exceeds twice that, and every rank-order (deterministic)
  path must give bitwise the same logits as the reference and as each other.
* decode, fused: the same check for ``sollat_fused`` (auto and each fused algorithm forced), whose
  step makes one ``all_reduce_rmsnorm`` per layer sync point; its replays are reproducible bitwise.
  With two or more GPUs, the app under torchrun with nccl, sollat and sollat_fused.
* CG: virtual 2 and 4 ranks reproduce the single-rank residual history within HISTORY_TOL with the
  same iteration count; rank-order paths are bitwise equal to each other.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sollat.apps import cg, decode
from sollat.apps.backends import make_backend
from sollat.apps.cg import HISTORY_TOL, Solver, compare_histories
from sollat.apps.decode import LOGIT_TOL, DecodeSession, compare_logits
from sollat.apps.fused import FUSED_OP
from sollat.apps.llama import TPDecoder, full_logits, preset
from sollat.apps.poisson import PoissonCG

pytestmark = pytest.mark.gpu

DEV = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
CFG = preset("llama3.1-70b", n_layers=2)
BATCH, CONTEXT, STEPS = 8, 256, 4
DTYPE = torch.bfloat16
TOL = LOGIT_TOL[DTYPE]


def sollat_algorithms(world: int, dtype: torch.dtype) -> list[str]:
    import sollat
    from sollat.collectives.algorithms import ALGORITHMS

    names = sollat.VirtualCommunicator(world, DEV).algorithms
    return [a for a in names if dtype in ALGORITHMS[a].dtypes]


def specs(world: int, dtype: torch.dtype) -> list[str]:
    return ["reference", "sollat"] + [f"sollat:{a}" for a in sollat_algorithms(world, dtype)]


def new_model(tp: int) -> TPDecoder:
    return TPDecoder(CFG, tp=tp, ranks=range(tp), batch=BATCH, context=CONTEXT, max_len=CONTEXT + 8,
                     device=DEV, dtype=DTYPE, seed=0)


def release() -> None:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


@pytest.fixture(scope="module")
def unsharded() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Logits of STEPS free-running steps of the TP-1 model, and the tokens fed at each step."""
    model = new_model(1)
    start = torch.randint(CFG.vocab, (BATCH,), generator=torch.Generator().manual_seed(0))
    sess = DecodeSession(model, make_backend("noop", world_size=1, device=DEV, distributed=False),
                         start_tokens=start, use_graph=True)
    logits, inputs = [], [start]
    for _ in range(STEPS):
        logits.append(full_logits(sess.step()).cpu())
        inputs.append(sess.tokens.cpu().clone())
    del sess, model
    release()
    return logits, inputs


@pytest.mark.parametrize("tp", [2, 4])
def test_decode_virtual_tp_matches_unsharded(tp: int, unsharded: tuple[list[torch.Tensor], list[torch.Tensor]]) -> None:
    base, inputs = unsharded
    model = new_model(tp)
    got: dict[str, list[torch.Tensor]] = {}
    rank_order: dict[str, bool] = {}
    for spec in specs(tp, DTYPE):
        backend = make_backend(spec, world_size=tp, device=DEV, distributed=False)
        sess = DecodeSession(model, backend, start_tokens=inputs[0], use_graph=True)
        assert len(sess.calls) == 2 * CFG.n_layers + 2
        assert sess.calls[0].nbytes == BATCH * CFG.hidden * 2  # 128 KiB
        logits, tokens = [], []
        for i in range(STEPS):
            logits.append(full_logits(sess.step(force_tokens=inputs[i].to(DEV))).cpu())
            tokens.append(sess.tokens.cpu().clone())
        cmp = compare_logits(base, logits, TOL, tokens)
        algos = sorted({backend.algorithm_for(c) for c in sess.calls})
        print(f"\ndecode TP {tp} {spec} {algos}: max|logit diff| vs unsharded {cmp.max_abs_diff:.4g} "
              f"(tol {TOL}); greedy equal {cmp.tokens_equal}/{cmp.tokens_compared} where margin > {2 * TOL}")
        assert cmp.max_abs_diff <= TOL
        assert cmp.ok and cmp.tokens_compared > 0
        assert cmp.sampler_exact  # the two-AllReduce argmax picked argmax(logits)
        got[spec] = logits
        rank_order[spec] = backend.rank_order_for(sess.calls)
        del sess, backend
        release()
    det = [s for s in got if rank_order[s]]
    assert "reference" in det and len(det) >= 3
    for s in det[1:]:
        same = all(torch.equal(a, b) for a, b in zip(got["reference"], got[s], strict=True))
        print(f"decode TP {tp} {s}: bitwise equal to reference: {same}")
        assert same, f"{s} is a rank-order path but its logits differ from the reference"
    del model
    release()


def fused_specs() -> list[str]:
    from sollat.collectives import algorithms, rmsnorm

    names = rmsnorm.ALGOS if algorithms.rmsnorm_twoshot_enabled() else rmsnorm.AUTO_ALGOS  # two-shot: opt-in
    return ["sollat_fused"] + [f"sollat_fused:{a}" for a in (*names, rmsnorm.UNFUSED)]


@pytest.mark.parametrize("tp", [2, 4])
def test_decode_virtual_tp_fused_matches_unsharded(tp: int,
                                                   unsharded: tuple[list[torch.Tensor], list[torch.Tensor]]) -> None:
    """sollat_fused (AllReduce + residual add + next RMSNorm in one kernel, CUDA graphs) against the
    unsharded model: within the tolerance, never required bitwise (its sum of squares is sollat's
    pairwise tree, not torch's rms_norm order)."""
    from sollat.collectives import rmsnorm

    base, inputs = unsharded
    model = new_model(tp)
    for spec in fused_specs():
        backend = make_backend(spec, world_size=tp, device=DEV, distributed=False)
        sess = DecodeSession(model, backend, start_tokens=inputs[0], use_graph=True)
        assert sess.graph is not None
        assert [c.op for c in sess.calls] == [FUSED_OP] * (2 * CFG.n_layers) + ["max", "min"]
        assert (sess.calls[0].nbytes, sess.calls[0].hidden) == (BATCH * CFG.hidden * 2, CFG.hidden)
        algo = backend.algorithm_for(sess.calls[0])
        assert algo in rmsnorm.PUBLIC_ALGOS and (spec == "sollat_fused" or spec.endswith(":" + algo))
        logits, tokens = [], []
        for i in range(STEPS):
            logits.append(full_logits(sess.step(force_tokens=inputs[i].to(DEV))).cpu())
            tokens.append(sess.tokens.cpu().clone())
        cmp = compare_logits(base, logits, TOL, tokens)
        print(f"\ndecode TP {tp} {spec} [{algo}]: max|logit diff| vs unsharded {cmp.max_abs_diff:.4g} "
              f"(tol {TOL}); greedy equal {cmp.tokens_equal}/{cmp.tokens_compared} where margin > {2 * TOL}")
        assert cmp.max_abs_diff <= TOL
        assert cmp.ok and cmp.tokens_compared > 0
        assert cmp.sampler_exact
        assert not backend.rank_order_for(sess.calls)
        # the fused kernel has no atomics: replaying the first step again gives the same bits
        sess.reset()
        again = full_logits(sess.step(force_tokens=inputs[0].to(DEV))).cpu()
        assert torch.equal(again, logits[0]), f"{spec}: a replay of step 0 changed the logits"
        del sess, backend
        release()
    del model
    release()


def test_decode_cli_virtual_tp_fused(capsys: pytest.CaptureFixture[str]) -> None:
    rc = decode.main(["--virtual-tp", "2", "--layers", "1", "--context", "128", "--steps", "8", "--warmup", "2",
                      "--check-steps", "2", "--check-unsharded", "--backends", "nccl,sollat,sollat_fused"])
    out = capsys.readouterr().out
    print(out)
    assert rc == 0 and "result: ok" in out
    table = out.split("\ntiming:")[1].split("\nAllReduces:")[0].splitlines()[2:]
    assert [line.split("  ")[0] for line in table] == ["nccl(reference)", "sollat", "sollat_fused",
                                                        "no AllReduce (noop)"], table
    assert "sum+rmsnorm" in out
    release()


@pytest.mark.multigpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs >= 2 GPUs")
def test_decode_torchrun_two_gpus_fused(tmp_path: Path) -> None:
    """The app under torchrun on 2 GPUs (sollat.Communicator.all_reduce_rmsnorm on real ranks),
    teacher-forced against NCCL's tokens; exit status 0 only if every check passed."""
    root = Path(__file__).parents[2]
    env = dict(os.environ) | {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                              "NVSHMEM_DISABLE_NVLS": "1", "PYTHONUNBUFFERED": "1",
                              "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    report = tmp_path / "decode.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
           "sollat.apps.decode", "--layers", "2", "--context", "256", "--steps", "16", "--warmup", "4",
           "--check-steps", "4", "--backends", "nccl,sollat,sollat_fused", "--json", str(report)]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    print(proc.stdout[-6000:])
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-4000:]
    data = json.loads(report.read_text())
    assert data["ok"] and data["n_gpus"] == 2 and data["noop"]["itl_ms_p50"] > 0
    fused = data["results"]["sollat_fused"]
    ops = [c["op"] for c in fused["allreduce_calls"]]
    assert ops == [FUSED_OP] * 4 + ["max", "min"]
    from sollat.collectives import rmsnorm

    # batch rows of the model's hidden size: auto's choice (rmsnorm.auto_choice), never the two-shot
    assert fused["allreduce_calls"][0]["algorithm"] in (*rmsnorm.AUTO_ALGOS, rmsnorm.UNFUSED)
    assert data["checks"]["sollat_fused"]["ok"]


@pytest.mark.parametrize("world", [2, 4])
def test_cg_virtual_ranks_match_single_rank(world: int) -> None:
    n, nrhs, tol, dtype = 48, 2, 1e-10, torch.float64
    single = PoissonCG(n, nrhs, world_size=1, ranks=(0,), device=DEV, dtype=dtype, capacity=1000)
    one = Solver(single, make_backend("noop", world_size=1, device=DEV, distributed=False),
                 chunk=10, use_graph=True).solve(tol, 900)
    assert one.iterations > 0 and one.residuals is not None
    problem = PoissonCG(n, nrhs, world_size=world, ranks=range(world), device=DEV, dtype=dtype, capacity=1000)
    got: dict[str, torch.Tensor] = {}
    rank_order: dict[str, bool] = {}
    for spec in specs(world, dtype):
        backend = make_backend(spec, world_size=world, device=DEV, distributed=False)
        solver = Solver(problem, backend, chunk=10, use_graph=True)
        s = solver.solve(tol, 900)
        assert s.residuals is not None
        rel, _ = compare_histories(one.residuals, s.residuals, one.iterations)
        print(f"\ncg {world} ranks {spec}: {s.iterations} iterations (single rank {one.iterations}); "
              f"max rel history diff {rel:.3g} (tol {HISTORY_TOL[dtype]}); "
              f"{1e3 * min(s.iter_ms):.1f} us/iteration")
        assert s.iterations == one.iterations
        assert rel <= HISTORY_TOL[dtype]
        assert problem.relative_error(backend).max() < 1e-7
        got[spec] = s.residuals
        rank_order[spec] = backend.rank_order_for(solver.calls_per_iteration)
        del solver, backend
    det = [s for s in got if rank_order[s]]
    for name in det[1:]:
        assert torch.equal(got[det[0]], got[name]), f"{name} vs {det[0]}: rank-order paths differ"


def test_decode_cli_virtual_tp(capsys: pytest.CaptureFixture[str]) -> None:
    rc = decode.main(["--virtual-tp", "2", "--layers", "1", "--context", "128", "--steps", "8", "--warmup", "2",
                      "--check-steps", "2", "--check-unsharded", "--backends", "nccl,sollat", "--price", "3"])
    out = capsys.readouterr().out
    print(out)
    assert rc == 0 and "result: ok" in out
    release()


def test_cg_cli_virtual_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cg.main(["--virtual-ranks", "4", "--grid", "32", "--nrhs", "2", "--repeats", "1", "--check-single-rank",
                  "--backends", "nccl,sollat"])
    out = capsys.readouterr().out
    print(out)
    assert rc == 0 and "result: ok" in out
