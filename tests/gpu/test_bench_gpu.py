"""A small GPU smoke of the measurement suite: SoL probe, barrier, floor and a tiny sweep.

Bounds are loose on purpose (this checks that the numbers are measurements, not that the card
is fast); the reference H200 figures are fence 135 ns and SM-to-SM ping-pong 543 ns.
"""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_sol_probe_components() -> None:
    from sollat.bench.sol import run_sol

    res = run_sol(0, repeats=3, fence_iters=1024, chase_iters=1024, ping_iters=500, single_gpu=True)
    for key in ("fence", "fence_acq_rel", "fence_sys", "chase", "pingpong"):
        assert res[key]["status"] == "ok", res[key]
    assert 20 < res["fence"]["median_ns"] < 5000
    assert 20 < res["chase"]["median_ns"] < 5000
    assert 50 < res["pingpong"]["median_ns"] < 20000
    assert res["sol_ns"] == pytest.approx(2 * res["l2_rtt_ns"] + res["pingpong"]["median_ns"] / 2)
    assert "two SMs of one GPU" in res["remote_kind"]


def test_floor_and_barrier() -> None:
    from sollat.bench.barrier import barrier_virtual
    from sollat.bench.timing import measure_floor

    floor = measure_floor(torch.device("cuda", 0), calls=20, replays=5)
    assert 0.05 < floor.stats.median < 50
    rows = barrier_virtual(0, [2, 4], iters=100, warm=5, repeats=2, graph_calls=10, graph_replays=3,
                           floor_us=floor.stats.median)
    ok = [r for r in rows if r.ok]
    assert {(r.variant, r.ranks, r.where) for r in ok} >= {("a2a relaxed", 2, "in-kernel"), ("a2a acq_rel", 4, "graph")}
    assert all(0 < (r.median_us or 0) < 100 for r in ok if r.where == "in-kernel")
    assert any(r.variant == "nccl lsa" and r.status == "skipped" for r in rows)


def test_tiny_bench_writes_every_file(tmp_path) -> None:
    from sollat.bench.cli import main

    rc = main(["bench", "--sizes", "4,4K", "--ranks", "2", "--dtypes", "float32", "--peers", "nccl,torch-symm",
               "--replays", "3", "--calls", "10", "--no-progress", "--into", str(tmp_path)])
    assert rc == 0
    for name in ("bench.json", "bench.csv", "bench.txt", "sol.json", "latency.png", "speedup.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    doc = json.loads((tmp_path / "bench.json").read_text())
    sollat_rows = [r for r in doc["rows"] if r["impl"] == "sollat"]
    assert sollat_rows and any(r["status"] == "ok" for r in sollat_rows)
    assert all(r["check"] in ("ok", "") for r in sollat_rows if r["status"] == "ok")
    auto = [r for r in sollat_rows if r["algo"] == "auto" and r["status"] == "ok"]
    assert auto and all(r["selected"] for r in auto)
    # One GPU: virtual ranks, where NCCL cannot run (one rank per GPU). Two or more: the main job
    # relaunches itself under torchrun and NCCL runs.
    nccl_status = "ok" if torch.cuda.device_count() >= 2 else "skipped"
    assert any(r["impl"] == "nccl" and r["status"] == nccl_status for r in doc["rows"]), nccl_status
    assert doc["floor"]["median_us"] > 0 and doc["sol"]["sol_ns"] > 0


def test_tune_writes_a_card_table_with_its_provenance_and_times(tmp_path, monkeypatch) -> None:
    """``python -m sollat tune`` on virtual ranks: the table is keyed by this card, its note names
    the card, the commit, the date and the command, the times go to --json, and auto under the
    written table takes the fastest measured algorithm at every size (tune.allreduce_goal)."""
    from sollat import tune
    from sollat.collectives import select

    monkeypatch.setenv("SOLLAT_CACHE_DIR", str(tmp_path / "cache"))
    argv = ["--ranks", "2", "--sizes", "128,8K,64K", "--out", str(tmp_path / "t"), "--json", str(tmp_path / "t.json")]
    assert tune.main(argv) == 0
    (path,) = (tmp_path / "t").glob("*.json")
    table = select.load_table(path)
    gpu = torch.cuda.get_device_name(0)
    assert (table.gpu, table.world_size, table.mode) == (gpu, 2, "virtual")
    assert gpu in table.note and "commit " in table.note and "date 20" in table.note
    assert "command `python -m sollat tune --ranks 2 --sizes 128,8K,64K" in table.note
    doc = json.loads((tmp_path / "t.json").read_text())
    assert [s["bytes"] for s in doc["sizes"]] == [128, 8192, 65536] and doc["card"] == gpu
    assert all(s["best"] in s["us"] and "ll128" not in s["us"] for s in doc["sizes"])  # rests_on: never measured
    got = tune.allreduce_goal(doc, table)
    assert got["met"] == 3, got
