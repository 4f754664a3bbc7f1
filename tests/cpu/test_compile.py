"""NVRTC compiles every kernel instantiation for sm_90 (no GPU needed). The sweep over every
instantiation for sm_90 and sm_100, with its spill check, is tests/cpu/test_spills.py."""

from __future__ import annotations

import re

import pytest

from sollat.collectives import instantiations
from sollat.device import build

cuda_core = pytest.importorskip("cuda.core")


@pytest.mark.slow  # one kernel file's instantiations (select one with -m '' -k allreduce_oneshot_wide)
@pytest.mark.parametrize("kernel_file", sorted({f for f, _ in instantiations.all_instantiations()}))
def test_each_kernel_file_compiles_for_sm90(tmp_path, monkeypatch, kernel_file: str) -> None:
    monkeypatch.setenv("SOLLAT_CACHE_DIR", str(tmp_path))
    want = sum(f == kernel_file for f, _ in instantiations.all_instantiations())
    assert instantiations.precompile("sm_90", jobs=2, files={kernel_file}) == want >= 1
    assert len(list((tmp_path / "cubin").glob("*.cubin"))) == want


def test_precompile_takes_a_filter(monkeypatch) -> None:
    """``only(file, defines)`` picks the instantiations to compile (the device scripts' virtual-rank
    subset), after ``files``."""
    done: list[tuple[str, dict[str, str]]] = []
    monkeypatch.setattr(instantiations, "_compile_one", lambda w: done.append((w[0], w[1])) or w[0])

    def epilogues_of_8(f: str, d: dict[str, str]) -> bool:
        return d.get("SOLLAT_TABLE_RANKS") == "8"

    n = instantiations.precompile("sm_90", jobs=1, files={"add_rmsnorm.cu"}, only=epilogues_of_8)
    assert n == len(done) == 3 and {d["SOLLAT_T"] for _, d in done} == {"float", "sollat::bf16", "sollat::f16"}
    assert instantiations.precompile("sm_90", jobs=1, only=lambda f, d: False) == 0


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


def test_production_oneshot_has_no_diagnostic_branches() -> None:
    assert "SOLLAT_LL_DIAG_RESET" not in (build.INCLUDE_DIR / "sollat" / "protocol_ll.h").read_text()


def test_probes_are_not_production_instantiations() -> None:
    assert set(build.probe_files()) == {"probe_barrier.cu", "probe_sol.cu"}  # the bench's sol and barrier
    assert not set(build.probe_files()) & set(build.kernel_files())  # no probe among the production kernels
    assert not {f for f, _ in instantiations.all_instantiations()} & set(build.probe_files())


def test_set_defines_selects_another_kernel_file() -> None:
    from sollat import testing

    class Stub:
        _extra_defines: dict[str, str] = {}
        files: dict[str, str] = {}

        def _set_kernel_files(self, files: dict[str, str]) -> None:
            self.files = files

    c = Stub()
    testing.set_defines(c, {"SOLLAT_FENCE_SYS": "0"}, kernel_files={"oneshot_ll": "my_variant.cu"})
    assert c._extra_defines == {"SOLLAT_FENCE_SYS": "0"} and c.files == {"oneshot_ll": "my_variant.cu"}
    testing.set_defines(c, {})
    assert c._extra_defines == {} and c.files == {}
