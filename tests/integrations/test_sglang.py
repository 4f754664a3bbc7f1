"""sollat's SGLang plugin against the real SGLang 0.5.23 (gloo), through SGLang's own loader and HookRegistry."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import need, run_worker


def test_loader_opt_in_and_whitelist(tmp_path: Path) -> None:
    need("sglang")
    got = run_worker("_sglang_worker.py", "loader", tmp_path)[0]
    for case in ("not_whitelisted", "unset"):
        assert got[case] == {"hooked": False, "registered": [], "lines": [], "errors": []}, case
    # SGLang logs a plugin's exception and goes on without it
    assert not got["bad"]["hooked"] and got["bad"]["registered"] == []
    assert any("SOLLAT_ENGINE_PLUGIN='on' is not understood" in e for e in got["bad"]["errors"])
    assert got["on"]["hooked"] and got["on"]["registered"] == ["sollat.integrations.sglang"]
    assert len(got["on"]["lines"]) == 1 and got["on"]["lines"][0].startswith(
        "sollat: SGLang tensor-parallel custom all-reduce (groups tp, attention_tp) -> sollat (batch_invariant=False")


@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic_inference"])
def test_tp_custom_all_reduce_reaches_sollat(tmp_path: Path, deterministic: bool) -> None:
    need("sglang")
    ranks = run_worker("_sglang_worker.py", "tp", tmp_path,
                       {"SGLANG_ENABLE_DETERMINISTIC_INFERENCE": str(int(deterministic))})
    assert sorted(ranks) == [0, 1]
    for rank, got in ranks.items():
        assert got["ca_type"] == "SollatCustomAllreduce"
        assert got["other_ca_type"] != "SollatCustomAllreduce"  # a group that is not tensor-parallel
        assert all(got["checks"].values()), (rank, got["checks"])
        assert got["after_routed"] == 3 and got["after_declined"] == 3
        assert got["declined_method"] == {"int32": [False, None], "non_contiguous": [False, None]}
        assert got["should_when_disabled"] is False
        assert got["capturing_inside"] == [True, True] and got["capturing_after"] == [False, False]
        assert got["doubles"] == 1 and got["batch_invariant"] == [deterministic]
        assert f"batch_invariant={deterministic}" in got["load"]["lines"][0]
