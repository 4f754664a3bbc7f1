"""Argument parsing and the no-GPU behaviour of ``python -m sollat {bench,sol,barrier}``."""

from __future__ import annotations

import sys

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


def test_bench_without_gpu_says_so_runs_the_demo_and_exits_0(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """README's first command on a CPU machine ends here: it must succeed."""
    monkeypatch.setattr("sollat.bench.env.gpu_available", lambda: False)
    ran: list[list[str]] = []
    monkeypatch.setattr("sollat.model.cli.main", lambda argv: ran.append(argv) or 0)
    assert cli.main(["bench", "--quick"]) == 0 and ran == [["--demo"]]
    out = capsys.readouterr().out
    assert "no CUDA GPU is present" in out and "python -m sollat model --demo" in out


@pytest.mark.parametrize("cmd", ["sol", "barrier"])
def test_sol_and_barrier_without_gpu_fail_in_one_line(cmd: str, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sollat.bench.env.gpu_available", lambda: False)
    assert cli.main([cmd, "--quick"]) == 1
    got = capsys.readouterr()
    assert got.out == "" and len(got.err.strip().splitlines()) == 1
    assert got.err.startswith(f"python -m sollat {cmd}: error: nothing could be measured: no CUDA GPU is present")


def test_tune_without_gpu_fails_in_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    from sollat import tune

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert tune.main([]) == 1
    got = capsys.readouterr()
    assert got.out == "" and len(got.err.strip().splitlines()) == 1
    assert got.err.startswith("python -m sollat tune: error: nothing could be measured: no CUDA GPU is visible")


def test_tune_that_measured_nothing_writes_no_table(tmp_path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    from sollat import tune

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    served = {"oneshot_ll": 1024}  # this algorithm runs up to 1 KiB; nothing runs above

    def runner(ranks: int):  # noqa: ANN202
        def run(algo: str, nbytes: int, dtype: torch.dtype) -> float:
            return 2.0 if nbytes <= served.get(algo, 0) else float("inf")
        return run, ["oneshot_ll", "twoshot_ll"], "Fake GPU", 16

    monkeypatch.setattr(tune, "_virtual_runner", runner)
    assert tune.main(["--sizes", "512,1K,4K", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "nothing could be measured: no algorithm ran at 4096 B (bfloat16), so no table was written" in err
    assert list(tmp_path.iterdir()) == []
    assert tune.main(["--sizes", "512,1K", "--out", str(tmp_path)]) == 0  # every size served: a table
    assert len(list(tmp_path.glob("fake-gpu-*.json"))) == 1


def test_bench_checks_algorithm_names_without_a_gpu(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sollat.bench.env.gpu_available", lambda: False)
    assert cli.main(["bench", "--quick", "--algos", "oneshot_ll,nosuch"]) == 2
    got = capsys.readouterr()
    assert got.out == "" and len(got.err.strip().splitlines()) == 1
    assert "unknown algorithm 'nosuch' in --algos; known: oneshot_ll," in got.err and "auto" in got.err
    assert _plan("--algos", "auto,twoshot_bulk,auto_symm").algos == ["auto", "twoshot_bulk", "auto_symm"]


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:  # argparse's exit, as for every option's bad value
        cli.main(["bench", "--sizes", "3x"])
    assert e.value.code == 2
    assert "argument --sizes: unknown unit" in capsys.readouterr().err


def test_sollat_dispatch_reaches_bench_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    top = pytest.importorskip("sollat.cli")
    monkeypatch.setattr("sollat.bench.env.gpu_available", lambda: False)
    assert top.main(["bench", "--quick"]) == 0
    assert "no CUDA GPU" in capsys.readouterr().out


def test_plot_of_empty_folder_fails(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plot", str(tmp_path)]) == 1
    assert "no bench.json or barrier.json in" in capsys.readouterr().err


@pytest.mark.parametrize("what", ["missing", "file"])
def test_plot_of_a_folder_that_is_not_there_says_so(what: str, tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "nonexistent"
    if what == "file":
        path.write_text("x")
    with pytest.raises(SystemExit) as exc:
        cli.main(["plot", str(path)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1
    assert (f"there is no folder '{path}'" if what == "missing" else "is a file, not a result folder") in err


def test_plot_without_matplotlib_is_one_line_naming_the_bench_extra(tmp_path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from sollat.bench.results import write_json

    from . import _synthetic as synthetic

    write_json(tmp_path / "bench.json", synthetic.bench_results())
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    assert cli.main(["plot", str(tmp_path)]) == 1
    got = capsys.readouterr()
    assert got.out == "" and len(got.err.strip().splitlines()) == 1 and "Traceback" not in got.err
    assert got.err.startswith("python -m sollat plot: error: the figures need matplotlib, which is not installed")
    assert "pip install 'sollat[bench]'" in got.err
    assert not list(tmp_path.glob("*.png"))


def _fake_gpu_session(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from sollat.bench import timing

    monkeypatch.setattr("sollat.bench.env.gpu_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "Fake GPU")
    monkeypatch.setattr(timing, "floor_record", lambda *a, **k: {"median_us": 0.55, "pdl_median_us": 0.45})


def test_sol_that_measured_nothing_exits_1_naming_why(tmp_path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The real run_sol, its probe failing at every step (as when no kernel can be launched)."""
    from sollat.bench import sol

    class Probe:
        def __init__(self, *a: object) -> None:
            pass

        def __getattr__(self, name: str):  # noqa: ANN204
            def fail(*a: object, **k: object) -> None:
                raise RuntimeError(f"{name}: the kernel did not launch")
            return fail

    _fake_gpu_session(monkeypatch)
    monkeypatch.setattr(sol, "_Probe", Probe)
    assert cli.main(["sol", "--quick", "--no-progress", "--into", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("python -m sollat sol: error: nothing could be measured: no SoL figure; ")
    assert "fence.sc.gpu (= __threadfence): RuntimeError: fence: the kernel did not launch" in err
    assert "ping-pong: RuntimeError: pingpong_sm: the kernel did not launch" in err
    assert (tmp_path / "sol.json").exists()  # what was tried is still written down


def test_barrier_that_measured_nothing_exits_1_naming_why(tmp_path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from sollat.bench import barrier
    from sollat.bench.results import ERROR, SKIPPED, BarrierRow
    from sollat.bench.stats import Stats

    _fake_gpu_session(monkeypatch)
    rows = [BarrierRow("a2a relaxed", 2, "in-kernel", status=ERROR, reason="RuntimeError: no launch"),
            BarrierRow("nccl lsa", 2, "in-kernel", status=SKIPPED, reason="not measured")]
    monkeypatch.setattr(barrier, "barrier_virtual", lambda *a, **k: list(reversed(rows)))
    argv = ["barrier", "--quick", "--ranks", "2", "--no-progress", "--into", str(tmp_path)]
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # the figures are not the point here
    assert cli.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("python -m sollat barrier: error: nothing could be measured: every barrier row failed or "
                       "was skipped; first: a2a relaxed R=2: RuntimeError: no launch")
    assert any(e.startswith("sollat: no figures drawn: the figures need matplotlib") for e in err)
    ok = BarrierRow("a2a relaxed", 2, "in-kernel").set_stats(Stats.of([1.0]))
    monkeypatch.setattr(barrier, "barrier_virtual", lambda *a, **k: [ok, rows[1]])
    assert cli.main(argv) == 0


def _fake_bench(monkeypatch: pytest.MonkeyPatch, works: bool = True) -> None:
    """GPU work of ``bench --barrier`` replaced by fakes (``works=False``: every sollat call raises,
    every peer child fails), the real writers and plots kept."""
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
            if not works:
                raise RuntimeError("the kernel did not launch")

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
            return ChildOutcome(0, "", {"rows": rows}) if works else ChildOutcome(1, "child crashed", None)

    monkeypatch.setattr("sollat.bench.env.gpu_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(sol, "run_sol", lambda *a, **k: synthetic.bench_results()["sol"])
    monkeypatch.setattr(timing, "floor_record", lambda *a, **k: {"median_us": 0.55, "pdl_median_us": 0.45})
    monkeypatch.setattr(sweep, "VirtualTarget", Target)

    def time_calls(call, **k):  # noqa: ANN001, ANN202
        call(0)
        return timing.GraphTiming([2.0, 2.1, 2.2], k["calls"], 3)

    monkeypatch.setattr(sweep, "time_calls", time_calls)
    monkeypatch.setattr(peers, "SubprocessRunner", Runner)
    monkeypatch.setattr(barrier, "barrier_virtual", lambda *a, **k: synthetic.barrier_results()["rows"])


def test_bench_pipeline_with_fakes(tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The whole ``bench --barrier`` wiring on the CPU: GPU work replaced by fakes, real writers and plots."""
    pytest.importorskip("matplotlib")
    _fake_bench(monkeypatch)
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


def test_bench_that_measured_nothing_exits_1(tmp_path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    _fake_bench(monkeypatch, works=False)
    rc = cli.main(["bench", "--quick", "--ranks", "2", "--sizes", "4", "--no-progress", "--no-plots", "--peers",
                   "nccl", "--into", str(tmp_path)])
    got = capsys.readouterr()
    assert rc == 1 and (tmp_path / "bench.json").exists()
    assert got.err.strip().splitlines()[-1] == (
        "python -m sollat bench: error: nothing could be measured: no sollat algorithm and no peer gave a time "
        "(the rows' reasons are in the table above)")


def test_bench_without_matplotlib_writes_its_results_and_says_so(tmp_path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    _fake_bench(monkeypatch)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    rc = cli.main(["bench", "--quick", "--ranks", "2", "--sizes", "4", "--no-progress", "--into", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 0 and (tmp_path / "bench.json").exists() and not list(tmp_path.glob("*.png"))
    drawn = [e for e in err if e.startswith("sollat: no figures drawn: the figures need matplotlib")]
    assert len(drawn) == 2 and all("pip install 'sollat[bench]'" in e for e in drawn)  # latency, speedup
