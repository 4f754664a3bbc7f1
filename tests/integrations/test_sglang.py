"""sollat's SGLang plugin against the real SGLang 0.5.23 (gloo), through SGLang's own loader and HookRegistry."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import need, run_worker

NOTHING = {"hooked": False, "registered": [], "lines": [], "errors": [], "exit": None}
ALLOWED = {"SOLLAT_ENGINE_PLUGIN": "0 or 1 (or unset)", "SOLLAT_BATCH_INVARIANT": "0 or 1 (or unset)",
           "SGLANG_ENABLE_DETERMINISTIC_INFERENCE": "true, 1, yes, y or false, 0, no, n (any case), as SGLang reads it",
           "SOLLAT_ENGINE_MAX_BYTES": "a whole number of bytes >= 1024 (1 KiB)", "SOLLAT_TIMEOUT_S": "a number of seconds"}


def test_loader_opt_in_and_whitelist(tmp_path: Path) -> None:
    need("sglang")
    got = run_worker("_sglang_worker.py", "loader", tmp_path)[0]
    for case in ("not_whitelisted", "unset"):
        assert got[case] == NOTHING, case
    assert got["on"]["hooked"] and got["on"]["registered"] == ["sollat.integrations.sglang"]
    assert len(got["on"]["lines"]) == 1 and got["on"]["lines"][0].startswith(
        "sollat: SGLang tensor-parallel custom all-reduce (groups tp, attention_tp) -> sollat (batch_invariant=False, "
        "messages up to 1 MiB (SOLLAT_ENGINE_MAX_BYTES), world sizes 2..72")
    assert "SGLang's own custom all-reduce stays in place behind it" in got["on"]["lines"][0]


def test_a_value_not_understood_stops_sglang_before_any_hook(tmp_path: Path) -> None:
    """SGLang's loader logs a plugin's exception and goes on without it: the plugin exits instead."""
    need("sglang")
    got = run_worker("_sglang_worker.py", "loader", tmp_path)[0]
    for name, allowed in ALLOWED.items():
        case = got[f"bad:{name}"]
        assert {k: v for k, v in case.items() if k != "exit"} == {k: v for k, v in NOTHING.items() if k != "exit"}, name
        assert case["exit"].startswith(f"sollat: {name}=") and f"is not understood; it takes {allowed}" in case["exit"]
        assert "\n" not in case["exit"]


@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic_inference"])
def test_tp_custom_all_reduce_reaches_sollat(tmp_path: Path, deterministic: bool) -> None:
    need("sglang")
    ranks = run_worker("_sglang_worker.py", "tp", tmp_path,
                       {"SGLANG_ENABLE_DETERMINISTIC_INFERENCE": str(int(deterministic))})
    assert sorted(ranks) == [0, 1]
    for rank, got in ranks.items():
        assert got["ca_type"] == "SollatCustomAllreduce"  # SGLang has no custom all-reduce on CPU
        assert got["other_ca_type"] != "SollatCustomAllreduce"  # a group that is not tensor-parallel
        assert got["checks"] and all(got["checks"].values()), (rank, got["checks"])  # bit for bit
        assert got["after_routed"] == 3 and got["after_declined"] == 3
        assert got["declined_method"] == {"int32": [False, None], "non_contiguous": [False, None]}
        assert got["should_when_disabled"] is False
        assert got["capturing_inside"] == [True, True] and got["capturing_after"] == [False, False]
        assert got["doubles"] == 2 and got["batch_invariant"] == [deterministic, deterministic]
        assert f"batch_invariant={deterministic}" in got["load"]["lines"][0]
        assert got["adapter_logger"] == "sglang.srt.plugins.sollat"  # under SGLang's "sglang" logger


def test_sglang_features_that_check_for_custom_all_reduce_v2_stay_on(tmp_path: Path) -> None:
    """Where SGLang built its CustomAllReduceV2, the object SGLang keeps is one (with sollat in
    front): its isinstance gates (K3 SP collective, custom all-gather, K3 fused AllReduce +
    RMSNorm, DP attention) pass, and SGLang's own gate for its custom all-gather accepts it."""
    need("sglang")
    ranks = run_worker("_sglang_worker.py", "tp", tmp_path)
    for rank, got in ranks.items():
        v2 = got["v2"]
        assert v2["type"] == "SollatFakeV2" and v2["is_v2"] and not v2["disabled"] and v2["has_multicast"], rank
        assert v2["sglang_all_gather_gate"] is True
        # 1 KiB: sollat; 8 KiB, above SOLLAT_ENGINE_MAX_BYTES=4096: SGLang's own object; both bit for bit
        assert v2["small"] and v2["big"]
        assert (v2["sollat_calls"], v2["sglang_calls"]) == (1, 1)
        assert v2["capturing"] == [True, 1]  # graph_capture enters both
        assert v2["should_when_disabled"] == [False, False]
