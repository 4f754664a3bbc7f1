from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace

import pytest
import torch

from sollat import tune
from sollat.collectives import algorithms, select
from sollat.collectives.select import NCCL, Rule, Table
from sollat.errors import SollatError, TableMismatchError, UnsupportedError

ALL = tuple(algorithms.ALGORITHMS)
T = Table("test", 4, (Rule(1024, "oneshot_ll"), Rule(1 << 20, "oneshot_sentinel"), Rule(2 << 20, "twoshot_sentinel")))


def choose(nbytes: int, dtype=torch.bfloat16, op="sum", det=False, nccl=True, avail=ALL, table=T) -> str:
    return select.choose(table, nbytes, dtype, op, deterministic=det, handovers={NCCL} if nccl else set(), available=avail)


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


def test_torch_twoshot_rules_need_the_path_and_a_dtype_it_serves() -> None:
    t = Table("t", 2, (Rule(256, "oneshot_ll"), Rule(4096, select.TORCH_TWOSHOT), Rule(1 << 20, "twoshot_ll")))
    both = {NCCL, select.TORCH_TWOSHOT}
    pick = lambda nbytes, **kw: select.choose(t, nbytes, kw.pop("dtype", torch.bfloat16), kw.pop("op", "sum"),  # noqa: E731
                                              deterministic=False, handovers=kw.pop("h", both), available=ALL)
    assert pick(300) == select.TORCH_TWOSHOT
    assert pick(300, dtype=torch.float32) == select.TORCH_TWOSHOT
    assert pick(300, dtype=torch.float16) == "twoshot_ll"  # torch's two-shot has no fp16
    assert pick(300, op="max") == "twoshot_ll"
    assert pick(302) == "twoshot_ll"  # not a multiple of 4 bytes (an odd bfloat16 count)
    assert pick(300, h={NCCL}) == "twoshot_ll"  # a communicator without the buffer
    assert pick(256) == "oneshot_ll" and pick(4097) == "twoshot_ll"
    assert t.handover_bytes(select.TORCH_TWOSHOT) == 4096 and t.handover_bytes(NCCL) == 0
    Table.from_dict(json.loads(t.to_json()), "x.json")  # a handover name is a valid rule


def test_no_algorithm_serves_is_an_error() -> None:
    with pytest.raises(UnsupportedError, match="no algorithm"):
        choose(100, dtype=torch.int32, nccl=False)


