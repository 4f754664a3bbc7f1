"""The package states what is true now: no comment, docstring, message or tuning note in sollat/
cites a session, a run number, an issue number or a commit, or tells the code's history; README,
the docs, the tests, the scripts and CI cite no session, run or issue either (they may name a
commit and a date: a figure needs them); and what a user reads (every verb's --help, the main
job's output without a GPU) carries no such words and no markup or internal names. History lives
in git and CHANGELOG.md."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pytest

from sollat import cli

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sollat"
SUFFIXES = (".py", ".cu", ".h", ".cuh", ".json")

#: What a reference to the project's history looks like. Each pattern is tuned against ordinary
#: English in the tree: "the kernels run 32..512 threads", "calls run in issue order", "a stand-in
#: used to time a step", "the communicator no longer exists" are not history.
HISTORY: dict[str, re.Pattern[str]] = {
    "session": re.compile(r"\bsessions?\s*#?\d+|\b(?:before|after|since|until|in|this|next|last|previous|"
                          r"first|second|third|earlier|later)\s+session\b", re.I),
    "run number": re.compile(r"\bruns?\s+\d{1,3}\b(?!\s*(?:\.\.|…|x\b|×|threads?|blocks?|ranks?|times|calls?|"
                             r"steps?|iterations?|processes|µs|us\b|ms\b|GPUs?|rows?|lines?|exhaustive|%))", re.I),
    "issue number": re.compile(r"\bissues?\s*#\s*\d+|\bissues?\s+\d+\b|\bthe (?:core )?issue'?s\b", re.I),
    # a working session's tag or a run's label: s17b, run31
    "tag": re.compile(r"\bs[12][0-9][a-h]\b|\bruns?\d{1,3}\b", re.I),
    # a short or full commit hash: 7-40 lower-case hex digits with a digit and a letter, not 0x...
    "commit": re.compile(r"(?<![0-9A-Za-z_])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![0-9A-Za-z_])"),
    "history": re.compile(r"\bthe first version\b|\b(?:earlier|older|previous) versions?\b|\bformerly\b|"
                          r"\bused to (?:be|have|run|take|call|say|read|write|do)\b|"
                          r"\bno longer (?:registered|shipped|used|needed|supported|does)\b|"
                          r"\b(?:was|were|has been|have been) (?:removed|replaced|renamed|rewritten|fixed)\b|"
                          r"\bnot (?:yet )?run yet\b|\bhas not run\b", re.I),
}
#: A date in code or comments is a when, not a what (tuning notes may date their measurement).
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b(?![-/\w])")


def history_references(text: str, *, dates: bool = True) -> list[tuple[int, str, str]]:
    """(line, kind, the matched text) of every reference to history in ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for kind, pattern in HISTORY.items():
            found += [(number, kind, m.group(0)) for m in pattern.finditer(line)]
        if dates:
            found += [(number, "date", m.group(0)) for m in DATE.finditer(line)]
    return found


#: Kinds the files outside the package must not carry; commits and dates they may (a figure needs them).
NOT_OUTSIDE = ("session", "run number", "issue number", "tag")


def scan(package: Path = PACKAGE) -> list[str]:
    """``path:line: kind: text`` for every reference in the package's source, headers and notes."""
    out = []
    for path in sorted(p for p in package.rglob("*") if p.suffix in SUFFIXES and "__pycache__" not in p.parts):
        text = path.read_text(encoding="utf-8")
        for number, kind, what in history_references(text, dates=path.suffix != ".json"):
            out.append(f"{path.relative_to(package.parent)}:{number}: {kind}: {what!r}")
    return out


# ---- the scanner can fail ------------------------------------------------------------------------
@pytest.mark.parametrize("text", [
    "# the model before session 10: untorn lines", "(session 6, docs/benchmarks.md run 18)",
    "measured in run 25", "docs/benchmarks.md, runs 15 and 17", "(issue 13)", "see issue #7",
    "the issue's yardstick", "at commit 358481b", "at 1be0c58 the kernel", "the first version timed out",
    "it used to be slower", "LL (no longer registered)", "Not run yet (written without a GPU).",
    "passed on an H200 on 2026-11-30", "the s17b device script", "docs/results/x-run31/", "see run31",
    "(session 14, issue 28)",
])
def test_the_scanner_sees_history(text: str) -> None:
    assert history_references(text), text


@pytest.mark.parametrize("text", [
    "The real kernels run 32..512 threads per block", "calls run in issue order; calls issued on a stream",
    "the first call runs 1 line per block", "fault_sweep() runs 16 exhaustive configurations",
    "a stand-in used to time a step", "sollat: communicator 3 no longer exists", "rec & 0xFFFFFFFF",
    "DecodeSession(model)", "run 2 ranks", "docs/results/2026-12-01-h200-x2-s8e/tune.txt",
    "scale = 1e-6; deadbeef", "the run's sessions of measurements",
])
def test_the_scanner_passes_ordinary_english(text: str) -> None:
    assert not history_references(text), history_references(text)


