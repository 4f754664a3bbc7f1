"""NVRTC compiles every kernel instantiation for sm_90 (no GPU needed)."""

from __future__ import annotations

import re

import pytest

from sollat import build, instantiations

cuda_core = pytest.importorskip("cuda.core")


@pytest.mark.slow  # minutes: NVRTC compiles every instantiation (the default run still compiles two)
def test_every_instantiation_compiles_for_sm90(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SOLLAT_CACHE_DIR", str(tmp_path))
    work = list(instantiations.all_instantiations())
    files = {f for f, _ in work}
    assert {"allreduce_oneshot.cu", "allreduce_twoshot.cu"} <= files
    count = instantiations.precompile("sm_90", jobs=2)
    assert count == len(work) >= 100
    cubins = list((tmp_path / "cubin").glob("*.cubin"))  # $SOLLAT_CACHE_DIR/cubin
    assert len(cubins) == count
    assert all(c.stat().st_size > 1000 for c in cubins)


def test_compile_errors_are_reported(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SOLLAT_CACHE_DIR", str(tmp_path))
    with pytest.raises(RuntimeError, match="NVRTC failed"):
        build.compile_cubin('extern "C" __global__ void k() { this is not c++ }', name="broken")


def test_test_hook_and_small_epoch_builds_compile(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SOLLAT_CACHE_DIR", str(tmp_path))
    src = build.kernel_source("allreduce_oneshot.cu")
    for proto in ("ProtoLL", "ProtoSentinel"):
        build.compile_cubin(src, name="hooks", defines={
            "SOLLAT_T": "float", "SOLLAT_OP": "OpSum", "SOLLAT_PROTO": proto, "SOLLAT_MAX_RANKS": "4",
            "SOLLAT_SLOTS": "1", "SOLLAT_TEST_HOOKS": "1", "SOLLAT_EPOCH_BITS": "2"})


def test_include_guards_follow_paths() -> None:
    for h in build.INCLUDE_DIR.rglob("*.h"):
        rel = h.relative_to(build.INCLUDE_DIR).as_posix()
        guard = re.sub(r"[^A-Za-z0-9]", "_", rel).upper() + "_"
        text = h.read_text()
        assert f"#ifndef {guard}" in text and f"#define {guard}" in text, f"{rel}: include guard should be {guard}"


def test_no_multicast_anywhere() -> None:
    for f in list(build.CSRC.rglob("*.h")) + list(build.CSRC.rglob("*.cu")):
        text = f.read_text().lower()
        code = "\n".join(line.split("//")[0] for line in text.splitlines())
        assert "multimem" not in code and "cumulticast" not in code, f
