"""Result records, the JSON / CSV writers, the run folder and the terminal tables (no GPU)."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from sollat.bench.results import (
    BENCH_CSV_COLUMNS,
    BarrierRow,
    Row,
    load_barrier,
    load_bench,
    make_run_dir,
    read_csv,
    row_label,
    write_barrier_csv,
    write_bench_csv,
    write_json,
)
from sollat.bench.stats import Stats
from sollat.bench.table import format_barrier, format_bench, format_sol

from . import _synthetic as synthetic


def test_stats() -> None:
    s = Stats.of([3.0, 1.0, 2.0, 10.0, 2.0])
    assert s.median == 2.0 and s.min == 1.0 and s.max == 10.0 and s.n == 5
    assert Stats.of([1.0, 2.0, 3.0, 4.0]).median == 2.5
    xs = [float(v) for v in np.random.default_rng(3).random(17)]
    got = Stats.of(xs)
    assert (got.median, got.p10, got.p90) == tuple(float(np.percentile(xs, q)) for q in (50, 10, 90))
    assert s.spread_pct == pytest.approx(100 * (s.p90 - s.p10) / 2.0)
    assert Stats.from_dict(s.to_dict()) == s
    with pytest.raises(ValueError):
        Stats.of([])


def test_labels() -> None:
    assert row_label("sollat", "oneshot_ll") == "sollat oneshot_ll"
    assert row_label("nccl", "default") == "nccl"
    assert row_label("nccl", "Ring/LL") == "nccl Ring/LL"
    assert row_label("torch-symm", "one_shot", 1) == "torch symm_mem one_shot (1 rank)"


def test_run_dir_is_timestamped_and_unique(tmp_path) -> None:
    now = dt.datetime(2026, 11, 29, 13, 5, 7)
    a = make_run_dir(tmp_path, card="NVIDIA H200", tag="bench", now=now)
    b = make_run_dir(tmp_path, card="NVIDIA H200", tag="bench", now=now)
    assert a.name == "20261129-130507-NVIDIA-H200-bench" and a.is_dir()
    assert b != a and b.is_dir()


def test_bench_json_round_trip(tmp_path) -> None:
    doc = synthetic.bench_results(dtypes=("float32", "bfloat16"))
    path = write_json(tmp_path / "bench.json", doc)
    back, rows = load_bench(path)
    assert back["meta"]["card"] == "synthetic" and back["sol"]["sol_ns"] == 541.5
    assert [r.to_dict() for r in rows] == [r.to_dict() for r in doc["rows"]]
    assert any(r.nbytes is None and r.status == "skipped" for r in rows)


def test_json_writes_nan_as_null(tmp_path) -> None:
    r = Row("sollat", "oneshot_ll", 2, "float32", 4, median_us=float("nan"))
    _, rows = load_bench(write_json(tmp_path / "b.json", {"meta": {}, "rows": [r]}))
    assert rows[0].median_us is None


def test_bench_csv(tmp_path) -> None:
    doc = synthetic.bench_results()
    path = write_bench_csv(tmp_path / "bench.csv", doc["rows"], meta=doc["meta"], floor_us=0.55, sol_us=0.54)
    lines = read_csv(path)
    assert list(lines[0].keys()) == list(BENCH_CSV_COLUMNS)
    assert len(lines) == len(doc["rows"])
    first = lines[0]
    assert first["impl"] == "sollat" and first["label"] == "sollat oneshot_ll" and first["floor_us"] == "0.55"
    assert first["commit"] == "abc1234" and float(first["median_us"]) > 0
    skipped = [ln for ln in lines if ln["status"] == "skipped"]
    assert skipped and skipped[0]["bytes"] == "" and "2 GPUs" in skipped[0]["reason"]


def test_bench_table() -> None:
    doc = synthetic.bench_results(sizes=(4, 1 << 20, 8 << 20))
    text = format_bench(doc["meta"], 0.55, 0.54, doc["rows"])
    assert text.count("# sollat bench:") == 2  # one block per rank count
    assert "R=2 virtual ranks on one GPU" in text and "R=4" in text
    for col in ("size", "count", "floor", "SoL", "oneshot_ll", "twoshot_sentinel", "auto", "auto picks", "best",
                "torch one_shot (1 rank)"):
        assert col in text
    assert "8 MiB" in text and "4 B" in text
    assert "nccl: not run - needs >= 2 GPUs" in text
    lines = [ln for ln in text.splitlines() if ln.strip().startswith("8 MiB")]
    assert " - " in lines[0] + " "  # one-shot refuses 8 MiB in the synthetic data
    assert "0.55" in text and "0.54" in text


def test_table_marks() -> None:
    rows = [
        Row("sollat", "oneshot_ll", 2, "float32", 4, median_us=2.0, p10_us=1.0, p90_us=3.0, spread_pct=100.0,
            check="ok"),
        Row("sollat", "oneshot_sentinel", 2, "float32", 4, median_us=2.5, spread_pct=1.0,
            check="mismatch (1 of 1 elements)"),
        Row("sollat", "twoshot_ll", 2, "float32", 4, status="error", reason="PeerTimeoutError: boom"),
    ]
    text = format_bench({"ranks": [2], "dtypes": ["float32"], "card": "x"}, None, None, rows)
    assert "2.00~" in text and "2.50!" in text and "err" in text
    assert "PeerTimeoutError: boom" in text and "mismatch (1 of 1" in text


def test_sol_text() -> None:
    sol = synthetic.bench_results()["sol"]
    from sollat.bench.sol import reference_check

    sol["reference"] = reference_check(sol)
    text = format_sol(sol)
    assert "fence.sc.gpu" in text and "SM-to-SM" in text
    assert "SoL = 2 x 135.0 + 271.5 = 541.5 ns" in text
    assert "within 2x" in text


def test_barrier_files_and_table(tmp_path) -> None:
    doc = synthetic.barrier_results()
    write_json(tmp_path / "barrier.json", doc)
    write_barrier_csv(tmp_path / "barrier.csv", doc["rows"], meta=doc["meta"])
    meta, rows = load_barrier(tmp_path / "barrier.json")
    assert [r.to_dict() for r in rows] == [r.to_dict() for r in doc["rows"]]
    assert len(read_csv(tmp_path / "barrier.csv")) == len(rows)
    text = format_barrier(doc["meta"], rows, 0.55)
    assert "a2a relaxed (in-kernel)" in text and "nccl lsa" in text and "16" in text
    assert isinstance(rows[0], BarrierRow)
