from __future__ import annotations

import json

import pytest
import torch

from sollat import algorithms, select, tune
from sollat.errors import UnsupportedError
from sollat.select import NCCL, Rule, Table

ALL = tuple(algorithms.ALGORITHMS)
T = Table("test", 4, (Rule(1024, "oneshot_ll"), Rule(1 << 20, "oneshot_sentinel"), Rule(2 << 20, "twoshot_sentinel")))


def choose(nbytes: int, dtype=torch.bfloat16, op="sum", det=False, nccl=True, avail=ALL, table=T) -> str:
    return select.choose(table, nbytes, dtype, op, deterministic=det, nccl_available=nccl, available=avail)


def test_table_lookup_and_boundaries() -> None:
    assert choose(4) == "oneshot_ll"
    assert choose(1024) == "oneshot_ll"
    assert choose(1025) == "oneshot_sentinel"
    assert choose(1 << 20) == "oneshot_sentinel"
    assert choose((1 << 20) + 2) == "twoshot_sentinel"
    assert choose(2 << 20) == "twoshot_sentinel"


def test_falls_back_to_nccl_above_the_table() -> None:
    assert choose((2 << 20) + 1) == NCCL
    # without NCCL (virtual ranks) the last algorithm that can serve takes over
    assert choose((2 << 20) + 1, nccl=False) == "twoshot_sentinel"


def test_unavailable_or_unsuitable_rules_are_skipped() -> None:
    assert choose(512, avail=("oneshot_sentinel", "twoshot_sentinel")) == "oneshot_sentinel"
    t = Table("t", 2, (Rule(1 << 20, "ll128"), Rule(2 << 20, "twoshot_ll"))) if "ll128" in ALL else None
    if t is not None:
        assert choose(100, det=True, table=t) == "twoshot_ll"
        assert choose(100, dtype=torch.float64, table=t) == "twoshot_ll"


def test_nccl_rules() -> None:
    t = Table("t", 8, (Rule(256, "oneshot_ll"), Rule(4096, NCCL), Rule(1 << 20, "twoshot_ll")))
    assert choose(300, table=t) == NCCL
    assert choose(300, table=t, nccl=False) == "twoshot_ll"


def test_no_algorithm_serves_is_an_error() -> None:
    with pytest.raises(UnsupportedError, match="no algorithm"):
        choose(100, dtype=torch.int32, nccl=False)


def test_builtin_tables_load_and_generic_exists(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SOLLAT_CACHE_DIR", str(tmp_path))
    t = select.find_table("Some Unknown GPU", 4)
    assert t.gpu == "generic" and t.rules
    for rule in t.rules:
        assert rule.algorithm == NCCL or rule.algorithm in algorithms.ALGORITHMS


def test_user_table_wins(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SOLLAT_CACHE_DIR", str(tmp_path))
    mine = Table("My GPU", 4, (Rule(64, "oneshot_sentinel"),), note="x")
    path = tune.table_path("My GPU", 4, "1.0")
    path.parent.mkdir(parents=True)
    path.write_text(mine.to_json())
    found = select.find_table("My GPU", 4)
    assert found.rules == mine.rules and str(path) == found.source


def test_bad_tables_are_rejected(tmp_path) -> None:
    with pytest.raises(UnsupportedError, match="unknown algorithm"):
        Table.from_dict({"gpu": "g", "world_size": 2, "rules": [{"max_bytes": 1, "algorithm": "ring"}]}, "x")
    with pytest.raises(ValueError, match="sorted"):
        Table.from_dict({"gpu": "g", "world_size": 2, "rules": [{"max_bytes": 9, "algorithm": "oneshot_ll"},
                                                                {"max_bytes": 1, "algorithm": "oneshot_ll"}]}, "x")


def test_rules_from_winners_merges_runs() -> None:
    rules = tune.rules_from_winners([(128, "a"), (256, "a"), (512, "b"), (1024, "a"), (2048, NCCL)])
    assert rules == (Rule(256, "a"), Rule(512, "b"), Rule(1024, "a"), Rule(2048, NCCL))
    assert json.loads(Table("g", 2, rules).to_json())["rules"][0] == {"max_bytes": 256, "algorithm": "a"}
