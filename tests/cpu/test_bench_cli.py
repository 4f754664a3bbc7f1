"""Argument parsing and the no-GPU behaviour of ``python -m sollat {bench,sol,barrier}``."""

from __future__ import annotations

import pytest

from sollat.bench import cli
from sollat.bench.peers import PEER_NAMES
from sollat.bench.sizes import format_bytes, parse_bytes, parse_int_list, parse_sizes


def test_default_sizes_are_4b_to_64mib_in_x2_steps() -> None:
    sizes = parse_sizes("4:64M")
    assert sizes[0] == 4 and sizes[-1] == 64 << 20 and len(sizes) == 25
    assert all(b == 2 * a for a, b in zip(sizes, sizes[1:], strict=False))


def test_size_specs() -> None:
    assert parse_sizes("4:64M:8") == [4, 32, 256, 2048, 16 << 10, 128 << 10, 1 << 20, 8 << 20, 64 << 20]
    assert parse_sizes("1K,4,64MiB,4") == [4, 1024, 64 << 20]
    assert parse_sizes("128B:1K, 1M") == [128, 256, 512, 1024, 1 << 20]
    assert parse_bytes("2G") == 2 << 30
    for bad in ("", "x", "4:2", "4:64M:1", "3Q", "0"):
        with pytest.raises(ValueError):
            parse_sizes(bad)
    assert format_bytes(4) == "4 B" and format_bytes(2048) == "2 KiB" and format_bytes(64 << 20) == "64 MiB"
    assert format_bytes(1536) == "1536 B"
    assert parse_int_list("2,4,8") == [2, 4, 8] and parse_int_list("2:16") == [2, 4, 8, 16]


def _plan(*argv: str) -> cli.BenchPlan:
    return cli.plan_bench(cli.build_parser().parse_args(["bench", *argv]))


def test_bench_defaults_and_quick() -> None:
    full = _plan()
    assert len(full.sizes) == 25 and full.ranks == [2, 4, 8] and full.dtypes == ["float32", "bfloat16"]
    assert full.algos is None and [p.name for p in full.peers] == list(PEER_NAMES)
    assert full.replays == 30 and full.max_calls == 100
    quick = _plan("--quick")
    assert len(quick.sizes) == 9 and quick.replays < full.replays and quick.max_calls <= 50
    assert quick.sol_repeats < full.sol_repeats and quick.child_timeout < full.child_timeout


def test_bench_options() -> None:
    p = _plan("--sizes", "4,1K", "--ranks", "2", "--dtypes", "bf16", "--algos", "oneshot_ll,auto",
              "--peers", "nccl-ring,torch-symm", "--replays", "3", "--calls", "10", "--no-check")
    assert p.sizes == [4, 1024] and p.ranks == [2] and p.dtypes == ["bfloat16"]
    assert p.algos == ["oneshot_ll", "auto"] and p.replays == 3 and p.max_calls == 10 and not p.check
    assert [x.name for x in p.peers] == ["nccl-ring-ll", "nccl-ring-ll128", "nccl-ring-simple", "torch-symm"]
    assert _plan("--peers", "none").peers == []
    with pytest.raises(ValueError, match="unknown peer"):
        _plan("--peers", "mpi")
    with pytest.raises(ValueError, match="unknown dtype"):
        _plan("--dtypes", "int8")


def test_subcommands_parse() -> None:
    parser = cli.build_parser()
    a = parser.parse_args(["sol", "--repeats", "3", "--single-gpu", "--into", "x"])
    assert a.cmd == "sol" and a.repeats == 3 and a.single_gpu and a.into == "x"
    a = parser.parse_args(["barrier", "--ranks", "2,4", "--quick"])
    assert a.cmd == "barrier" and a.ranks == "2,4" and a.quick
    with pytest.raises(SystemExit):
        parser.parse_args(["frobnicate"])


@pytest.mark.parametrize("cmd", ["bench", "sol", "barrier"])
def test_without_gpu_says_so_and_exits_0(cmd: str, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sollat.bench.env.gpu_available", lambda: False)
    assert cli.main([cmd, "--quick"]) == 0
    out = capsys.readouterr().out
    assert "no CUDA GPU is present" in out and "python -m sollat model --demo" in out


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "--sizes", "3x"]) == 2
    assert "unknown unit" in capsys.readouterr().err


