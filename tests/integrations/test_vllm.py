"""sollat's vLLM plugin against the real vLLM 0.33 (CPU platform, gloo), through vLLM's own loader."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import need, run_worker

UNPATCHED = [False, False, False]  # _all_reduce_out_place, graph_capture, PostGradPassManager.configure
ALLOWED = {"SOLLAT_ENGINE_PLUGIN": "0 or 1 (or unset)", "SOLLAT_BATCH_INVARIANT": "0 or 1 (or unset)",
           "VLLM_BATCH_INVARIANT": "an integer, as vLLM reads it",
           "SOLLAT_ENGINE_MAX_BYTES": "a whole number of bytes >= 1024 (1 KiB)", "SOLLAT_SETUP_TIMEOUT_S": "a number of seconds"}


def test_loader_opt_in_and_whitelist(tmp_path: Path) -> None:
    need("vllm")
    got = run_worker("_vllm_worker.py", "loader", tmp_path)[0]
    for case in ("not_whitelisted", "unset", "zero", "zero_bad_other"):  # vLLM untouched, nothing said
        assert got[case] == {"patched": UNPATCHED, "lines": [], "error": None, "formatted": []}, case
    assert got["on"]["patched"] == [True, True, True] and got["on"]["error"] is None
    assert len(got["on"]["lines"]) == 1
    assert got["on"]["lines"][0].startswith("sollat: vLLM tensor-parallel all_reduce -> sollat (batch_invariant=False, "
                                            "messages up to 1 MiB (SOLLAT_ENGINE_MAX_BYTES), world sizes 2..72")
    assert got["again"] == {"patched": [True, True, True], "lines": [], "error": None, "formatted": []}  # once


def test_a_value_not_understood_stops_vllm_before_any_patch(tmp_path: Path) -> None:
    need("vllm")
    got = run_worker("_vllm_worker.py", "loader", tmp_path)[0]
    for name, allowed in ALLOWED.items():
        case = got[f"bad:{name}"]
        assert case["patched"] == UNPATCHED and case["lines"] == [], name
        error = case["error"]
        assert error is not None and "\n" not in error, name
        assert error.startswith(f"EnvironmentValueError: sollat: {name}=") and f"is not understood; it takes {allowed}" in error


def test_the_plugin_logs_through_vllms_logger(tmp_path: Path) -> None:
    need("vllm")
    got = run_worker("_vllm_worker.py", "loader", tmp_path)[0]
    assert got["logger"] == {"name": "vllm.plugins.sollat", "vllm_methods": True}  # vllm.logger.init_logger's
    [line] = got["on"]["formatted"]  # as vLLM's own handler prints it: its prefix, then the line
    assert line.endswith(got["on"]["lines"][0]) and line != got["on"]["lines"][0] and "INFO" in line
    assert "[sollat/integrations/vllm.py:" in line and "[vllm.py:" not in line, line  # sollat's, not vLLM's file


@pytest.mark.parametrize("batch_invariant", [False, True], ids=["default", "VLLM_BATCH_INVARIANT"])
def test_tp_all_reduce_reaches_sollat(tmp_path: Path, batch_invariant: bool) -> None:
    need("vllm")
    ranks = run_worker("_vllm_worker.py", "tp", tmp_path, {"VLLM_BATCH_INVARIANT": str(int(batch_invariant))})
    assert sorted(ranks) == [0, 1]
    for rank, got in ranks.items():
        assert got["load"]["lines"][0].startswith(f"sollat: vLLM tensor-parallel all_reduce -> sollat "
                                                  f"(batch_invariant={batch_invariant}")
        assert got["device_communicator"] == "CpuCommunicator"
        assert not got["world_adapter"]  # only the TP group is routed
        assert got["adapter_logger"] == "vllm.plugins.sollat"
        bad = [k for k, ok in got["checks"].items() if not ok]
        assert not bad and len(got["checks"]) == 14, (rank, bad)  # every result bit for bit
        # eager: 2 calls routed; int32, non-contiguous and empty declined (vLLM's path gave the sums)
        assert (got["after_eager"], got["after_ineligible"], got["after_compiled"]) == (2, 2, 4)
        for why in ("dtype torch.int32", "not contiguous", "empty"):
            assert got["counts"][f"declined:{why}"] == 1
        # the fused op: bf16 served by sollat in one call; float64 composed from vLLM's parts
        assert got["after_fused_ops"] == {"rmsnorm": 1, "all_reduce": 5}
        # the compile pass: in vLLM's pass manager, where its AllReduce fusion would be
        assert got["manager_passes"][:2] == ["NoOpEliminationPass", "SollatAllReduceRMSNormPass"]
        assert got["wanted_when_vllm_fuses"] == "vLLM's own fuse_allreduce_rms is on"
        assert got["graph_before"].count("vllm.all_reduce.default") == 2
        assert got["matched"] == 2
        assert "vllm.all_reduce.default" not in got["graph_after"]
        assert "vllm_ir.fused_add_rms_norm.default" not in got["graph_after"]
        assert {"sollat_vllm.all_reduce_rmsnorm_fp8.default", "sollat_vllm.all_reduce_rmsnorm.default"} <= set(
            got["graph_after"])
        assert got["graph_rmsnorm_calls"] == 2
        assert got["doubles"] == 1 and got["batch_invariant"] == [batch_invariant]
        # one rank cannot build a group's communicator: no rank routes it, one warning (rank 0's)
        assert got["spare"] == {"built": False, "unavailable": "rank 1: OutOfMemoryError: CUDA out of memory "
                                                               "(injected on rank 1)"}
    [warning] = ranks[0]["warnings"]
    assert warning.endswith("sollat: vLLM group tp:spare keeps the engine's all-reduce: rank 1: OutOfMemoryError: "
                            "CUDA out of memory (injected on rank 1)") and "WARNING" in warning
    assert ranks[1]["warnings"] == []
