"""CPU tests of the CG app: the operator, the decomposition, convergence, residual histories, arguments."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sollat.apps import cg
from sollat.apps.backends import ReferenceBackend, make_backend
from sollat.apps.cg import HISTORY_TOL, Solver, compare_histories, parse_args
from sollat.apps.poisson import PoissonCG, exact_planes, split_planes, stencil

CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parents[2]


def test_split_planes() -> None:
    assert split_planes(8, 4) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert split_planes(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert split_planes(5, 1) == [(0, 5)]
    with pytest.raises(ValueError):
        split_planes(3, 4)


def test_stencil_is_the_7_point_laplacian() -> None:
    n = 3
    cols = []
    for i in range(n ** 3):
        e = torch.zeros(1, n + 2, n + 2, n + 2, dtype=torch.float64)
        z, y, x = i // (n * n), i // n % n, i % n
        e[0, z + 1, y + 1, x + 1] = 1.0
        cols.append(stencil(e, torch.empty(1, n, n, n, dtype=torch.float64)).flatten())
    a = torch.stack(cols, dim=1)
    assert torch.equal(a, a.T)
    assert torch.all(a.diagonal() == 6)
    # neighbours: -1 for each of the (at most 6) adjacent points, e.g. the centre has all six
    centre = 13
    assert (a[centre] == -1).sum() == 6 and (a[0] == -1).sum() == 3
    assert torch.linalg.eigvalsh(a).min() > 0


def test_exact_solution_is_the_same_for_every_decomposition() -> None:
    full = exact_planes(6, 2, 0, 6, seed=3, device=CPU, dtype=torch.float64)
    parts = [exact_planes(6, 2, z0, z1, seed=3, device=CPU, dtype=torch.float64)[:, 1:-1]
             for z0, z1 in split_planes(6, 4)]
    assert torch.equal(torch.cat(parts, dim=1), full[:, 1:-1])
    assert torch.all(full[:, 0] == 0) and torch.all(full[:, -1] == 0)


def solve(world: int, *, n: int = 14, nrhs: int = 2, dtype: torch.dtype = torch.float64,
          tol: float = 1e-10, chunk: int = 5) -> tuple[cg.Solve, PoissonCG, ReferenceBackend]:
    problem = PoissonCG(n, nrhs, world_size=world, ranks=range(world), device=CPU, dtype=dtype, capacity=600)
    backend = ReferenceBackend(world, name="cpu")
    result = Solver(problem, backend, chunk=chunk, use_graph=False).solve(tol, 500)
    return result, problem, backend


def test_cg_converges_to_the_exact_solution() -> None:
    result, problem, backend = solve(1)
    assert 0 < result.iterations < 100
    assert result.residuals is not None and result.residuals[result.iterations - 1].max() < 1e-10
    assert result.residuals[: result.iterations - 1].max(dim=1).values.min() >= 1e-10
    assert problem.relative_error(backend).max() < 1e-8
    # CG on an SPD matrix: residual drops over the run
    assert result.residuals[-1].max() < result.residuals[0].max() * 1e-9


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_sharded_residual_history_equals_single_rank(world: int, dtype: torch.dtype, tol: float) -> None:
    """Only the dot products' summation order differs between decompositions (tolerance HISTORY_TOL)."""
    one, _, _ = solve(1, dtype=dtype, tol=tol)
    many, problem, _ = solve(world, dtype=dtype, tol=tol)
    assert many.iterations == one.iterations > 0
    assert one.residuals is not None and many.residuals is not None
    rel, _ = compare_histories(one.residuals, many.residuals, one.iterations)
    assert rel <= HISTORY_TOL[dtype]
    assert len(problem.states) == world


def test_rank_order_backends_give_bitwise_equal_histories() -> None:
    a, _, _ = solve(4)
    problem = PoissonCG(14, 2, world_size=4, ranks=range(4), device=CPU, dtype=torch.float64, capacity=600)
    backend = make_backend("reference", world_size=4, device=CPU, distributed=False)
    solver = Solver(problem, backend, chunk=5, use_graph=False)
    b = solver.solve(1e-10, 500)
    assert a.residuals is not None and b.residuals is not None and torch.equal(a.residuals, b.residuals)
    assert [(c.op, c.nbytes) for c in solver.calls_per_iteration] == [("sum", 16), ("sum", 16)]