def test_sollat_dispatch_reaches_bench_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    top = pytest.importorskip("sollat.cli")
    monkeypatch.setattr("sollat.bench.env.gpu_available", lambda: False)
    assert top.main(["bench", "--quick"]) == 0
    assert "no CUDA GPU" in capsys.readouterr().out


def test_plot_of_empty_folder_fails(tmp_path) -> None:
    assert cli.main(["plot", str(tmp_path)]) == 1


def test_bench_pipeline_with_fakes(tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The whole ``bench --barrier`` wiring on the CPU: GPU work replaced by fakes, real writers and plots."""
    pytest.importorskip("matplotlib")
    import torch

    from sollat.bench import barrier, peers, sol, sweep, timing
    from sollat.bench.peers import ChildOutcome
    from sollat.bench.results import Row

    from . import _synthetic as synthetic

    class Target:
        def __init__(self, ranks: int, device: object) -> None:
            self.ranks = ranks

        algorithms = ("oneshot_ll", "twoshot_ll")

        def selected(self, nbytes: int, dtype: str) -> str:
            return "oneshot_ll"

        def buffers(self, nbytes: int, dtype: str, n_sets: int) -> object:
            return None

        def call(self, bufs: object, i: int, algo: str) -> None:
            pass

        def check(self, bufs: object, dtype: str, algo: str = "") -> str:
            return "ok"

        def finish(self) -> None:
            pass

        def recover(self) -> None:
            pass

        def sync(self) -> None:
            return None

    class Runner:
        def __call__(self, job, env, timeout_s):  # noqa: ANN001, ANN204
            assert env["NCCL_NVLS_ENABLE"] == "0" and env["WORLD_SIZE"] == "1"
            rows = [Row(job.impl, a, 1, dt, n, median_us=3.5).to_dict()
                    for a in job.algos for dt in job.dtypes for n in job.sizes]
            return ChildOutcome(0, "", {"rows": rows})

    monkeypatch.setattr("sollat.bench.env.gpu_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(sol, "run_sol", lambda *a, **k: synthetic.bench_results()["sol"])
    monkeypatch.setattr(timing, "floor_record", lambda *a, **k: {"median_us": 0.55, "pdl_median_us": 0.45})
    monkeypatch.setattr(sweep, "VirtualTarget", Target)
    monkeypatch.setattr(sweep, "time_calls", lambda call, **k: timing.GraphTiming([2.0, 2.1, 2.2], k["calls"], 3))
    monkeypatch.setattr(peers, "SubprocessRunner", Runner)
    monkeypatch.setattr(barrier, "barrier_virtual", lambda *a, **k: synthetic.barrier_results()["rows"])

    rc = cli.main(["bench", "--quick", "--barrier", "--ranks", "2,4", "--sizes", "4,1M", "--no-progress",
                   "--into", str(tmp_path), "--commit", "feedbee"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "SoL = 2 x 135.0" in out and "# sollat bench:" in out and "a2a relaxed" in out
    assert "nccl: not run - needs >= 2 GPUs" in out and "torch one_shot (1 rank)" in out
    for name in ("bench.json", "bench.csv", "bench.txt", "sol.json", "barrier.json", "barrier.csv",
                 "latency.png", "latency.svg", "speedup.png", "speedup.svg", "barrier.png", "barrier.svg"):
        assert (tmp_path / name).stat().st_size > 0, name
    from sollat.bench.results import load_bench

    doc, rows = load_bench(tmp_path / "bench.json")
    assert doc["meta"]["commit"] == "feedbee" and doc["meta"]["ranks"] == [2, 4] and doc["meta"]["quick"]
    assert doc["meta"]["safety_env"]["NCCL_NVLS_ENABLE"] == "0"
    ok = [r for r in rows if r.impl == "sollat" and r.ok]
    assert len(ok) == 2 * 2 * 2 * 3  # ranks x dtypes x sizes x (2 algorithms + auto)
    assert all(r.median_us == pytest.approx(2.1) and r.check == "ok" for r in ok)
    assert {r.impl for r in rows} == {"sollat", "nccl", "nccl-window", "torch-symm"}