def test_builtin_tables_load_and_generic_exists(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SOLLAT_CACHE_DIR", str(tmp_path))
    for mode in select.MODES:
        t = select.find_table("Some Unknown GPU", 4, mode=mode)
        assert t.gpu == "generic" and t.mode == select.ANY and t.rules
        for rule in t.rules:
            assert rule.algorithm == NCCL or rule.algorithm in algorithms.ALGORITHMS


def test_shipped_h200_tables_keep_real_and_virtual_apart(tmp_path, monkeypatch) -> None:
    """Virtual-rank tables for 2/4/8 ranks; one real-rank table (2 ranks over NVLink, measured
    under torchrun). A real communicator never gets a virtual table, nor the NVLink table when the
    interconnect is unknown; it falls back to the generic one."""
    monkeypatch.setenv("SOLLAT_CACHE_DIR", str(tmp_path))
    for ws in (2, 4, 8):
        v = select.find_table("NVIDIA H200", ws, mode="virtual", interconnect="nvlink")
        assert (v.gpu, v.world_size, v.mode) == ("NVIDIA H200", ws, "virtual")
    real2 = select.find_table("NVIDIA H200", 2, mode="real", interconnect="nvlink")
    assert (real2.gpu, real2.world_size, real2.mode, real2.interconnect) == ("NVIDIA H200", 2, "real", "nvlink")
    assert all(r.algorithm != "ll128" for r in real2.rules)  # rests on an unverified hardware property
    for ws, ic in ((4, "nvlink"), (8, "nvlink"), (2, "any"), (2, "pcie")):
        assert select.find_table("NVIDIA H200", ws, mode="real", interconnect=ic).gpu == "generic"


def _put(root, table: Table, name: str | None = None):
    path = tune.table_path(table.gpu, table.world_size, table.mode, table.interconnect) if name is None \
        else root / "tuning" / name
    return select.write_table(table, path)


def test_user_table_wins(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SOLLAT_CACHE_DIR", str(tmp_path))
    mine = Table("My GPU", 4, (Rule(64, "oneshot_sentinel"),), note="x", mode="real", interconnect="nvlink")
    path = _put(tmp_path, mine)
    assert path.parent == tmp_path / "tuning"
    found = select.find_table("My GPU", 4, mode="real", interconnect="nvlink")
    assert found == mine and str(path) == found.source
    # another interconnect, world size or mode does not take it
    assert select.find_table("My GPU", 4, mode="real", interconnect="pcie").gpu == "generic"
    assert select.find_table("My GPU", 2, mode="real", interconnect="nvlink").gpu == "generic"
    assert select.find_table("My GPU", 4, mode="virtual", interconnect="nvlink").gpu == "generic"


def test_virtual_table_never_serves_a_real_communicator(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SOLLAT_CACHE_DIR", str(tmp_path))
    virt = Table("My GPU", 4, (Rule(64, "oneshot_ll"),), mode="virtual")
    real = Table("My GPU", 4, (Rule(128, "oneshot_sentinel"), Rule(4096, NCCL)), mode="real")
    _put(tmp_path, virt, "a-virtual.json")  # sorts first: file order must not matter
    assert select.find_table("My GPU", 4, mode="real").gpu == "generic"
    _put(tmp_path, real, "b-real.json")
    assert select.find_table("My GPU", 4, mode="real") == real
    assert select.find_table("My GPU", 4) == real  # the default mode is the safe one
    assert select.find_table("My GPU", 4, mode="virtual") == virt
    with pytest.raises(UnsupportedError, match="mode"):
        select.find_table("My GPU", 4, mode="any")


def test_precedence_specific_interconnect_and_user_over_builtin(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SOLLAT_CACHE_DIR", str(tmp_path))
    anyic = Table("NVIDIA H200", 4, (Rule(64, "oneshot_ll"),), mode="virtual")
    nvl = Table("NVIDIA H200", 4, (Rule(256, "oneshot_ll"),), mode="virtual", interconnect="nvlink")
    _put(tmp_path, anyic)
    assert select.find_table("NVIDIA H200", 4, mode="virtual") == anyic  # beats the built-in one
    _put(tmp_path, nvl)
    assert select.find_table("NVIDIA H200", 4, mode="virtual", interconnect="nvlink") == nvl
    assert select.find_table("NVIDIA H200", 4, mode="virtual", interconnect="pcie") == anyic


def test_legacy_table_without_mode_counts_as_virtual(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SOLLAT_CACHE_DIR", str(tmp_path))
    (tmp_path / "tuning").mkdir()
    legacy = {"gpu": "My GPU", "world_size": 2, "rules": [{"max_bytes": 64, "algorithm": "oneshot_ll"}]}
    (tmp_path / "tuning" / "my-gpu-ws2-driver1.json").write_text(json.dumps(legacy))
    with pytest.warns(RuntimeWarning, match="no 'mode'"):
        assert select.find_table("My GPU", 2, mode="real").gpu == "generic"
    with pytest.warns(RuntimeWarning, match="no 'mode'"):
        assert select.find_table("My GPU", 2, mode="virtual").rules == (Rule(64, "oneshot_ll"),)


def test_truncated_or_wrong_user_table_is_a_clear_error(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SOLLAT_CACHE_DIR", str(tmp_path))
    good = Table("My GPU", 4, (Rule(64, "oneshot_sentinel"),), mode="real")
    path = _put(tmp_path, good)
    path.write_text(path.read_text()[:40])  # truncated mid-write by an old in-place writer
    with pytest.raises(UnsupportedError, match="not valid JSON") as e:
        select.find_table("My GPU", 4, mode="real")
    assert str(path) in str(e.value)
    bad_fields = [
        ({"gpu": "g", "rules": []}, "world_size"),
        ({"gpu": "g", "world_size": 2, "mode": "fake", "rules": []}, "mode"),
        ({"gpu": "g", "world_size": 2, "mode": "real", "rules": [{"algorithm": "oneshot_ll"}]}, "max_bytes"),
        ({"gpu": "g", "world_size": 2, "mode": "real", "rules": {"max_bytes": 1}}, "rules"),
        ([1, 2], "the table must be a JSON object of gpu, world_size, rules, note, mode, interconnect, rmsnorm"),
        ({"gpu": "g", "world_size": 2, "mode": "real", "rules": [], "world": 3}, "keys it does not take: 'world'"),
        ({"gpu": "", "world_size": 2, "rules": []}, "'gpu' must be a non-empty string"),
        ({"gpu": "g", "world_size": True, "rules": []}, "'world_size' must be an integer >= 0, got True"),
        ({"gpu": "g", "world_size": 2, "rules": [{"max_bytes": -1, "algorithm": "oneshot_ll"}]},
         r"'rules\[0\]\.max_bytes' must be an integer >= 0, got -1"),
    ]
    for doc, what in bad_fields:
        path.write_text(json.dumps(doc))
        with pytest.raises(UnsupportedError, match=what) as e:
            select.find_table("My GPU", 4, mode="real")
        assert str(path) in str(e.value)


def test_write_table_is_atomic_and_leaves_no_temp_files(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SOLLAT_CACHE_DIR", str(tmp_path))
    t1 = Table("My GPU", 2, (Rule(64, "oneshot_ll"),), mode="real")
    path = _put(tmp_path, t1)
    inode = path.stat().st_ino
    t2 = Table("My GPU", 2, (Rule(128, "oneshot_ll"),), mode="real")
    _put(tmp_path, t2)
    assert path.stat().st_ino != inode  # replaced by rename, not rewritten in place
    assert select.load_table(path) == t2
    assert [p.name for p in path.parent.iterdir()] == [path.name]

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        _put(tmp_path, t1)
    assert select.load_table(path) == t2 and [p.name for p in path.parent.iterdir()] == [path.name]


def test_digest_covers_key_and_rules_not_note_or_source() -> None:
    t = Table("g", 4, (Rule(64, "oneshot_ll"),), note="a", source="x", mode="real", interconnect="nvlink")
    d = select.table_digest(t)
    assert len(d) == 64 and d == select.table_digest(Table.from_dict(json.loads(t.to_json()), "elsewhere"))
    assert d == select.table_digest(replace(t, note="b", source="y"))
    changed = [replace(t, rules=(Rule(65, "oneshot_ll"),)), replace(t, rules=(Rule(64, "oneshot_sentinel"),)),
               replace(t, mode="virtual"), replace(t, interconnect="pcie"), replace(t, world_size=2),
               replace(t, gpu="h")]
    assert len({d, *(select.table_digest(c) for c in changed)}) == len(changed) + 1
    # pinned: the canonical form must not drift between sollat versions on different hosts
    assert select.table_digest(Table("generic", 0, ())) == hashlib.sha256(
        b'{"gpu":"generic","interconnect":"any","mode":"any","rules":[],"world_size":0}').hexdigest()


def test_agree_names_the_ranks_and_sources() -> None:
    select.agree(["d1"] * 4, ["a.json"] * 4)
    select.agree([], [])
    with pytest.raises(TableMismatchError) as e:
        select.agree(["d1", "d1", "d2", "d1"], ["/u/a.json", "/u/a.json", "builtin/generic.json", "/v/a.json"])
    msg = str(e.value)
    assert "ranks 0, 1, 3: /u/a.json, /v/a.json" in msg and "rank 2: builtin/generic.json" in msg
    assert isinstance(e.value, SollatError)
    with pytest.raises(ValueError):
        select.agree(["d1"], [])


def test_bad_tables_are_rejected(tmp_path) -> None:
    with pytest.raises(UnsupportedError, match=r"'rules\[0\]\.algorithm': .*unknown algorithm"):
        Table.from_dict({"gpu": "g", "world_size": 2, "rules": [{"max_bytes": 1, "algorithm": "ring"}]}, "x")
    with pytest.raises(UnsupportedError, match="'rules' must be sorted by max_bytes"):
        Table.from_dict({"gpu": "g", "world_size": 2, "rules": [{"max_bytes": 9, "algorithm": "oneshot_ll"},
                                                                {"max_bytes": 1, "algorithm": "oneshot_ll"}]}, "x")


def test_rules_from_winners_merges_runs() -> None:
    rules = tune.rules_from_winners([(128, "a"), (256, "a"), (512, "b"), (1024, "a"), (2048, NCCL)])
    assert rules == (Rule(256, "a"), Rule(512, "b"), Rule(1024, "a"), Rule(2048, NCCL))
    assert json.loads(Table("g", 2, rules).to_json())["rules"][0] == {"max_bytes": 256, "algorithm": "a"}


def test_the_large_message_paths_are_known() -> None:
    assert all(p in select.HANDOVERS or p in algorithms.ALGORITHMS for p in select.LARGE_MESSAGE_PATHS)
