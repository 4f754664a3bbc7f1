"""The real-rank suite's parts that need no GPU: the matrix of its mismatch tests (every op,
algorithm and argument kind meets every set of differing ranks: the first, a middle one, the last,
half of them) and its verdict from per-rank result files (tests/gpu/_procs.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from sollat.collectives import select
from tests.gpu import _procs
from tests.gpu import mp_suite as suite

REAL_ALGOS = ("oneshot_ll", "oneshot_sentinel", "twoshot_ll", "twoshot_sentinel", "ll128", "twoshot_bulk")


@pytest.mark.parametrize("world", [3, 4])
def test_differing_sets_are_the_first_a_middle_one_the_last_and_half(world: int) -> None:
    sets = dict(suite.differing_sets(world))
    assert sets["first"] == (0,) and sets["last"] == (world - 1,)
    assert 0 < sets["middle"][0] < world - 1
    assert sets["half"] == (1, 2)  # of 3 and of 4: neither the first nor (at 4) the last
    assert len(set(sets.values())) == 4


def test_every_all_reduce_algorithm_and_kind_meets_every_differing_set() -> None:
    cases = suite.all_reduce_matrix(REAL_ALGOS)
    for phase in ("first-use", "cached"):
        mine = [c for c in cases if c[0] == phase]
        paths = {c[1] for c in mine}
        assert paths == set(REAL_ALGOS) | ({select.NCCL} if phase == "cached" else set())
        for path in paths:
            assert {c[3] % 4 for c in mine if c[1] == path} == {0, 1, 2, 3}, (phase, path)
        for kind in {c[2] for c in mine}:
            assert {c[3] % 4 for c in mine if c[2] == kind} == {0, 1, 2, 3}, (phase, kind)
    assert {c[2] for c in cases if c[0] == "cached"} == {"size_same_lines", "dtype_same_bytes", "op", "algorithm"}
    assert {c[2] for c in cases if c[0] == "first-use"} == set(suite.MISMATCH_KINDS)


def test_same_kernel_specs_differ_in_one_argument_with_the_same_bytes() -> None:
    for algo in (*REAL_ALGOS, select.NCCL):
        for kind in ("size_same_lines", "dtype_same_bytes", "op"):
            specs = suite.mismatch_specs(REAL_ALGOS, algo, kind, 31002)
            if specs is None:
                assert algo == "ll128" and kind == "op"
                continue
            (a0, d0, o0, n0), (a1, d1, o1, n1) = specs
            assert a0 == a1, "the same kernel: only CallMismatchError may pass"
            nbytes = (n0 * torch.empty((), dtype=d0).element_size(), n1 * torch.empty((), dtype=d1).element_size())
            assert (d0, o0, n0) != (d1, o1, n1)
            if kind != "size_same_lines":
                assert nbytes[0] == nbytes[1], (algo, kind)
        algorithm = suite.mismatch_specs(REAL_ALGOS, algo, "algorithm", 31002)
        assert algorithm is not None and algorithm[0][0] != algorithm[1][0]


class _FakeComm:
    """What rmsnorm_mismatch_cases asks a communicator: auto's picks (unfused from 3 rows, the
    AllReduce a library above 2 MiB, as the built-in rules and the generic table)."""

    def selected_rmsnorm_algorithm(self, nbytes: int, dtype: torch.dtype, rows: int) -> str:
        return "unfused" if rows >= 3 else "oneshot_ll"

    def selected_algorithm(self, nbytes: int, dtype: torch.dtype, op: str, *, deterministic: bool) -> str:
        return select.NCCL if nbytes > 2 << 20 else "oneshot_ll"


def test_rmsnorm_cases_cover_every_algorithm_argument_and_differing_set() -> None:
    comm = _FakeComm()
    cases = suite.rmsnorm_mismatch_cases(comm)
    kinds = ("eps", "hidden at the same element count", "rows", "fp8 copy", "fp8 scale", "dtype over the same bytes",
             "algorithm")
    by_base: dict[str, list[Any]] = {}
    for what, base, alt, pattern in cases:
        by_base.setdefault(f"{base.algo} {base.rows}x{base.hidden}", []).append((what, base, alt, pattern))
    algos = {base.algo for _, base, _, _ in cases}
    assert algos == {"oneshot_ll", "oneshot_sentinel", "unfused", "auto"}
    assert {b.resolved(comm) for _, b, _, _ in cases if b.algo == "auto"} == {"unfused", "oneshot_ll"}
    for name, group in by_base.items():
        if "unfused 1024x4096" in name:  # on the library path: eps, hidden, the FP8 copy
            assert all(b.kernel(comm) == "unfused:nccl" for _, b, _, _ in group)
            continue
        assert [next(k for k in kinds if w.endswith(k)) for w, _, _, _ in group] == list(kinds), name
        assert {p % 4 for *_, p in group} == {0, 1, 2, 3}, name
    for kind in kinds:
        assert {p % 4 for w, _, _, p in cases if w.endswith(kind) and "1024x4096" not in w} == {0, 1, 2, 3}, kind
    for what, base, alt, _ in cases:
        if what.endswith("hidden at the same element count"):
            assert base.rows * base.hidden == alt.rows * alt.hidden and base.hidden != alt.hidden
        if what.endswith("algorithm"):
            assert base.kernel(comm) != alt.kernel(comm)
        if what.endswith(("eps", "fp8 copy", "fp8 scale")):
            assert base.kernel(comm) == alt.kernel(comm), f"{what}: the same kernel (only CallMismatchError passes)"


# ---- the verdict from result files -------------------------------------------------------------
def _write(folder: Path, rank: int, plan: list[str], failed: dict[str, list[str]] | None = None,
           finish: bool = True, errors: tuple[str, ...] = ()) -> None:
    res = _procs.RankResult(rank, str(folder))
    res.plan(plan, ["tear: needs a GPU per rank"])
    for name in plan:
        res.section(name, (failed or {}).get(name, []), 1.0)
    for e in errors:
        res.error(e)
    if finish:
        res.finish(sum(1 for n in plan if not (failed or {}).get(n)), sum(1 for n in plan if (failed or {}).get(n)))


def test_every_rank_passing_is_a_pass(tmp_path: Path) -> None:
    for r in range(3):
        _write(tmp_path, r, ["values", "mismatch"])
    assert _procs.assert_every_rank_passed(0, "", 3, results=tmp_path) == ["values", "mismatch"]
    assert _procs.read_results(tmp_path, 3)[0]["skipped"] == ["tear: needs a GPU per rank"]


@pytest.mark.parametrize("broken", ["no file", "a failed section", "no summary", "another plan", "an error",
                                    "exit status"])
def test_any_rank_that_did_not_pass_fails_the_launch(tmp_path: Path, broken: str) -> None:
    plan = ["values", "mismatch"]
    for r in range(3):
        if r != 1:
            _write(tmp_path, r, plan)
    if broken == "a failed section":
        _write(tmp_path, 1, plan, failed={"mismatch": ["rmsnorm unfused eps: output 0 kept 8 finite elements"]})
    elif broken == "no summary":
        _write(tmp_path, 1, plan, finish=False)
    elif broken == "another plan":
        _write(tmp_path, 1, ["values"])
    elif broken == "an error":
        _write(tmp_path, 1, plan, errors=("mismatch: hung past its hard limit of 360 s",))
    elif broken != "no file":
        _write(tmp_path, 1, plan)
    with pytest.raises(AssertionError) as info:
        _procs.assert_every_rank_passed(1 if broken == "exit status" else 0, "RANK 1 FAIL x", 3, results=tmp_path)
    text = str(info.value)
    assert ("torchrun exit status 1" in text) if broken == "exit status" else ("rank 1:" in text)
    if broken == "a failed section":
        assert "section mismatch failed: rmsnorm unfused eps" in text


def test_a_rank_without_a_folder_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_procs.RESULTS_ENV, raising=False)
    res = _procs.RankResult(0)
    res.plan(["values"], [])
    res.finish(1, 0)
    assert res.folder is None and not list(tmp_path.iterdir())
