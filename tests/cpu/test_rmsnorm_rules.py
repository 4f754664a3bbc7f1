"""all_reduce_rmsnorm's auto rule as tuning-table data (sollat/collectives/rmsnorm_rules.py), its
regeneration from a bench sweep, and the host side of scripts/rmsnorm_bench.py
(sollat/bench/rmsnorm_sweep.py): arguments, shape order, targets, the JSON and the written tables."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from sollat.bench import rmsnorm_sweep as sweep
from sollat.collectives import rmsnorm, rmsnorm_rules, select
from sollat.errors import UnsupportedError

R = rmsnorm_rules.Rule


def old_auto_choice(rows: int, nbytes: int, fused: str) -> str:
    """The rule auto followed before it was table data (the conservative default)."""
    wide = nbytes >= rmsnorm.AUTO_FUSED_MIN_ROW_BYTES * max(1, rows)
    return fused if rows <= rmsnorm.AUTO_FUSED_MAX_ROWS and wide else rmsnorm.UNFUSED


def test_the_default_is_the_rule_auto_had() -> None:
    for rows in (1, 2, 3, 4, 64, 4096):
        for row_bytes in (2, 8191, 8192, (16 << 10) - 1, 16 << 10, 32 << 10, 1 << 20):
            for fused in rmsnorm.AUTO_ALGOS:
                want = old_auto_choice(rows, rows * row_bytes, fused)
                assert rmsnorm_rules.choose(None, rows, row_bytes, fused) == want
                assert rmsnorm.auto_choice(rows, rows * row_bytes, fused) == want
    assert set(rmsnorm_rules.ALGORITHMS) == {"fused", *rmsnorm.AUTO_ALGOS, rmsnorm.UNFUSED}


def test_first_matching_rule_wins_and_unfused_past_them() -> None:
    rules = rmsnorm_rules.Rules((R(4, 8192, "oneshot_ll"), R(16, 16384, "fused"), R(64, 1 << 20, "oneshot_sentinel")))
    assert rmsnorm_rules.choose(rules, 4, 8192, "oneshot_x") == "oneshot_ll"
    assert rmsnorm_rules.choose(rules, 4, 8193, "oneshot_x") == "oneshot_x"  # 'fused': the AllReduce's one-shot
    assert rmsnorm_rules.choose(rules, 17, 100, "oneshot_x") == "oneshot_sentinel"
    assert rmsnorm_rules.choose(rules, 65, 100, "oneshot_x") == "unfused"
    assert rmsnorm_rules.choose(rules, 1, 2 << 20, "oneshot_x") == "unfused"
    assert rmsnorm_rules.switch_rows(rules, 8192, 100) == {4, 5, 16, 17, 64, 65}
    assert rmsnorm_rules.switch_rows(rmsnorm_rules.Rules(()), 8192, 100) == set()
    assert rmsnorm_rules.switch_rows(None, 16384, 100) == {2, 3}


def table_dict(**extra: Any) -> dict[str, Any]:
    return {"gpu": "NVIDIA H200", "world_size": 2, "mode": "virtual", "interconnect": "any",
            "rules": [{"max_bytes": 128, "algorithm": "oneshot_ll"}], "note": "n", **extra}


def test_tables_carry_the_rule_and_its_digest() -> None:
    plain = select.Table.from_dict(table_dict(), "t.json")
    assert plain.rmsnorm is None and "rmsnorm" not in plain.identity()
    rms = {"rules": [{"max_rows": 8, "max_row_bytes": 16384, "algorithm": "oneshot_sentinel"}], "note": "measured"}
    t = select.Table.from_dict(table_dict(rmsnorm=rms), "t.json")
    assert t.rmsnorm == rmsnorm_rules.Rules((R(8, 16384, "oneshot_sentinel"),), "measured")
    assert select.table_digest(t) != select.table_digest(plain)
    again = select.Table.from_dict(json.loads(t.to_json()), "again.json")
    assert again == t and again.rmsnorm is not None and again.rmsnorm.note == "measured"
    renoted = select.Table.from_dict(table_dict(rmsnorm={**rms, "note": "other words"}), "t.json")
    assert select.table_digest(renoted) == select.table_digest(t)  # notes are not part of the choice
    # a shipped table's digest is what it was before tables could hold the rule
    shipped = select.load_table(select.TUNING_DIR / "nvidia-h200-ws2-real-nvlink.json")
    assert shipped.rmsnorm is None and "rmsnorm" not in json.loads(shipped.to_json())


@pytest.mark.parametrize(("rms", "match"), [
    ([], "'rmsnorm' must be a JSON object of rules, note, got \\[\\]"),
    ({"rules": [{"max_rows": 0, "max_row_bytes": 8, "algorithm": "unfused"}]},
     "'rmsnorm.rules\\[0\\].max_rows' must be an integer >= 1, got 0"),
    ({"rules": [{"max_rows": 2, "max_row_bytes": True, "algorithm": "unfused"}]},
     "'rmsnorm.rules\\[0\\].max_row_bytes' must be an integer >= 1, got True"),
    ({"rules": [{"max_rows": 2, "max_row_bytes": 8, "algorithm": "twoshot_sentinel"}]},
     "'rmsnorm.rules\\[0\\].algorithm' must be one of fused, unfused, oneshot_ll, oneshot_sentinel, got 'twoshot_sentinel'"),
    ({"rules": [{"max_rows": 2, "max_row_bytes": 8}]}, "'rmsnorm.rules\\[0\\]' has no 'algorithm'"),
    ({"rules": [{"max_rows": 2, "max_row_bytes": 8, "algorithm": "unfused", "rows": 3}]},
     "'rmsnorm.rules\\[0\\]' has keys it does not take: 'rows'"),
    ({"rules": [], "note": 3}, "'rmsnorm.note' must be a string, got 3"),
    ({"rules": {"max_rows": 2}}, "'rmsnorm.rules' must be a list"),
])
def test_a_wrong_rule_names_the_table(rms: Any, match: str) -> None:
    with pytest.raises(UnsupportedError, match=rf"tuning table bad\.json: .*{match}"):
        select.Table.from_dict(table_dict(rmsnorm=rms), "bad.json")


def bench_row(ranks: int, tokens: int, hidden: int, us: dict[str, float], dtype: str = "bfloat16",
              fp8: bool = False, checks: dict[str, str] | None = None) -> dict[str, Any]:
    full = {"ar": 2.0, "ar+compiled": 4.0, "epilogue": 2.0, "compiled_norm": 2.0, **us}
    pick = "unfused"
    full["auto"] = full["unfused"]
    return {"ranks": ranks, "dtype": dtype, "fp8": fp8, "tokens": tokens, "hidden": hidden,
            "row_bytes": hidden * sweep.DTYPES[dtype], "us": full, "auto_pick": pick,
            "checks": checks or {"oneshot_ll": "bitwise ok", "oneshot_sentinel": "bitwise ok", "unfused": "bitwise ok",
                                 "auto": "bitwise ok", "epilogue": "bitwise ok"}}


def synthetic_sweep(ranks: int = 2) -> list[dict[str, Any]]:
    """Fused sentinel wins by 20 % for up to 8 rows of 16 KiB, LL by 10 % at 1 row of 8 KiB, unfused
    elsewhere; an fp32 row of 16 KiB where the sentinel loses at 8 rows (the cell takes the worst)."""
    rows = []
    for tokens in (1, 2, 4, 8, 16, 64):
        for hidden in (4096, 8192):
            u = 3.0 + 0.01 * tokens
            ll = sent = u * 1.5
            if hidden == 8192 and tokens <= 8:
                sent = u * 0.8
            if hidden == 4096 and tokens == 1:
                ll = u * 0.9
            rows.append(bench_row(ranks, tokens, hidden, {"unfused": u, "fused_ll": ll, "fused_sentinel": sent}))
        rows.append(bench_row(ranks, tokens, 4096, {"unfused": 3.0, "fused_ll": 9.0,
                                                    "fused_sentinel": 9.0 if tokens == 8 else 2.0}, dtype="float32"))
    return rows


def test_derive_reproduces_each_cells_winner() -> None:
    rows = synthetic_sweep()
    rules = rmsnorm_rules.derive(rows, 2, "note")
    assert rules.note == "note" and all(r.algorithm != "fused" for r in rules.rules)
    cells: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for r in rows:
        cells.setdefault((r["tokens"], r["row_bytes"]), []).append(r)
    picks = {k: rmsnorm_rules.choose(rules, k[0], k[1], "fused") for k in cells}
    assert picks == {k: rmsnorm_rules.cell_winner(v) for k, v in cells.items()}
    assert picks[(1, 8192)] == "oneshot_ll" and picks[(8, 16384)] == "unfused"  # fp32 loses there: the worst counts
    assert picks[(4, 16384)] == "oneshot_sentinel" and picks[(16, 16384)] == "unfused"
    # between and past the measured points
    assert rmsnorm_rules.choose(rules, 3, 16384, "fused") == "oneshot_sentinel"
    assert rmsnorm_rules.choose(rules, 512, 16384, "fused") == "unfused"
    assert rmsnorm_rules.choose(rules, 1, 32768, "fused") == "unfused"
    assert rules.rules[-1].algorithm != "unfused"  # trailing unfused rules are implied
    for r in rows:  # auto is never slower than the fastest of what it may pick beyond the margin
        name = {"oneshot_ll": "fused_ll", "oneshot_sentinel": "fused_sentinel"}.get(picks[(r["tokens"], r["row_bytes"])],
                                                                                 "unfused")
        assert r["us"][name] <= r["us"]["unfused"] * 1.0001 or r["dtype"] == "float32"
    with pytest.raises(ValueError, match="no rows for 4 ranks"):
        rmsnorm_rules.derive(rows, 4, "")


def test_margin_and_failed_checks_keep_unfused() -> None:
    close = [bench_row(2, 1, 8192, {"unfused": 3.0, "fused_ll": 2.95, "fused_sentinel": 9.0})]
    assert rmsnorm_rules.cell_winner(close) == "unfused"  # 1.7 % faster: within the margin
    assert rmsnorm_rules.cell_winner(close, margin=0.0) == "oneshot_ll"
    bad = [bench_row(2, 1, 8192, {"unfused": 3.0, "fused_ll": 1.0, "fused_sentinel": 9.0},
                     checks={"oneshot_ll": "MISMATCH", "unfused": "bitwise ok", "oneshot_sentinel": "bitwise ok"})]
    assert rmsnorm_rules.cell_winner(bad) == "unfused"
    assert rmsnorm_rules.derive(close, 2, "").rules == ()


def test_parse_args_defaults_quick_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    a = sweep.parse_args([])
    assert (a.ranks, a.hidden, a.rows) == (sweep.RANKS, sweep.HIDDEN, sweep.ROWS)
    assert a.dtypes == ("bfloat16", "float16", "float32") and a.fp8 == ("bfloat16",)
    q = sweep.parse_args(["--quick"])
    assert (q.ranks, q.hidden, q.rows, q.dtypes, q.fp8) == ((2, 8), (4096, 8192), (1, 8, 64), ("bfloat16",),
                                                            ("bfloat16",))
    q = sweep.parse_args(["--quick", "--ranks", "4", "--fp8", "none"])
    assert q.ranks == (4,) and q.fp8 == ()
    for bad, msg in ((["--ranks", "2,x"], "comma list of integers"), (["--rows", "0"], "integers in 1.."),
                     (["--dtypes", "bf16,int8"], "dtypes among"), (["--dtypes", "none", "--fp8", "none"], "nothing"),
                     (["--hidden", str(rmsnorm.MAX_HIDDEN + 1)], "--hidden"), (["--replays", "0"], ">= 1"),
                     (["--rules-from", "x.json"], "needs --write-tables")):
        with pytest.raises(SystemExit):
            sweep.parse_args(bad)
        assert msg in capsys.readouterr().err, bad


def test_shapes_run_bf16_first_and_every_rank_count_per_shape() -> None:
    shapes = sweep.plan_shapes((2, 8), ("float32", "bfloat16"), ("bfloat16",), (4096,), (1, 64))
    assert len(shapes) == 2 * 3 * 2
    groups = [(s.dtype, s.fp8) for s in shapes]
    assert groups[0] == ("bfloat16", False) and groups[4] == ("bfloat16", True) and groups[-1] == ("float32", False)
    assert [(s.tokens, s.ranks) for s in shapes[:4]] == [(1, 2), (1, 8), (64, 2), (64, 8)]
    assert shapes[0].row_bytes == 8192 and shapes[-1].row_bytes == 16384


def test_targets_summary_and_json(tmp_path: Path) -> None:
    good = bench_row(2, 1, 8192, {"unfused": 2.4, "fused_ll": 5.0, "fused_sentinel": 5.0})  # norm 2: target 2.5
    slow = bench_row(2, 32, 8192, {"unfused": 3.5, "fused_ll": 5.0, "fused_sentinel": 5.0,
                                   "epilogue": 2.3, "compiled_norm": 2.0})  # target 3.0, 1.15x epilogue
    worse = bench_row(8, 512, 4096, {"unfused": 4.5, "fused_ll": 9.0, "fused_sentinel": 9.0},
                      checks={"unfused": "MISMATCH"})
    j = sweep.judge(good)
    assert math.isclose(j["norm"], 2.0) and math.isclose(j["target"], 2.5) and j["auto_meets_target"]
    assert sweep.judge(slow)["auto_meets_target"] is False and sweep.judge(slow)["auto_not_slower"]
    assert sweep.judge(slow)["epilogue_ok"] is False and sweep.judge(worse)["auto_not_slower"] is False
    meta = {"mode": "virtual", "card": "NVIDIA H200", "date": "2026-12-03", "commit": "abc1234",
            "command": "python3 scripts/rmsnorm_bench.py"}
    doc = sweep.report(meta, 1.9, [good, slow, worse], 4, 12.5)
    s = doc["summary"]
    assert (s["shapes"], s["auto_meets_target"], s["auto_not_slower"], s["epilogue_within_1.1x"]) == (3, 1, 2, 2)
    assert s["misses_target"] == ["R=2 bfloat16 32x8192", "R=8 bfloat16 512x4096"]
    assert s["failed_checks"] == ["R=8 bfloat16 512x4096"] and not doc["complete"]
    worse["us"]["compiled_norm"] = float("nan")
    path = sweep.write_report(tmp_path / "out", sweep.report(meta, 1.9, [good, slow, worse], 3, 1.0))
    back = json.loads(path.read_text())
    assert path.name == "rmsnorm-bench.json" and not list(path.parent.glob("*.tmp"))
    assert back["meta"] == meta and back["complete"] and back["rows"][2]["us"]["compiled_norm"] is None
    assert back["rows"][0]["judge"]["auto_meets_target"] is True
    lines = [sweep.header(), *(sweep.format_row(r) for r in (good, slow, worse))]
    assert "auto pick" in lines[0] and "all bitwise ok" in lines[1] and "unfused: MISMATCH" in lines[3]


def test_write_tables_keeps_the_allreduce_rules(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("nvidia-h200-ws2.json", "nvidia-h200-ws2-real-nvlink.json", "generic.json"):
        shutil.copy(select.TUNING_DIR / name, src / name)
    doc = {"meta": {"mode": "virtual", "card": "NVIDIA H200", "date": "d", "commit": "c"},
           "rows": synthetic_sweep(2) + synthetic_sweep(4)}
    written = sweep.write_tables(doc, src, tmp_path / "out")
    assert [p.name for p in written] == ["nvidia-h200-ws2.json"]  # no virtual table of 4 ranks here
    new, old = select.load_table(written[0]), select.load_table(src / "nvidia-h200-ws2.json")
    assert new.rules == old.rules and new.note == old.note and new.mode == "virtual"
    assert new.rmsnorm == rmsnorm_rules.derive(doc["rows"], 2, sweep.rules_note(doc["meta"], 2))
    assert "VIRTUAL ranks" in new.rmsnorm.note
    with pytest.raises(ValueError, match="virtual-rank sweep"):
        sweep.write_tables({**doc, "meta": {**doc["meta"], "mode": "distributed"}}, src, tmp_path / "x")