def test_argument_errors(capsys: pytest.CaptureFixture[str]) -> None:
    cases = [
        (["--grid", "1"], {}, "--grid must be >= 2"),
        (["--nrhs", "0"], {}, "--nrhs must be >= 1"),
        (["--chunk", "0"], {}, "--chunk must be >= 1"),
        (["--tol", "2"], {}, "--tol must be in (0, 1)"),
        (["--grid", "4", "--virtual-ranks", "8"], {}, "cannot split 4 planes"),
        (["--backends", "sollat"], {}, "needs a CUDA device"),
        (["--backends", "noop"], {}, "only used internally"),
        (["--backends", "sollat_fused"], {}, "CG has nothing to fuse"),
        (["--virtual-ranks", "2"], {"WORLD_SIZE": "2", "RANK": "0"}, "do not combine it with torchrun"),
        (["--backends", "cpu"], {"WORLD_SIZE": "2", "RANK": "0"}, "only with --virtual-ranks"),
        (["--check-single-rank"], {"WORLD_SIZE": "2", "RANK": "0"}, "use --virtual-ranks"),
        (["--dtype", "bf16"], {}, "invalid choice"),
    ]
    for argv, env, msg in cases:
        with pytest.raises(SystemExit) as exc:
            parse_args(argv if env else ["--device", "cpu", *argv], env)
        assert exc.value.code == 2
        assert msg in capsys.readouterr().err, argv


def test_parse_defaults() -> None:
    a = parse_args(["--device", "cpu"], {})
    assert (a.grid, a.nrhs, a.world_size, a.distributed, a.graph, a.tol) == (32, 1, 1, False, False, 1e-8)
    assert a.max_iters == 320 and [s.label for s in a.backends] == ["cpu"]
    a = parse_args(["--dtype", "fp32", "--halo", "allgather"], {"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "3"})
    assert (a.world_size, a.device, a.tol, a.halo, a.grid) == (4, "cuda:3", 1e-5, "allgather", 128)
    a = parse_args(["--device", "cpu", "--grid", "64"], {})
    assert (a.grid, a.max_iters) == (64, 640)


def test_main_on_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cg.json"
    rc = cg.main(["--device", "cpu", "--virtual-ranks", "4", "--grid", "12", "--nrhs", "3", "--repeats", "1",
                  "--backends", "cpu,reference", "--check-single-rank", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    report = json.loads(out.read_text())
    assert report["ok"] and report["message_bytes"] == 24
    assert report["checks"]["reference"]["bitwise_vs_first"] is True
    assert report["results"]["cpu"]["iterations"] == report["checks"]["cpu"]["base_iterations"]


def test_solve_reports_progress_after_every_chunk() -> None:
    problem = PoissonCG(14, 2, world_size=2, ranks=range(2), device=CPU, dtype=torch.float64, capacity=600)
    seen: list[tuple[int, float]] = []
    result = Solver(problem, ReferenceBackend(2, name="cpu"), chunk=5, use_graph=False).solve(
        1e-10, 500, lambda it, res: seen.append((it, res)))
    assert [it for it, _ in seen] == list(range(5, result.iterations_run + 1, 5))
    assert result.residuals is not None
    assert [res for _, res in seen] == [result.residuals[it - 1].max().item() for it, _ in seen]


def test_progress_prints_at_most_once_per_interval() -> None:
    now = [100.0]
    lines: list[str] = []
    progress = cg.Progress(lines.append, "cpu solve 1/3", every_s=10.0, clock=lambda: now[0])
    for t, it in [(5.0, 20), (10.0, 40), (15.0, 60), (21.0, 80)]:
        now[0] = 100.0 + t
        progress(it, 1e-3)
    assert lines == ["    cpu solve 1/3: 40 iterations, max |r|/|r0| 1.00e-03, 10 s",
                     "    cpu solve 1/3: 80 iterations, max |r|/|r0| 1.00e-03, 21 s"]


def test_default_run_finishes_quickly_on_this_cpu() -> None:
    """No arguments on a machine without a GPU: the CPU default grid solves in seconds, not minutes."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")} | {"CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-m", "sollat.apps.cg"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{cg.DEFAULT_GRID['cpu']}^3 unknowns" in proc.stdout and "result: ok" in proc.stdout
