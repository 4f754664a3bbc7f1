"""The front door: README's two commands, the one command line and its verbs, argument errors."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sollat import cli
from sollat.collectives import instantiations

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


def test_bench_module_is_the_same_command_line() -> None:
    from sollat.bench import cli as bench_cli

    assert set(bench_cli.SUBCOMMANDS) <= set(cli.VERBS)
    done = subprocess.run([sys.executable, "-m", "sollat.bench", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and done.stdout == cli.usage(), done.stderr


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
    ["tune", "--ranks", "-1"], ["tune", "--ranks", "1"], ["tune", "--ranks", "73"], ["tune", "--sizes", "0"],
    ["tune", "--sizes", "x"],
    ["bench", "--replays", "0"], ["bench", "--calls", "-3"], ["bench", "--ranks", "0"], ["bench", "--ranks", "73"],
    ["bench", "--sizes", "3x"], ["bench", "--timeout", "-1"], ["bench", "--child-timeout", "nan"],
    ["bench", "--device", "-1"], ["bench", "--bogus"],
    ["bench", "--algos", "nosuch"],
    ["sol", "--repeats", "0"], ["barrier", "--ranks", "1,2"], ["barrier", "--iters", "0"], ["plot"],
    ["plot", "/nonexistent/folder"], ["precompile", "--bogus"],
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



@pytest.mark.parametrize("argv", [["bench", "--bogus"], ["sol", "--bogus"], ["barrier", "--bogus", "1"],
                                  ["plot", ".", "--bogus"], ["tune", "--bogus"], ["model", "--bogus"],
                                  ["precompile", "--bogus"], ["info", "--bogus"]], ids=" ".join)
def test_an_unknown_option_is_named_with_its_verb(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(argv, capsys)
    extra = " ".join(argv[1:]).replace(". ", "")
    assert rc == 2 and err == (f"python -m sollat {argv[0]}: error: unrecognized arguments: {extra} "
                               f"(see python -m sollat {argv[0]} --help)\n")


def test_the_no_gpu_message_suggests_commands_readme_documents() -> None:
    from sollat.bench.env import NO_GPU_MESSAGE

    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"python -m (sollat(?:\.\w+)*) (\w+)", NO_GPU_MESSAGE)
    assert {verb for _, verb in commands} == {"model", "plot"}, commands
    for module, verb in commands:
        assert module == "sollat" and verb in cli.VERBS
        assert re.search(rf"python -m sollat {verb}\b", readme), verb

# ---- info and precompile -------------------------------------------------------------------------
def test_info_without_a_gpu_names_no_arch(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rc, out, err = run(["info"], capsys)
    assert rc == 0 and err == ""
    assert "GPU: none visible, so no arch" in out and "sm_9" not in out.split("GPU:")[0]


def test_info_names_the_nvrtc_it_loads(capsys: pytest.CaptureFixture[str]) -> None:
    nvrtc = pytest.importorskip("cuda.bindings.nvrtc")
    from sollat.device import build

    if build.nvrtc_missing() is not None:
        pytest.skip("no NVRTC here (the nvrtc extra is not installed)")
    _, major, minor = nvrtc.nvrtcVersion()
    rc, out, err = run(["info"], capsys)
    line = next(ln for ln in out.splitlines() if ln.startswith("NVRTC: "))
    assert rc == 0 and line.startswith(f"NVRTC: {major}.{minor} (")
    assert "libnvrtc" in line  # where it was loaded from


def test_info_without_nvrtc_names_the_extra(capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """What a machine without the nvrtc extra sees; the import of libnvrtc is made to fail the way
    cuda.pathfinder fails (its DynamicLibNotFoundError is a RuntimeError)."""
    nvrtc = pytest.importorskip("cuda.bindings.nvrtc")

    class DynamicLibNotFoundError(RuntimeError):
        pass

    def missing() -> None:
        raise DynamicLibNotFoundError('Failure finding "libnvrtc.so.13": No such file')

    monkeypatch.setattr(nvrtc, "nvrtcVersion", missing)
    rc, out, err = run(["info"], capsys)
    assert rc == 0 and err == ""
    assert ("NVRTC: not found, so no kernel can be compiled; install sollat's nvrtc extra: "
            "pip install 'sollat[nvrtc]' (in a checkout: pip install -e '.[nvrtc]')") in out.splitlines()


def _without_nvrtc(monkeypatch: pytest.MonkeyPatch) -> str:
    from sollat.device import build

    why = ("sollat: NVRTC (libnvrtc), which compiles sollat's kernels, cannot be loaded (DynamicLibNotFoundError); "
           f"install sollat's nvrtc extra: {build.NVRTC_EXTRA}")
    monkeypatch.setattr(build, "nvrtc_missing", lambda: why)
    return why


def test_precompile_without_nvrtc_names_the_extra(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("cuda.core")
    _without_nvrtc(monkeypatch)
    rc, out, err = run(["precompile", "--arch", "sm_90"], capsys)
    assert rc == 1 and out == ""
    assert err == ("python -m sollat precompile: error: NVRTC (libnvrtc), which compiles sollat's kernels, cannot be "
                   "loaded (DynamicLibNotFoundError); install sollat's nvrtc extra: pip install 'sollat[nvrtc]' "
                   "(in a checkout: pip install -e '.[nvrtc]')\n")


@pytest.mark.parametrize("example", ["maxabs_allreduce.py", "allgather.py"])
def test_examples_without_nvrtc_end_in_one_line_naming_the_extra(example: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The example as a script (``__main__``), on an empty kernel cache, no GPU, NVRTC missing."""
    import runpy

    import torch

    pytest.importorskip("cuda.core")
    why = _without_nvrtc(monkeypatch)
    monkeypatch.setenv("SOLLAT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(sys, "argv", [example])
    with pytest.raises(SystemExit) as exc:
        runpy.run_path(str(ROOT / "examples" / example), run_name="__main__")
    assert exc.value.code == why  # SystemExit(str): that one line on stderr, exit status 1


def test_compile_without_nvrtc_raises_the_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("cuda.core")
    from sollat.device import build

    why = _without_nvrtc(monkeypatch)
    monkeypatch.setenv("SOLLAT_CACHE_DIR", str(tmp_path))
    with pytest.raises(build.NvrtcMissingError) as exc:
        build.compile_cubin(build.kernel_source("probe_sol.cu"), name="probe_sol", arch="sm_90")
    assert str(exc.value) == why and "\n" not in why


def test_precompile_shows_progress_and_says_how_many(capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The real list of instantiations, each compile replaced by a no-op (one job: in this process)."""
    pytest.importorskip("cuda.core")
    compiled: list[str] = []
    monkeypatch.setattr(instantiations, "_compile_one", lambda w: compiled.append(w[0]) or w[0])
    rc, out, err = run(["precompile", "-j", "1", "--arch", "sm_90"], capsys)
    n = len(compiled)
    assert rc == 0 and n == len(list(instantiations.all_instantiations())) > 100
    assert re.fullmatch(rf"sollat: {n} kernel modules for sm_90 in the cache \S+ after \d+\.\d s \(1 at a time; "
                        r"modules already cached are not compiled again\)\n", out), out
    lines = err.splitlines()  # not a terminal: a line every 10 % (or 20 s), the last at 100 %
    assert 10 <= len(lines) <= 12 and all(ln.startswith("[precompile sm_90] ") for ln in lines)
    assert lines[-1].startswith(f"[precompile sm_90] {n}/{n} (100%)")
    compiled.clear()
    rc, out, err = run(["precompile", "-j", "1", "--arch", "sm_90", "--no-progress"], capsys)
    assert rc == 0 and err == "" and len(compiled) == n


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
    from sollat.bench import commands as bench_commands
    from sollat.bench.results import read_csv, read_json, write_bench_csv, write_json

    monkeypatch.setattr("sollat.bench.env.git_commit", lambda override=None: "1234567+dirty")
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
    a = bench_cli.build_parser().parse_args(["sol", "--into", str(tmp_path)])
    session = bench_commands._Session(a, "sol", [])
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
    from sollat.bench import commands as bench_commands

    monkeypatch.setattr("sollat.bench.env.git_commit", lambda override=None: "89abcde")
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
    a = bench_cli.build_parser().parse_args(["barrier", "--into", str(tmp_path)])
    meta = bench_commands._Session(a, "barrier", [2]).meta
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


CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"


def test_readme_says_what_sollat_is_then_gives_setup_and_test_commands() -> None:
    text = (ROOT / "README.md").read_text()
    assert text.startswith("# sollat\n\n")
    first = text.split("\n\n")[1]  # the first paragraph, before any command
    assert first.startswith("sollat is a Python library of barrier-free GPU collectives for PyTorch")
    assert text.index(first) < text.index("```bash")
    setup, tests = readme_commands()[:2]
    assert setup == "bash scripts/setup.sh && python3 -m sollat bench --quick"
    # torch first (kept if there), before the extras are resolved; the CPU build where no GPU is seen
    script = (ROOT / "scripts" / "setup.sh").read_text()
    assert CPU_INDEX in script and "nvidia-smi" in script
    assert script.index("torch==2.13.0") < script.index("pip install -e '.[bench,nvrtc,test]'")
    assert tests == "python3 -m pytest -q tests"


@pytest.mark.parametrize(("torch_there", "gpu", "torch_install"), [
    (True, True, None), (True, False, None),
    (False, False, f"python3 -m pip install torch==2.13.0 {CPU_INDEX}"),
    (False, True, "python3 -m pip install torch==2.13.0"),
], ids=["torch-kept-gpu", "torch-kept-cpu", "no-torch-cpu", "no-torch-gpu"])
def test_readme_setup_command_installs_the_right_torch(torch_there: bool, gpu: bool, torch_install: str | None,
                                                       tmp_path: Path) -> None:
    """README's first command, run by bash with stand-ins for python3 and nvidia-smi that log what
    they were asked: which torch it installs where, and that the rest always follows."""
    bindir, log = tmp_path / "bin", tmp_path / "log"
    bindir.mkdir()
    (bindir / "python3").write_text(f'#!/bin/sh\necho "python3 $*" >> {log}\n'
                                    f'if [ "$1" = "-c" ]; then exit {0 if torch_there else 1}; fi\nexit 0\n')
    (bindir / "nvidia-smi").write_text(f"#!/bin/sh\nexit {0 if gpu else 9}\n")
    for f in bindir.iterdir():
        f.chmod(0o755)
    done = subprocess.run(["bash", "-c", readme_commands()[0]], cwd=ROOT, capture_output=True, text=True,
                          env={"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(tmp_path)}, timeout=60)
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    assert calls == ["python3 -c import torch", *([torch_install] if torch_install else []),
                     "python3 -m pip install -e .[bench,nvrtc,test]", "python3 -m sollat bench --quick"]


def test_readme_command_paragraphs_are_short_their_figures_in_performance() -> None:
    """The words around README's two commands say what they do; how long they took (figures,
    commits, machines) is in docs/performance.md, in the section README names."""
    head = (ROOT / "README.md").read_text().split("\n---\n")[0]
    words = re.sub(r"```.*?```", "", head, flags=re.S)
    assert len(words.split()) < 300
    for figure in (r"\b[0-9a-f]{7,40}\b", r"\brun \d+", r"\bruns \d+", r"\d+(\.\d+)? (s|min)\b", r"\d+ passed"):
        assert not re.search(figure, words), figure
    m = re.search(r'docs/performance\.md, "([^"]+)"', words)
    assert m, "README points at the section of docs/performance.md with the commands' times"
    bench = (ROOT / "docs" / "performance.md").read_text()
    section = bench.split(f"\n## {m.group(1)}\n", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"\d+ s\b", section) and "2 cores" in section and re.search(r"\b[0-9a-f]{7}\b", section)
    assert "python3 -m pytest -q tests" in section and "python3 -m sollat bench --quick" in section


def test_readme_names_the_pinned_nvrtc() -> None:
    tomllib = pytest.importorskip("tomllib")
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["nvrtc"]
    assert extra[0] in (ROOT / "README.md").read_text()


def test_readme_has_the_vllm_sglang_section_pointing_at_its_doc() -> None:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Use it in vLLM / SGLang\n", 1)[1].split("\n## ", 1)[0]
    assert "docs/integrations.md" in section


def test_ci_runs_readme_test_command_with_the_slow_tests() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    line = next(ln for ln in ci.splitlines() if "pytest" in ln and not ln.startswith("#"))
    assert line.endswith(readme_commands()[1]) and "PYTEST_ADDOPTS=\"-m ''\"" in line


def test_main_job_on_several_gpus_runs_one_process_per_gpu(monkeypatch, capsys) -> None:
    """On a machine with 2+ GPUs `sollat bench` measures them (torchrun, one process per GPU, the
    safety variables set) and says so in its first line; --one-gpu and a run already under
    torchrun measure in this process."""
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
