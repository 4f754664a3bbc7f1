"""``auto`` on the card it runs on: the built-in virtual-rank rule of the fused op
(rmsnorm_rules.builtin, rules_for), the one log line when no table was measured on the card
(select.log_if_untuned), the goal checkers (rmsnorm_sweep.check_goals, tune.allreduce_goal) and
scripts/card_report.py's command line, table install and R-sweep summary."""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from sollat import tune
from sollat.bench import rmsnorm_sweep as sweep
from sollat.collectives import rmsnorm, rmsnorm_rules, select

ROOT = Path(__file__).resolve().parents[2]
K = 1024


def _card_report() -> Any:
    spec = importlib.util.spec_from_file_location("card_report", ROOT / "scripts" / "card_report.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["card_report"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_builtin_rule_follows_the_bytes_every_rank_receives() -> None:
    def pick(r: int, rows: int, row_bytes: int) -> str:
        return rmsnorm_rules.choose(rmsnorm_rules.builtin(r), rows, row_bytes, "fused")

    # LL up to 128 KiB received (160 KiB for at most 4 rows), the sentinel to 256 KiB, unfused past
    assert pick(2, 1, 8 * K) == pick(2, 8, 8 * K) == pick(8, 1, 16 * K) == "oneshot_ll"
    assert pick(8, 2, 10 * K) == "oneshot_ll"  # 160 KiB, 2 rows
    assert pick(2, 8, 10 * K) == "oneshot_sentinel"  # 160 KiB, 8 rows
    assert pick(8, 4, 8 * K) == pick(8, 2, 16 * K) == pick(2, 8, 16 * K) == "oneshot_sentinel"  # 256 KiB
    assert pick(8, 4, 10 * K) == pick(2, 16, 10 * K) == pick(8, 4, 16 * K) == "unfused"  # 320 KiB, 512 KiB
    # rows of at most 8 KiB: the sentinel up to 512 KiB and 16 rows
    assert pick(4, 16, 8 * K) == pick(8, 8, 8 * K) == "oneshot_sentinel"
    assert pick(8, 16, 8 * K) == pick(2, 17, 2 * K) == pick(2, 32, 8 * K) == "unfused"
    assert pick(72, 1, 16 * K) == "unfused" and pick(72, 1, 2 * K) == "oneshot_ll"
    with pytest.raises(ValueError, match="world_size"):
        rmsnorm_rules.builtin(0)


@pytest.mark.parametrize("r", [2, 4, 8, 16, 72])
def test_builtin_rule_never_fuses_more_than_it_did_for_less(r: int) -> None:
    """More rows or wider rows never turn unfused back into a fused kernel (one switch per row
    width, where batch invariance is tested)."""
    rules = rmsnorm_rules.builtin(r)
    widths = [2, 512, 2 * K, 4 * K, 8 * K, 10 * K, 16 * K, 32 * K, 64 * K, 1 << 20]
    for rows in range(1, 70):
        fused = [rmsnorm_rules.choose(rules, rows, b, "fused") != rmsnorm.UNFUSED for b in widths]
        assert fused == sorted(fused, reverse=True), (rows, fused)
    for b in widths:
        fused = [rmsnorm_rules.choose(rules, rows, b, "fused") != rmsnorm.UNFUSED for rows in range(1, 70)]
        assert fused == sorted(fused, reverse=True), (b, fused)
    assert all(rule.algorithm in rmsnorm.AUTO_ALGOS for rule in rules.rules)


def test_rules_for_a_table_without_its_own() -> None:
    own = rmsnorm_rules.Rules((rmsnorm_rules.Rule(4, 8192, "oneshot_ll"),))
    assert rmsnorm_rules.rules_for(own, 8, real=False) is own
    assert rmsnorm_rules.rules_for(own, 8, real=True) is own
    assert rmsnorm_rules.rules_for(None, 2, real=True) is rmsnorm_rules.DEFAULT
    assert rmsnorm_rules.rules_for(None, 8, real=False) == rmsnorm_rules.builtin(8)
    assert rmsnorm_rules.rules_for(None, 8, real=False) != rmsnorm_rules.builtin(2)


def _row(ranks: int, tokens: int, hidden: int, pick: str, **us: float) -> dict[str, Any]:
    names = {"oneshot_ll": "fused_ll", "oneshot_sentinel": "fused_sentinel", "unfused": "unfused"}
    full = {n: us.get(n) for n in sweep.NAMES}
    full["auto"] = us[names[pick]]
    return {"ranks": ranks, "dtype": "bfloat16", "fp8": False, "tokens": tokens, "hidden": hidden,
            "row_bytes": 2 * hidden, "us": full, "auto_pick": pick,
            "checks": {"oneshot_ll": "bitwise ok", "oneshot_sentinel": "bitwise ok", "unfused": "bitwise ok",
                       "auto": "bitwise ok", "epilogue": "bitwise ok"}}


def test_goal_checker_counts_and_names_the_misses() -> None:
    rows = [
        # auto the fastest and faster than ar+compiled: both goals met
        _row(2, 1, 4096, "oneshot_ll", fused_ll=3.8, fused_sentinel=4.4, unfused=4.7, **{"ar+compiled": 4.7}),
        # auto unfused where fused_ll is 0.82x: misses the fastest; 4.77 / 4.52 misses ar+compiled
        _row(2, 2, 4096, "unfused", fused_ll=3.96, fused_sentinel=4.69, unfused=4.77, **{"ar+compiled": 4.52}),
        # within 1.03x of the fastest (1.02) and of ar+compiled (1.015): both met
        _row(8, 8, 4096, "unfused", fused_ll=16.5, fused_sentinel=9.0, unfused=9.18, **{"ar+compiled": 9.045}),
        # the fastest candidate, but 1.05x ar+compiled
        _row(8, 64, 8192, "unfused", fused_ll=142.1, fused_sentinel=97.9, unfused=47.3, **{"ar+compiled": 45.0}),
    ]
    rows[2]["checks"]["oneshot_sentinel"] = "MISMATCH"  # a candidate that failed its check is no yardstick
    got = sweep.check_goals({"meta": {"card": "Test GPU", "commit": "abc"}, "rows": rows})
    assert (got["shapes"], got["meets_fastest"], got["meets_compiled"], got["meets_both"]) == (4, 3, 2, 2)
    assert [m["shape"] for m in got["misses"]] == ["R=2 bfloat16 2x4096", "R=8 bfloat16 64x8192"]
    assert got["misses"][0]["fastest"] == "fused_ll" and got["misses"][0]["auto_of_fastest"] == pytest.approx(4.77 / 3.96)
    g = sweep.auto_goals(rows[2])
    assert g["fastest"] == "unfused" and g["meets_fastest"] is True
    text = sweep.format_goals(got)
    assert "at 3 of 4 shapes" in text and "miss R=2 bfloat16 2x4096: auto picks unfused, fastest fused_ll" in text
    rows[0]["us"]["auto"] = None  # nothing timed for auto: neither goal counts as met
    assert sweep.check_goals({"rows": rows[:1]})["meets_both"] == 0


def test_allreduce_goal_checks_a_table_against_measured_times() -> None:
    doc = {"dtype": "bfloat16", "sizes": [
        {"bytes": 128, "best": "oneshot_ll", "us": {"oneshot_ll": 2.0, "oneshot_sentinel": 2.5}},
        {"bytes": 8192, "best": "oneshot_sentinel", "us": {"oneshot_ll": 3.3, "oneshot_sentinel": 3.0}},
        {"bytes": 65536, "best": "oneshot_sentinel", "us": {"oneshot_ll": 6.0, "oneshot_sentinel": 5.9}},
    ]}
    rules = tune.rules_from_winners([(s["bytes"], s["best"]) for s in doc["sizes"]])
    table = select.Table("Test GPU", 2, rules, mode="virtual")
    assert tune.allreduce_goal(doc, table)["met"] == 3
    stale = select.Table("Test GPU", 2, (select.Rule(65536, "oneshot_ll"),), mode="virtual")
    got = tune.allreduce_goal(doc, stale)
    assert got["met"] == 2 and [m["bytes"] for m in got["misses"]] == [8192]
    assert got["misses"][0]["ratio"] == pytest.approx(1.1)
    real = {"dtype": "bfloat16", "sizes": [{"bytes": 1 << 24, "best": "nccl", "us": {"oneshot_ll": 90.0, "nccl": 60.0}}]}
    handing = select.Table("Test GPU", 2, (select.Rule(1 << 20, "oneshot_ll"), select.Rule(1 << 26, "nccl")), mode="real")
    assert tune.allreduce_goal(real, handing)["met"] == 1  # a measured library path is auto's pick where the table says
    keeping = select.Table("Test GPU", 2, (select.Rule(1 << 26, "oneshot_ll"),), mode="real")
    assert tune.allreduce_goal(real, keeping)["misses"][0]["ratio"] == pytest.approx(1.5)


def test_one_log_line_when_no_table_was_measured_on_the_card(monkeypatch, caplog) -> None:
    monkeypatch.setattr(select, "_untuned_logged", False)
    generic = select.find_table("Card Without Tables", 8, mode="virtual")
    assert generic.gpu == select.GENERIC
    with caplog.at_level(logging.INFO, logger="sollat"):
        assert select.log_if_untuned(generic, "Card Without Tables", 8, "virtual")
        assert not select.log_if_untuned(generic, "Card Without Tables", 8, "virtual")
        assert not select.log_if_untuned(generic, "Another Card", 2, "real")
    lines = [r.getMessage() for r in caplog.records if r.name == "sollat"]
    assert len(lines) == 1, lines
    assert "Card Without Tables" in lines[0] and "python -m sollat tune --ranks 8" in lines[0]
    monkeypatch.setattr(select, "_untuned_logged", False)
    own = select.find_table("NVIDIA H200", 8, mode="virtual")
    with caplog.at_level(logging.INFO, logger="sollat"):
        assert not select.log_if_untuned(own, "NVIDIA H200", 8, "virtual")  # measured on this card: silent
        assert select.log_if_untuned(generic, "Other", 4, "real")
    assert "torchrun --nproc-per-node 4 -m sollat tune" in caplog.records[-1].getMessage()


def test_the_first_auto_call_on_an_untuned_card_logs(monkeypatch, caplog) -> None:
    from .test_host_logic import fake_virtual

    monkeypatch.setattr(select, "_untuned_logged", False)
    c = fake_virtual(2)  # "Fake GPU": no table of its own
    with caplog.at_level(logging.INFO, logger="sollat"):
        for rows in (1, 2, 64):
            c.selected_rmsnorm_algorithm(rows * 8192, torch.bfloat16, rows)
        c.selected_algorithm(4096, torch.float32, "sum")
    assert sum("python -m sollat tune" in r.getMessage() for r in caplog.records) == 1


def test_card_report_arguments() -> None:
    cr = _card_report()
    a = cr.parse_args(["--out", "/tmp/x", "--skip", "sol,tune-wide", "--ab-base", "54e7fdb"])
    assert a.out == "/tmp/x" and a.skip == {"sol", "tune-wide"} and a.ab_base == "54e7fdb" and a.budget_s == 470
    assert cr.parse_args(["--check", "/tmp/x"]).check == "/tmp/x"
    assert cr.parse_args(["--out", "d", "--ab-ranks", "2, 72"]).ab_ranks == "2,72"
    for bad in ([], ["--out", "a", "--check", "b"], ["--out", "a", "--budget-s", "0"], ["--out", "a", "--skip", "x"],
                ["--out", "a", "--ab-ranks", "1,8"], ["--out", "a", "--ab-ranks", "x"]):
        with pytest.raises(SystemExit):
            cr.parse_args(bad)
    assert "--install-tables" in cr.build_parser().format_help()
    assert cr.HEADLINE == ["--ranks", "2,8", "--hidden", "4096,8192", "--rows", "1,2,4,8,16,64", "--dtypes", "bf16",
                           "--fp8", "none"]
    a = sweep.parse_args(cr.HEADLINE)  # rmsnorm_bench.py accepts what the report passes
    assert a.ranks == (2, 8) and a.rows == (1, 2, 4, 8, 16, 64) and a.fp8 == ()
    assert sweep.parse_args(cr.FP8_SHAPES).fp8 == ("bfloat16",)


def test_card_report_r_sweep_summary() -> None:
    cr = _card_report()
    text = "\n".join(["FLOOR plain 0.832 pdl 0.543", "SWEEP 2 oneshot_ll 128 1.51 1.50 1.55",
                      "SWEEP 2 oneshot_sentinel 128 1.63 1.62 1.64", "SWEEP 2 oneshot_ll 4 1.40 1.40 1.41",
                      "SWEEP 64 oneshot_ll 128 9.7 9.6 9.8", "SWEEP 64 oneshot_ll_wide 128 3.70 3.6 3.8",
                      "SWEEP 72 oneshot_ll_wide 128 4.61 4.6 4.7", "SWEEP 72 oneshot_sentinel 128 1.0 1.0 1.0 WRONG",
                      "FLOOR plain 0.840 pdl 0.550"])
    got = cr.r_sweep_summary(text)
    assert got["fastest"]["2"] == {"algorithm": "oneshot_ll", "us": 1.51}
    assert got["fastest"]["72"]["algorithm"] == "oneshot_ll_wide"  # a WRONG line is never the fastest
    assert got["goals"]["64"]["met"] is True and got["goals"]["72"]["met"] is False
    assert got["ratio_to_r2"]["72"] == pytest.approx(4.61 / 1.51) and len(got["floors"]) == 2 and len(got["wrong"]) == 1


def _table_file(folder: Path, name: str, gpu: str, ws: int, note: str) -> Path:
    t = select.Table(gpu, ws, (select.Rule(1024, "oneshot_ll"),), note=note, mode="virtual")
    return select.write_table(t, folder / name)


def test_card_report_installs_tables_one_file_per_key(tmp_path) -> None:
    cr = _card_report()
    shipped, run = tmp_path / "tuning", tmp_path / "run"
    _table_file(shipped, "nvidia-h200-ws8.json", "NVIDIA H200", 8, "old")
    _table_file(shipped, "nvidia-h200-ws2.json", "NVIDIA H200", 2, "kept")
    _table_file(run, "nvidia-h200-ws8-virtual-any.json", "NVIDIA H200", 8, "new")
    cr.install_tables(run, shipped)
    assert sorted(f.name for f in shipped.glob("*.json")) == ["nvidia-h200-ws2.json", "nvidia-h200-ws8-virtual-any.json"]
    assert json.loads((shipped / "nvidia-h200-ws8-virtual-any.json").read_text())["note"] == "new"


def test_card_report_checks_a_finished_folder(tmp_path, capsys) -> None:
    cr = _card_report()
    (tmp_path / "rmsnorm").mkdir()
    rows = [_row(2, 1, 4096, "oneshot_ll", fused_ll=3.8, fused_sentinel=4.4, unfused=4.7, **{"ar+compiled": 4.7})]
    (tmp_path / "rmsnorm" / "rmsnorm-bench.json").write_text(json.dumps({"meta": {"card": "T", "commit": "c"},
                                                                         "rows": rows}))
    (tmp_path / "tune").mkdir()
    (tmp_path / "tune" / "tune-ws2.json").write_text(json.dumps({"card": "T", "ranks": 2, "mode": "virtual",
        "dtype": "float32", "sizes": [{"bytes": 128, "best": "oneshot_ll", "us": {"oneshot_ll": 1.0,
                                                                                  "oneshot_sentinel": 1.2}}]}))
    _table_file(tmp_path / "tuning", "t-ws2-virtual-any.json", "T", 2, "n")
    (tmp_path / "rank-sweep.txt").write_text("SWEEP 2 oneshot_ll 128 1.5 1.5 1.5\nSWEEP 64 oneshot_ll_wide 128 3.6 3 4\n")
    got = cr.checks(tmp_path)
    assert got["rmsnorm"]["rmsnorm"]["meets_both"] == 1 and got["allreduce_tables"][0]["met"] == 1
    assert got["r_sweep"]["goals"]["64"]["met"] is True
    assert json.loads((tmp_path / "checks.json").read_text())["r_sweep"]["goals"]["64"]["goal"] == 2.5
    out = capsys.readouterr().out
    assert "within 1.03x of the fastest candidate at 1 of 1 shapes" in out and "R=64 / R=2: 2.40" in out



@pytest.mark.parametrize("sweep_json, card, builtin_ok, old_ok", [
    ("docs/results/2026-12-06-h100-0a3bb82/rmsnorm-bench.json", "NVIDIA H100 80GB HBM3", 301, 212),
    ("docs/results/2026-12-03-h200-a120d1f/rmsnorm-bench.json", "NVIDIA H200", 294, 214),
])
def test_builtin_rule_on_the_sweeps_it_was_derived_from(sweep_json: str, card: str, builtin_ok: int, old_ok: int) -> None:
    """What docs/design.md states: over each card's full virtual-rank sweep the built-in rule's pick
    is within 1.03x of the fastest candidate at this many shapes, the rule before it (DEFAULT) at
    that many."""
    doc = json.loads((ROOT / sweep_json).read_text())
    assert doc["meta"]["card"] == card and len(doc["rows"]) == 324
    bench = {v: k for k, v in rmsnorm_rules.BENCH_NAMES.items()}

    def within(rules_of: Any) -> int:
        n = 0
        for r in doc["rows"]:
            us = r["us"]
            pick = rmsnorm_rules.choose(rules_of(r["ranks"]), r["tokens"], r["row_bytes"], "oneshot_ll")
            n += us[bench[pick]] <= sweep.AUTO_OF_FASTEST * min(us[k] for k in sweep.AUTO_CANDIDATES)
        return n

    assert within(lambda r: None) == old_ok
    assert within(rmsnorm_rules.builtin) == builtin_ok
