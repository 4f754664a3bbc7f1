"""The figures, drawn from synthetic results: each PNG and SVG is produced and not empty."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from sollat.bench import cli, plots  # noqa: E402
from sollat.bench.results import write_json  # noqa: E402

from . import _synthetic as synthetic  # noqa: E402


def _nonempty(paths, names) -> None:
    got = {p.name for p in paths}
    assert set(names) <= got, got
    for p in paths:
        assert p.stat().st_size > 1000, p


def test_latency_and_speedup_virtual(tmp_path) -> None:
    doc = synthetic.bench_results(dtypes=("float32", "bfloat16"), ranks=(2, 4, 8))
    out = plots.plot_latency(doc["meta"], 0.55, 0.54, doc["rows"], tmp_path / "latency")
    _nonempty(out, ["latency.png", "latency.svg"])
    out = plots.plot_speedup(doc["meta"], doc["rows"], tmp_path / "speedup")
    _nonempty(out, ["speedup.png", "speedup.svg"])
    # no NCCL rows with virtual ranks: the baseline is the torch reference, and the title says so
    assert "no NCCL rows" in (tmp_path / "speedup.svg").read_text()


def test_speedup_over_nccl(tmp_path) -> None:
    doc = synthetic.bench_results(mode="distributed", ranks=(4,), with_nccl=True)
    out = plots.plot_speedup(doc["meta"], doc["rows"], tmp_path / "speedup")
    _nonempty(out, ["speedup.png"])
    svg = (tmp_path / "speedup.svg").read_text()
    assert "speed-up over nccl" in svg and "no NCCL rows" not in svg


def test_titles_name_card_ranks_date_commit() -> None:
    meta = synthetic.bench_results()["meta"]
    t = plots.title(meta, "X")
    assert "synthetic" in t and "R=2,4" in t and "2026-01-01" in t and "abc1234" in t
    assert plots.choose_baseline(["sollat auto", "nccl Ring/LL", "nccl"]) == "nccl"
    assert plots.choose_baseline(["sollat auto"]) is None


def test_barrier_plot(tmp_path) -> None:
    doc = synthetic.barrier_results()
    out = plots.plot_barrier(doc["meta"], doc["rows"], tmp_path / "barrier", 0.55)
    _nonempty(out, ["barrier.png", "barrier.svg"])


def test_replot_a_result_folder(tmp_path, capsys) -> None:
    write_json(tmp_path / "bench.json", synthetic.bench_results())
    write_json(tmp_path / "barrier.json", synthetic.barrier_results())
    assert cli.main(["plot", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    for name in ("latency.png", "latency.svg", "speedup.png", "speedup.svg", "barrier.png", "barrier.svg"):
        assert (tmp_path / name).stat().st_size > 1000
        assert name in printed
