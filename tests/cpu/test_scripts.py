"""scripts/ holds maintained tools only: each one says what it is (``--help`` with a description),
parses a sample command line, refuses an unknown option, and is named in the docs. The tools run
on a GPU; here only their command lines are checked, in this process, by stopping each script at
its argument parser."""

from __future__ import annotations

import argparse
import runpy
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"

#: Every Python tool and a command line it accepts.
SAMPLES: dict[str, list[str]] = {
    "ab_latency.py": ["--virtual", "2", "--algos", "oneshot_ll", "--sizes", "128", "--dtype", "float32"],
    "ab_trees.py": ["--tree", f"new={ROOT}", "--ranks", "2", "--reps", "1"],
    "card_report.py": ["--check", "results"],
    "dist_backend_bench.py": ["--sizes", "1024", "--into", "results"],
    "eager_overhead.py": ["--ranks", "2", "4"],
    "eager_real.py": ["--sizes", "128,8192", "--into", "results"],
    "engine_adapter_real.py": ["--batch-invariant", "--into", "results"],
    "engine_default_bench.py": ["--ranks", "2", "--calls", "5"],
    "gather_scatter_bench.py": ["--ranks", "2", "--replays", "3"],
    "rank_sweep.py": ["--ranks", "2,9", "--sizes", "128", "--algos", "oneshot_ll"],
    "rmsnorm_bench.py": ["--quick", "--ranks", "2"],
}
#: Every shell tool and an argument it refuses before it does anything.
SHELL: dict[str, str | None] = {"gpu_suite.sh": "bogus", "multi_gpu_campaign.sh": "tests,bogus",
                                "real_rank_suite.sh": None, "setup.sh": "x"}
#: Modules the tools import, not tools themselves.
HELPERS = {"_host_timing.py", "_real_ranks.py", "_virtual_timing.py"}
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


class _Parsed(Exception):
    """Raised after a script's parser has parsed its command line, before the script runs on."""

    def __init__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace) -> None:
        super().__init__()
        self.parser, self.namespace = parser, namespace


def _parse(script: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> _Parsed:
    """Run ``scripts/<script>`` as __main__ with ``argv`` up to its first parse_args."""
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self: argparse.ArgumentParser, args: object = None, namespace: object = None) -> object:
        raise _Parsed(self, original(self, args, namespace))

    monkeypatch.setattr(sys, "argv", [str(SCRIPTS / script), *argv])
    monkeypatch.syspath_prepend(str(SCRIPTS))
    with mock.patch.object(argparse.ArgumentParser, "parse_args", parse_then_stop), \
            pytest.raises(_Parsed) as parsed:
        runpy.run_path(str(SCRIPTS / script), run_name="__main__")
    return parsed.value


def test_every_script_is_listed_here() -> None:
    present = {p.name for p in SCRIPTS.iterdir() if p.is_file()}
    assert present == set(SAMPLES) | set(SHELL) | HELPERS, present ^ (set(SAMPLES) | set(SHELL) | HELPERS)


@pytest.mark.parametrize("script", sorted(SAMPLES))
def test_script_parses_a_sample_command_line(script: str, monkeypatch: pytest.MonkeyPatch) -> None:
    parsed = _parse(script, SAMPLES[script], monkeypatch)
    assert parsed.parser.description and len(parsed.parser.description.split()) >= 5, parsed.parser.description
    given = {a.lstrip("-").replace("-", "_") for a in SAMPLES[script] if a.startswith("--")}
    assert given <= set(vars(parsed.namespace)), given - set(vars(parsed.namespace))


@pytest.mark.parametrize("script", sorted(SAMPLES))
def test_script_help_says_what_it_does(script: str, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        _parse(script, ["--help"], monkeypatch)
    out = capsys.readouterr().out
    assert done.value.code == 0 and out.startswith("usage: "), out
    assert len(out.split("\n\n")[1].split()) >= 5, out  # the description, after the usage line


@pytest.mark.parametrize("script", sorted(SAMPLES))
def test_script_refuses_an_unknown_option(script: str, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        _parse(script, [*SAMPLES[script], "--no-such-option"], monkeypatch)
    assert done.value.code == 2 and "--no-such-option" in capsys.readouterr().err


@pytest.mark.parametrize("script", sorted(SHELL))
def test_shell_script_help_and_refusal(script: str) -> None:
    done = subprocess.run(["bash", str(SCRIPTS / script), "--help"], capture_output=True, text=True, timeout=30,
                          cwd=ROOT)
    assert done.returncode == 0 and "Usage" in done.stdout and "set -u" not in done.stdout, done
    bad = SHELL[script]
    if bad is not None:
        done = subprocess.run(["bash", str(SCRIPTS / script), bad], capture_output=True, text=True, timeout=30,
                              cwd=ROOT)
        assert done.returncode == 2 and "see --help" in done.stderr and not done.stdout, done


@pytest.mark.parametrize("script", sorted(set(SAMPLES) | set(SHELL)))
def test_script_is_named_in_the_docs(script: str) -> None:
    assert any(f"scripts/{script}" in doc.read_text() for doc in DOCS), f"no doc names scripts/{script}"


@pytest.mark.parametrize("helper", sorted(HELPERS))
def test_helpers_are_modules_not_tools(helper: str) -> None:
    text = (SCRIPTS / helper).read_text()
    assert "__main__" not in text and "argparse" not in text


def test_the_parse_stop_can_fail(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A script that never parses its command line is seen: _parse expects the stop."""
    (tmp_path / "x.py").write_text("print('ran without a parser')\n")
    monkeypatch.setattr(sys.modules[__name__], "SCRIPTS", tmp_path)
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        _parse("x.py", [], monkeypatch)
