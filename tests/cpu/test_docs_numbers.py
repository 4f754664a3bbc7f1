"""The numbers the docs state, where the code holds them: defaults, limits, option defaults,
counts of tests. Every page of docs/ is scanned for the phrases below; each number a phrase
captures must be the code's. A page need not state a fact; one that does states the code's.

(README.md and docs/benchmarks.md are checked by their own tests; docs/settings.md's table is
checked against sollat.device.environment by tests/cpu/test_settings.py.)"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from sollat.bench.sizes import DEFAULT_SIZES, QUICK_SIZES, parse_sizes
from sollat.collectives.rmsnorm import MAX_HIDDEN
from sollat.device import faults, layout
from sollat.device.environment import format_bytes
from sollat.integrations.settings import DEFAULT_MAX_BYTES

ROOT = Path(__file__).resolve().parents[2]
SKIP = {"benchmarks.md", "pypi-description.md"}
PAGES = sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in SKIP)


def _int(text: str) -> int:
    return int(text.replace(",", "").replace("\u202f", "").replace(" ", ""))


@dataclass(frozen=True)
class Fact:
    """A number the code holds, and the phrases that state it (group 1: the number as written)."""

    what: str
    value: str
    patterns: tuple[str, ...]
    read: Callable[[str], str] = str


FACTS = (
    Fact("the fault timeout's default (faults.DEFAULT_TIMEOUT_S)", f"{faults.DEFAULT_TIMEOUT_S:g}",
         (r"fault timeout \((\d+) s\)", r"\bWhy (\d+) s\b", r"SOLLAT_TIMEOUT_S`?\s*\((?:default )?(\d+) s\)")),
    Fact("the setup timeout's default (faults.DEFAULT_SETUP_TIMEOUT_S)", f"{faults.DEFAULT_SETUP_TIMEOUT_S:g}",
         (r"SOLLAT_SETUP_TIMEOUT_S`?\s*\((?:default )?(\d+) s\)", r"waits for every rank \((\d+) s\)")),
    Fact("the engine limit's default (settings.DEFAULT_MAX_BYTES)", format_bytes(DEFAULT_MAX_BYTES),
         (r"messages up to (\d+ [KMG]iB) \(SOLLAT_ENGINE_MAX_BYTES\)",
          r"SOLLAT_ENGINE_MAX_BYTES`? \((\d+ [KMG]iB) by default\)")),
    Fact("the most ranks (layout.MAX_RANKS)", str(layout.MAX_RANKS),
         (r"world sizes? 2\s*(?:\.\.|–|to)\s*(\d+)", r"\bat most (\d+) ranks\b", r"limits \((\d+) ranks"), read=str),
    Fact("the fused RMSNorm's largest hidden size (rmsnorm.MAX_HIDDEN)", str(MAX_HIDDEN),
         (r"hidden\s*(?:<=|≤|up to|at most)\s*([\d,]+)\b", r"hidden (?:sizes? )?1\s*(?:–|-|\.\.)\s*([\d,]+)\b"),
         read=lambda t: str(_int(t))),
    Fact("max_blocks' upper limit (layout.MAX_BLOCKS_LIMIT)", str(layout.MAX_BLOCKS_LIMIT),
         (r"`SOLLAT_MAX_BLOCKS` \| (?:an integer )?1\s*(?:\.\.|–)\s*(\d+)",
          r"max_blocks=?`?[^\n|.]{0,40}?\b1\s*(?:\.\.|–)\s*(\d+)")),
    Fact("the real-rank blocks budget (layout.REAL_RANK_BLOCKS_BUDGET)", str(layout.REAL_RANK_BLOCKS_BUDGET),
         (r"\b(\d+) / ranks\b", r"ranks × blocks = (\d+)")),
    Fact("virtual ranks' default blocks (layout.MAX_BLOCKS_VIRTUAL)", str(layout.MAX_BLOCKS_VIRTUAL),
         (r"\b(\d+) for virtual ranks\b",)),
    Fact("bench's default sizes (sizes.DEFAULT_SIZES)", DEFAULT_SIZES, (r"default `([\w:]+)` \(\d+ sizes",)),
    Fact("the number of bench's default sizes", str(len(parse_sizes(DEFAULT_SIZES))),
         (r"default `[\w:]+` \((\d+) sizes",)),
    Fact("bench's quick sizes (sizes.QUICK_SIZES)", QUICK_SIZES, (r"`--quick` `([\w:]+)` \(\d+ sizes",)),
    Fact("the number of bench's quick sizes", str(len(parse_sizes(QUICK_SIZES))),
         (r"`--quick` `[\w:]+` \((\d+) sizes",)),
)


def stated(pattern: str) -> list[tuple[str, int, str]]:
    """(page, line, number as written) of every match of ``pattern`` in the pages."""
    out = []
    for page in PAGES:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            out += [(page.name, n, m.group(1)) for m in re.finditer(pattern, line)]
    return out


def test_the_phrases_read_the_numbers() -> None:
    """The phrases capture what they should, so that a wrong number in the docs fails here."""
    samples = {r"fault timeout \((\d+) s\)": ("a call's fault timeout (45 s);", "45"),
               r"hidden (?:sizes? )?1\s*(?:–|-|\.\.)\s*([\d,]+)\b": ("hidden 1–65,536 elements", "65,536"),
               r"\b(\d+) / ranks\b": ("and 256 / ranks beyond", "256"),
               r"world sizes? 2\s*(?:\.\.|–|to)\s*(\d+)": ("world sizes 2..64, dtypes", "64")}
    for pattern, (text, want) in samples.items():
        m = re.search(pattern, text)
        assert m and m.group(1) == want, (pattern, text)


@pytest.mark.parametrize("fact", FACTS, ids=[f.what for f in FACTS])
def test_a_number_the_docs_state_is_the_codes(fact: Fact) -> None:
    wrong = [f"docs/{page}:{n}: {text!r}" for pattern in fact.patterns for page, n, text in stated(pattern)
             if fact.read(text) != fact.value]
    assert not wrong, f"{fact.what} is {fact.value} in the code; the docs say otherwise:\n" + "\n".join(wrong)


def test_the_phrases_find_statements_in_the_docs() -> None:
    """Not vacuous: the docs do state most of these facts today."""
    found = {f.what for f in FACTS for p in f.patterns if stated(p)}
    assert len(found) >= 6, found


def test_the_real_rank_default_states_its_floor() -> None:
    """``256 / ranks`` blocks per rank, but never fewer than the floor (layout.default_max_blocks_real)."""
    floor = layout.default_max_blocks_real(layout.MAX_RANKS)
    assert floor == min(layout.default_max_blocks_real(r) for r in range(2, layout.MAX_RANKS + 1))
    for page in PAGES:
        for paragraph in re.split(r"\n\s*\n", page.read_text()):
            flat = " ".join(paragraph.split())
            for m in re.finditer(r"\b\d+ / ranks\b", flat):
                sentence = flat[m.start():].split(". ")[0]
                assert re.search(rf"\bat least {floor}\b", sentence), (page.name, sentence)


# ---- option defaults -----------------------------------------------------------------------------
def _parsers() -> list[argparse.ArgumentParser]:
    from sollat import tune
    from sollat.apps import cg_args, decode_args
    from sollat.bench import cli as bench_cli
    from sollat.model import cli as model_cli

    return [decode_args.build_parser(), cg_args.build_parser(), tune._parser(), model_cli._parser(),
            *bench_cli._parsers()[1].values()]


def option_defaults() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for parser in _parsers():
        for action in parser._actions:
            for opt in action.option_strings:
                if opt.startswith("--") and action.default not in (None, argparse.SUPPRESS):
                    out.setdefault(opt, set()).add(str(action.default))
    return out


OPTION_DEFAULT = r"`(--[a-z][\w-]*)`[^`()\n]{0,40}\(default `?([\w.,:-]+)`?\)"


def test_an_option_default_the_docs_state_is_the_parsers() -> None:
    defaults = option_defaults()
    checked = 0
    for page in PAGES:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            for m in re.finditer(OPTION_DEFAULT, line):
                option, value = m.group(1), m.group(2)
                if option not in defaults:
                    continue  # an option of a script or a tool, not of sollat's parsers
                assert value in defaults[option], f"docs/{page.name}:{n}: {option} default {value}, code {defaults[option]}"
                checked += 1
    assert checked >= 1  # the docs state some today: the check is not vacuous


# ---- counts of tests -----------------------------------------------------------------------------
TEST_COUNT = r"\b(\d+) (?:CPU |GPU )?tests? (?:in|of) `(tests/[\w/]+\.py)`"


def test_a_count_of_tests_the_docs_state_is_what_pytest_collects() -> None:
    claims = []
    for page in PAGES:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            claims += [(page.name, n, int(m.group(1)), m.group(2)) for m in re.finditer(TEST_COUNT, line)]
    for page_name, n, count, path in claims:
        done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "", path,
                               "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True, timeout=300)
        collected = sum(1 for line in done.stdout.splitlines() if "::" in line)
        assert collected == count, f"docs/{page_name}:{n}: {count} tests in {path}, pytest collects {collected}"
    m = re.search(TEST_COUNT, "the path has 38 GPU tests in `tests/gpu/test_fp8.py`")
    assert m and m.groups() == ("38", "tests/gpu/test_fp8.py")
