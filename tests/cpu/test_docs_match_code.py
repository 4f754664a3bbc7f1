"""The docs say what the code does now: no GPU test is called unrun, the guide to writing a
collective covers every cross-buffer fence the device API offers and every kernel that uses one,
and it describes the one signature-word scheme with the limit the host enforces."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sollat.collectives import custom

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "sollat" / "device" / "csrc"
GUIDE = ROOT / "docs" / "custom-collectives.md"
#: A claim that a GPU test has not run: stale once it has (they run on one H200, virtual ranks).
UNRUN = re.compile(r"\bnot (?:yet )?run yet\b|\bhas not run (?:on a GPU|yet)\b|\bnot yet run on\b|"
                   r"\bnot yet on a GPU\b", re.I)
HERE = {Path(__file__).name, "test_no_history.py"}  # these two spell the phrases as examples


def test_the_unrun_pattern_sees_the_phrases() -> None:
    for text in ("Not run yet (written without a GPU).", "which has not run on a GPU yet",
                 "Not yet run on real ranks", "checked on the CPU, not yet on a GPU"):
        assert UNRUN.search(text), text
    assert not UNRUN.search("a peer that cannot run appears as a row")
    assert not UNRUN.search("vLLM's loader once, in a process where it has not run, with env")


@pytest.mark.parametrize("doc", ["docs/design.md", "docs/custom-collectives.md"])
def test_docs_call_no_gpu_test_unrun(doc: str) -> None:
    text = (ROOT / doc).read_text()
    found = [f"{doc}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1) if UNRUN.search(line)]
    assert not found, "\n".join(found)


def test_test_docstrings_call_no_gpu_test_unrun() -> None:
    found = [f"{p.relative_to(ROOT)}:{n}" for p in sorted((ROOT / "tests").rglob("*.py")) if p.name not in HERE
             for n, line in enumerate(p.read_text().splitlines(), 1) if UNRUN.search(line)]
    assert not found, found


def test_the_guide_covers_every_cross_buffer_fence_and_its_users() -> None:
    guide = GUIDE.read_text()
    api = (CSRC / "include" / "sollat" / "ll_buffer.h").read_text()
    fences = set(re.findall(r"__device__ \w+ (releaseReceives\w*)\(", api))
    assert fences >= {"releaseReceives", "releaseReceivesWith"}, fences
    for name in fences:
        assert f"`A.{name}(" in guide or f"`{name}(" in guide, name
    users = {p.relative_to(CSRC).as_posix() for p in (CSRC / "kernels").glob("*.cu")
             if re.search(r"\.releaseReceives\w*\(", p.read_text())}
    assert users, "no kernel calls releaseReceives: the guide's examples are stale"
    for path in users:
        assert f"`{path}`" in guide, f"{path} uses a cross-buffer fence; the guide does not name it"
    assert "Across buffers" in guide and "credit" in guide


def test_the_guide_describes_one_signature_scheme_and_the_slot_limit() -> None:
    guide = GUIDE.read_text()
    section = guide.split("\n## Mismatch detection\n", 1)[1].split("\n## ", 1)[0]
    assert "every\n  thread's channel 0" in section or "every thread's channel 0" in section.replace("\n  ", " ")
    assert "Send line 0 to a peer in any pass in which you send that peer another line" in section
    assert f"at most {custom.SENTINEL_MAX_SLOTS} slots per thread" in section
    assert "SigPeers" not in guide and "Ring" not in section
