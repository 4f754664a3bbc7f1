"""Figures a reader can trust: every table of figures in docs/performance.md and README's current
numbers name their card, date and commit; docs/results holds only files the docs or the package
cite, and every result path they cite exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PERFORMANCE = ROOT / "docs" / "performance.md"
RESULTS = ROOT / "docs" / "results"
CARD = re.compile(r"\bH[12]00\b")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
COMMIT = re.compile(r"(?<![0-9A-Za-z_])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![0-9A-Za-z_])")
RESULT_PATH = re.compile(r"docs/results/[\w.+-]+(?:/[\w.+-]+)*")
FIGURE_ROW = re.compile(r"^\|.*\|\s*\d+\.\d+\s*\|", re.M)  # a table row with a decimal figure in a cell


def sections(text: str) -> dict[str, str]:
    """'## ' heading -> its text up to the next '## ' heading (its '### ' subsections included)."""
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def citing_texts() -> list[str]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted(p for p in (ROOT / "sollat").rglob("*") if p.suffix in (".py", ".json", ".cu", ".h"))]
    return [p.read_text(encoding="utf-8") for p in files]


def test_sections_split_on_level_two_headings() -> None:
    got = sections("intro\n## A\none\n### A.1\ntwo\n## B\nthree\n")
    assert got == {"A": "\none\n### A.1\ntwo\n", "B": "\nthree\n"}


def test_figure_row_sees_a_decimal_cell() -> None:
    assert FIGURE_ROW.search("| `oneshot_ll` | fp32 | 2 | 1.437 | 1.397 |")
    assert not FIGURE_ROW.search("| to | read |\n| the figures | [performance.md](performance.md) |")


@pytest.mark.parametrize("heading", [h for h, body in sections(PERFORMANCE.read_text()).items()
                                     if FIGURE_ROW.search(body)])
def test_every_section_with_figures_names_card_date_and_commit(heading: str) -> None:
    body = sections(PERFORMANCE.read_text())[heading]
    missing = [name for name, pattern in (("card", CARD), ("date", DATE), ("commit", COMMIT))
               if not pattern.search(body)]
    assert not missing, f"docs/performance.md, {heading!r}: no {', '.join(missing)}"


def test_readme_current_numbers_name_card_date_and_commit() -> None:
    body = sections((ROOT / "README.md").read_text())["Current numbers"]
    rows = [ln for ln in body.splitlines() if ln.startswith("|") and not set(ln) <= set("|-")][1:]
    assert rows, "README's current numbers have no rows"
    for row in rows:
        assert CARD.search(row) and DATE.search(row) and COMMIT.search(row), row
    assert "docs/performance.md" in body


def test_every_results_file_is_cited() -> None:
    cited = set()
    for text in citing_texts():
        cited |= set(RESULT_PATH.findall(text))
    uncited = [p.relative_to(ROOT).as_posix() for p in sorted(RESULTS.rglob("*")) if p.is_file()
               if not any(p.relative_to(ROOT).as_posix().startswith(c.rstrip("/")) for c in cited)]
    assert not uncited, f"docs/results holds files no doc or package file cites: {uncited}"


def test_every_cited_results_path_exists() -> None:
    missing = sorted({path for text in citing_texts() for path in RESULT_PATH.findall(text)
                      if not (ROOT / path.rstrip(".")).exists()})
    assert not missing, f"cited but not in the tree: {missing}"
