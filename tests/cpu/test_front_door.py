"""The front door: README's two commands, the one command line and its verbs, argument errors."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sollat import cli, instantiations

ROOT = Path(__file__).resolve().parents[2]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``python -m sollat ARGV`` in this process: (exit status, stdout, stderr)."""
    try:
        rc = cli.main(argv)
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 1
    got = capsys.readouterr()
    return rc, got.out, got.err


# ---- one command line, one list of verbs ---------------------------------------------------------
def test_help_lists_every_verb_in_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(["--help"], capsys)
    assert rc == 0 and "``" not in out
    for verb in cli.VERBS:
        assert re.search(rf"^  {verb} +\S", out, re.M), verb
    assert run([], capsys)[1] == out


@pytest.mark.parametrize("verb", list(cli.VERBS))
def test_every_verb_answers_help(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run([verb, "--help"], capsys)
    assert rc == 0 and err == ""
    assert out.startswith("usage: python -m sollat ")


def test_bench_module_is_the_same_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    from sollat.bench import cli as bench_cli

    assert set(bench_cli.SUBCOMMANDS) <= set(cli.VERBS)
    assert bench_cli.main(["--help"]) == 0
    assert capsys.readouterr().out == cli.usage()


def test_plot_is_a_verb_of_python_m_sollat(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from sollat.bench.results import write_json

    from . import _synthetic as synthetic

    write_json(tmp_path / "bench.json", synthetic.bench_results())
    done = subprocess.run([sys.executable, "-m", "sollat", "plot", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "latency.png").stat().st_size > 1000 and "latency.png" in done.stdout


# ---- every bad argument: one line on stderr, exit status 2 ---------------------------------------
BAD = [
    ["frobnicate"], ["info", "--bogus"], ["info", "extra"],
    ["precompile", "-j", "0"], ["precompile", "-j", "x"], ["precompile", "--arch", "banana"],
    ["precompile", "--arch", "sm_80"], ["precompile", "--arch", "sm_95"],
    ["model", "--soak", "-5"], ["model", "--runs", "5"], ["model", "--exhaustive"], ["model", "--demo", "--sweep"],
    ["tune", "--ranks", "-1"], ["tune", "--ranks", "1"], ["tune", "--ranks", "9"], ["tune", "--sizes", "0"],
    ["tune", "--sizes", "x"],
    ["bench", "--replays", "0"], ["bench", "--calls", "-3"], ["bench", "--ranks", "0"], ["bench", "--ranks", "16"],
    ["bench", "--sizes", "3x"], ["bench", "--timeout", "-1"], ["bench", "--child-timeout", "nan"],
    ["bench", "--device", "-1"], ["bench", "--bogus"],
    ["sol", "--repeats", "0"], ["barrier", "--ranks", "1,2"], ["barrier", "--iters", "0"], ["plot"],
]


@pytest.mark.parametrize("argv", BAD, ids=" ".join)
def test_bad_argument_is_one_line_and_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(argv, capsys)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("python -m sollat"), err
    assert "error" in err and "Traceback" not in err


def test_bad_argument_from_the_shell() -> None:
    done = subprocess.run([sys.executable, "-m", "sollat", "precompile", "--arch", "banana"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == ("python -m sollat precompile: error: argument --arch: an arch looks like sm_90, "
                                   "got 'banana' (see python -m sollat precompile --help)")


# ---- info and precompile -------------------------------------------------------------------------
def test_info_without_a_gpu_names_no_arch(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rc, out, err = run(["info"], capsys)
    assert rc == 0 and err == ""
    assert "GPU: none visible, so no arch" in out and "sm_9" not in out.split("GPU:")[0]


def test_precompile_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="looks like sm_90"):
        instantiations.precompile("banana")
    with pytest.raises(ValueError, match="jobs"):
        instantiations.precompile("sm_90", jobs=0)
    assert instantiations.check_arch("sm_90a") == "sm_90a"


def test_precompile_compile_failure_is_one_line(capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("cuda.core")
    log = ("sollat: NVRTC failed to compile allreduce_oneshot for sm_90:\n6: NVRTC_ERROR_COMPILATION, compilation log:"
           "\n\nptxas line 82; error   : Instruction 'griddepcontrol' requires .target sm_90\n")

    def fail(args: object) -> str:
        raise RuntimeError(log)

    monkeypatch.setattr(instantiations, "_compile_one", fail)
    rc, out, err = run(["precompile", "-j", "1", "--arch", "sm_90"], capsys)
    assert rc == 1 and out == ""
    assert err == ("python -m sollat precompile: error: NVRTC failed for sm_90: "
                   "ptxas line 82; error   : Instruction 'griddepcontrol' requires .target sm_90\n")


# ---- results name their commit, and say when the tree was dirty ----------------------------------
def test_titles_never_show_an_empty_commit() -> None:
    from sollat.bench.plots import title

    meta = {"card": "H200", "ranks": [2], "date": "2026-11-29T10:00:00"}
    assert title({**meta, "commit": ""}, "X").endswith("| commit unknown")
    assert title(meta, "X").endswith("| commit unknown")
    assert title({**meta, "commit": "358481b", "dirty": True}, "X").endswith("| commit 358481b+dirty")
    assert title({**meta, "commit": "a840a18+dirty"}, "X").endswith("| commit a840a18+dirty")  # older files
    assert title({**meta, "commit": "358481b", "dirty": False}, "X").endswith("| commit 358481b")


def test_a_dirty_checkout_is_recorded_and_said(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from sollat.bench import cli as bench_cli
    from sollat.bench.results import read_csv, read_json, write_bench_csv, write_json

    monkeypatch.setattr("sollat.bench.env.git_commit", lambda override=None: "1234567+dirty")
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
    a = bench_cli.build_parser().parse_args(["sol", "--into", str(tmp_path)])
    session = bench_cli._Session(a, "sol", [])
    assert session.meta["commit"] == "1234567" and session.meta["dirty"] is True
    assert "uncommitted changes" in capsys.readouterr().err
    write_json(tmp_path / "sol.json", {"meta": session.meta})
    assert read_json(tmp_path / "sol.json")["meta"]["dirty"] is True
    write_bench_csv(tmp_path / "bench.csv", [], meta=session.meta, floor_us=None, sol_us=None)
    assert read_csv(tmp_path / "bench.csv") == []
    assert (tmp_path / "bench.csv").read_text().strip().endswith(",commit,dirty")


def test_a_clean_checkout_is_recorded_clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from sollat.bench import cli as bench_cli

    monkeypatch.setattr("sollat.bench.env.git_commit", lambda override=None: "89abcde")
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
    a = bench_cli.build_parser().parse_args(["barrier", "--into", str(tmp_path)])
    meta = bench_cli._Session(a, "barrier", [2]).meta
    assert (meta["commit"], meta["dirty"]) == ("89abcde", False)


# ---- the GPU suite runs on a machine set up from README ----------------------------------------
def test_test_extra_provides_the_pytest_plugins_the_gpu_suite_uses() -> None:
    tomllib = pytest.importorskip("tomllib")
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    suite = (ROOT / "scripts" / "gpu_suite.sh").read_text()
    if "--timeout" in suite:
        assert "pytest-timeout" in extra


def test_gpu_suite_pytest_line_runs_with_what_is_installed(tmp_path: Path) -> None:
    """The suite's pytest invocation, as is, on a one-test file: with or without pytest-timeout."""
    line = next(ln.strip() for ln in (ROOT / "scripts" / "gpu_suite.sh").read_text().splitlines()
                if "-m pytest" in ln)
    (tmp_path / "test_one.py").write_text("def test_one():\n    assert True\n")
    env = {**os.environ, "SOLLAT_GPU_TESTS": str(tmp_path / "test_one.py"), "OUT": str(tmp_path)}
    done = subprocess.run(["bash", "-c", f"set -o pipefail; {line}"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in (tmp_path / "gpu-tests.txt").read_text()


# ---- README's two commands, and CI runs the second ----------------------------------------------
def readme_commands() -> list[str]:
    """The bash blocks before README's first section heading."""
    head = (ROOT / "README.md").read_text().split("\n## ")[0]
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", head, re.S)]


def test_readme_starts_with_setup_and_test_commands() -> None:
    text = (ROOT / "README.md").read_text()
    assert text.startswith("# sollat\n")
    setup, tests = readme_commands()[:2]
    assert "\n" not in setup and "\n" not in tests  # one copy-pasteable line each
    # torch is pinned (or kept) before the extras are resolved: no newest torch + CUDA wheels on a CPU machine
    assert setup.index("torch==2.13.0") < setup.index("pip install -e '.[bench,nvrtc,test]'")
    assert "import torch" in setup and setup.endswith("python3 -m sollat bench --quick")
    assert tests == "python3 -m pytest -q tests"
    intro = text.split("```bash")[1].split("```")[1]  # the words before the test command: how long it takes
    assert re.search(r"\d+ s\b", intro) and "2 cores" in intro


def test_ci_runs_readme_test_command_with_the_slow_tests() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    line = next(ln for ln in ci.splitlines() if "pytest" in ln and not ln.startswith("#"))
    assert line.endswith(readme_commands()[1]) and "PYTEST_ADDOPTS=\"-m ''\"" in line


def test_main_job_on_several_gpus_runs_one_process_per_gpu(monkeypatch, capsys) -> None:
    """Issue 16, item 9: on a machine with 2+ GPUs `sollat bench` measures them (torchrun, one
    process per GPU, the safety variables set) and says so in its first line; --one-gpu and a run
    already under torchrun keep the old behaviour."""
    import torch

    from sollat.bench import cli as bench_cli
    from sollat.bench import env as bench_env

    monkeypatch.setattr(bench_env, "gpu_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    calls: list[tuple[list[str], dict[str, str]]] = []
    monkeypatch.setattr(bench_cli, "_spawn", lambda cmd, env: calls.append((cmd, env)) or 0)
    ran_virtual: list[bool] = []
    monkeypatch.setattr(bench_cli, "cmd_bench", lambda a: ran_virtual.append(True) or 0)
    assert bench_cli.main(["bench", "--quick"]) == 0
    cmd, env = calls[0]
    assert cmd[1:] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "sollat",
                       "bench", "--quick"]
    assert env["NCCL_NVLS_ENABLE"] == "0" and env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert "one process per GPU" in capsys.readouterr().out.splitlines()[0]
    assert not ran_virtual
    assert bench_cli.main(["bench", "--quick", "--one-gpu"]) == 0 and ran_virtual == [True]
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    assert bench_cli.main(["bench", "--quick"]) == 0 and ran_virtual == [True, True] and len(calls) == 1


def test_an_explicit_commit_wins_over_git(monkeypatch) -> None:
    from sollat.bench import env as bench_env

    monkeypatch.setenv("SOLLAT_COMMIT", "abc1234")
    assert bench_env.git_commit() == "abc1234"
    assert bench_env.git_commit("def5678") == "def5678"
