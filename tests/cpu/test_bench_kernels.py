"""The probe kernels compile with NVRTC for sm_90 (no GPU needed) and keep the safety rules."""

from __future__ import annotations

import re

import pytest

from sollat.device import build

pytest.importorskip("cuda.core")

PROBES = {
    "probe_sol.cu": ("sollat_probe_fence", "sollat_probe_chase", "sollat_probe_pingpong"),
    "probe_barrier.cu": ("sollat_barrier_a2a", "sollat_empty"),
}


@pytest.mark.parametrize("filename", sorted(PROBES))
def test_probe_compiles_for_sm90(filename: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOLLAT_CACHE_DIR", str(tmp_path))
    try:
        cubin = build.compile_cubin(build.kernel_source(filename), name=filename.removesuffix(".cu"), arch="sm_90")
    except RuntimeError as exc:
        if "NVRTC failed" in str(exc):
            raise
        pytest.skip(f"NVRTC unavailable: {exc}")
    assert len(cubin) > 1000
    for name in PROBES[filename]:
        assert name.encode() in cubin, name


@pytest.mark.parametrize("filename", sorted(PROBES))
def test_every_spin_in_the_probes_is_bounded(filename: str) -> None:
    """Each `while` poll loop in a probe kernel goes through Spin::again (sollat/fault.h)."""
    src = build.kernel_source(filename)
    code = "\n".join(line.split("//")[0] for line in src.splitlines())
    loops = re.findall(r"while\s*\(([^;{]*)\)\s*\n?\s*if\s*\(!\s*spin\.again", code)
    whiles = re.findall(r"\bwhile\s*\(", code)
    assert len(loops) == len(whiles), f"{filename}: a while loop without a bounded Spin"
    assert "multimem" not in code.lower() and "multicast" not in code.lower()