def test_scan_names_file_and_line(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "sub" / "a.cu").write_text("// fine\n// measured in run 19\n")
    (pkg / "b.json").write_text('{"note": "issue 7 re-tunes; measured 2026-11-29"}\n')
    (pkg / "c.txt").write_text("session 3\n")  # not a scanned kind of file
    assert scan(pkg) == ["pkg/b.json:1: issue number: 'issue 7'", "pkg/sub/a.cu:2: run number: 'run 19'"]


# ---- the package ---------------------------------------------------------------------------------
def test_the_package_cites_no_history() -> None:
    found = scan()
    assert not found, f"{len(found)} reference(s) to history in sollat/:\n" + "\n".join(found)


# ---- README, docs, tests, scripts and CI ---------------------------------------------------------
#: These spell history on purpose: as the patterns' examples.
EXAMPLES = {Path(__file__).resolve()}


def outside_files(root: Path = ROOT) -> list[Path]:
    """README, every text file under docs/, tests/ and scripts/, and .ci/run."""
    files = [root / "README.md", root / ".ci" / "run"]
    for folder in ("docs", "tests", "scripts"):
        files += [p for p in (root / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and p.suffix in (".md", ".py", ".sh", ".txt", ".cu", ".json", "")]
    return sorted(p for p in files if p.exists() and p.resolve() not in EXAMPLES)


def scan_outside(root: Path = ROOT) -> list[str]:
    out = []
    for path in outside_files(root):
        text = path.read_text(encoding="utf-8", errors="replace")
        out += [f"{path.relative_to(root)}:{number}: {kind}: {what!r}"
                for number, kind, what in history_references(text, dates=False) if kind in NOT_OUTSIDE]
    return out


def test_scan_outside_sees_every_place(tmp_path: Path) -> None:
    for rel in ("README.md", ".ci/run", "docs/a.md", "docs/results/x/command.txt", "tests/t.py", "scripts/s.sh"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("fine at 1be0c58 on 2026-12-06\nmeasured in s20c\n")
    found = scan_outside(tmp_path)
    assert len(found) == 6 and all(f.endswith(":2: tag: 's20c'") for f in found), found


def test_readme_docs_tests_scripts_and_ci_cite_no_session_run_or_issue() -> None:
    found = scan_outside()
    assert not found, f"{len(found)} reference(s) to sessions, runs or issues:\n" + "\n".join(found)


# ---- what a user reads ---------------------------------------------------------------------------
#: Markup and internal names that mean nothing on a terminal.
INTERNAL = re.compile(r"``|:(?:mod|func|class|data|meth|attr):`|\b(?:select|layout|abi|algorithms|handover)\.\w+|"
                      r"\bsollat\.(?:bench\.timing|collectives)\b|write_table|user_table_dir")


def internal_words(text: str) -> list[str]:
    return [w for _, _, w in history_references(text)] + [m.group(0) for m in INTERNAL.finditer(text)]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with contextlib.suppress(SystemExit):
        cli.main(argv)
    got = capsys.readouterr()
    return got.out + got.err


def test_internal_words_are_seen() -> None:
    assert internal_words("replaced atomically (``select.write_table``)") == ["``", "select.write_table",
                                                                              "``"]
    assert internal_words("strong (before session 10)") == ["before session"]
    assert internal_words("memory model: ptx (default) or strong (untorn 16-byte lines)") == []


@pytest.mark.parametrize("verb", [None, *cli.VERBS])
def test_help_carries_no_internal_words(verb: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    text = _run(["--help"] if verb is None else [verb, "--help"], capsys)
    assert text and not internal_words(text), internal_words(text)


@pytest.mark.parametrize("verb", [v for v in cli.VERBS if v != "plot"])
def test_every_option_has_help(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Every option of every verb says what it does: argparse leaves an option without help as its
    bare name on its own line (``--seed SEED``) with nothing after it."""
    text = _run([verb, "--help"], capsys)
    options = text.split("\noptions:\n", 1)[1]
    bare = [line.strip() for i, line in enumerate(options.splitlines())
            if re.fullmatch(r"  (?:-\w(?: [A-Z_]+)?, )?--[\w-]+(?: [A-Z_]+| \{[\w,]+\})?", line)
            and not re.match(r" {6,}\S", (options.splitlines() + [""])[i + 1])]
    assert not bare, f"{verb}: options without help: {bare}"


def test_the_main_job_without_a_gpu_prints_no_internal_words(capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from sollat.bench import env

    monkeypatch.setattr(env, "gpu_available", lambda: False)
    text = _run(["bench", "--quick"], capsys)
    assert "no CUDA GPU is present" in text and "counterexample" in text  # the message, then the demo
    assert not internal_words(text), internal_words(text)
