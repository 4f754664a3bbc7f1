"""The cubin cache: private directory, complete key, content check, atomic writes (no GPU needed)."""

from __future__ import annotations

import os
import stat

import pytest

from sollat.device import build

cuda_core = pytest.importorskip("cuda.core")

SRC = 'extern "C" __global__ void sollat_tiny(float* x) { x[threadIdx.x] += SOLLAT_ADD; }'
DEFINES = {"SOLLAT_ADD": "1.0f"}


def tiny(defines: dict[str, str] = DEFINES) -> bytes:
    return build.compile_cubin(SRC, name="tiny", arch="sm_90", defines=defines)


def cached_files(root) -> list:
    return sorted((root / "cubin").glob("*.cubin"))


@pytest.fixture
def root(tmp_path, monkeypatch):
    r = tmp_path / "cache"
    monkeypatch.setenv("SOLLAT_CACHE_DIR", str(r))
    return r


def test_one_root_for_cubins_and_tables(root) -> None:
    from sollat.collectives import select

    assert build.cache_root() == root
    assert build.cache_dir() == root / "cubin"
    assert select.user_table_dir() == root / "tuning"


def test_cache_dir_is_created_private(root) -> None:
    path = build.cache_dir()
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert stat.S_IMODE(root.stat().st_mode) == 0o700


def test_world_writable_cache_dir_is_refused(root) -> None:
    (root / "cubin").mkdir(parents=True)
    os.chmod(root / "cubin", 0o777)
    with pytest.warns(RuntimeWarning, match="others can write"):
        path = build.cache_dir()
    assert path != root / "cubin" and stat.S_IMODE(path.stat().st_mode) == 0o700
    assert build.untrusted_reason(path) is None
    tiny()
    assert cached_files(root) == [] and len(list(path.glob("*.cubin"))) == 1


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="chown to another user needs root")
def test_cache_dir_owned_by_another_user_is_refused(root) -> None:
    (root / "cubin").mkdir(parents=True, mode=0o700)
    os.chown(root / "cubin", 4242, 4242)
    assert "owned by uid 4242" in (build.untrusted_reason(root / "cubin") or "")
    with pytest.warns(RuntimeWarning, match="owned by uid 4242"):
        assert build.cache_dir() != root / "cubin"


def test_cache_hit_and_header(root) -> None:
    first = tiny()
    [f] = cached_files(root)
    assert f.read_bytes().endswith(first) and f.read_bytes().startswith(b"SOLLAT-CUBIN-1 ")
    assert stat.S_IMODE(f.stat().st_mode) == 0o600
    mtime = f.stat().st_mtime_ns
    assert tiny() == first and f.stat().st_mtime_ns == mtime  # served from the cache, not rewritten
    assert [p.name for p in f.parent.iterdir()] == [f.name]  # no temporary files left behind


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "foreign"])
def test_damaged_cache_file_is_recompiled_and_replaced(root, damage: str) -> None:
    fresh = tiny()
    [f] = cached_files(root)
    blob = f.read_bytes()
    damaged = {
        "truncate": blob[: len(blob) // 2],
        "flip": blob[:-10] + bytes([blob[-10] ^ 0xFF]) + blob[-9:],
        "empty": b"",
        "foreign": fresh,  # a bare cubin with no content header (e.g. an older sollat's file)
    }[damage]
    f.write_bytes(damaged)
    with pytest.warns(RuntimeWarning, match="failed its content check"):
        again = tiny()
    assert again == fresh
    assert f.read_bytes() == blob  # replaced by the good file
    assert tiny() == fresh


def test_key_covers_options_defines_arch_and_versions(root, monkeypatch) -> None:
    from cuda.core import ProgramOptions

    base = build._options("sm_90", DEFINES)
    key = build.cache_key(SRC, name="tiny", arch="sm_90", options=base, defines=DEFINES)
    assert key == build.cache_key(SRC, name="tiny", arch="sm_90", options=build._options("sm_90", DEFINES),
                                  defines=DEFINES)
    other = ProgramOptions(arch="sm_90", std="c++17", include_path=[str(build.INCLUDE_DIR)],
                           define_macro=sorted(DEFINES.items()), ftz=False, prec_div=True, prec_sqrt=True,
                           fma=True)  # one option differs
    assert "--fmad=false" in build.options_text(base) and "--fmad=true" in build.options_text(other)
    variants = [
        build.cache_key(SRC, name="tiny", arch="sm_90", options=other, defines=DEFINES),
        build.cache_key(SRC, name="tiny", arch="sm_100", options=base, defines=DEFINES),
        build.cache_key(SRC, name="tiny", arch="sm_90", options=base, defines={"SOLLAT_ADD": "2.0f"}),
        build.cache_key(SRC + " ", name="tiny", arch="sm_90", options=base, defines=DEFINES),
        build.cache_key(SRC, name="tiny2", arch="sm_90", options=base, defines=DEFINES),
    ]
    monkeypatch.setattr(build, "_cuda_core_version", lambda: "0.0.0-other")
    variants.append(build.cache_key(SRC, name="tiny", arch="sm_90", options=base, defines=DEFINES))
    monkeypatch.setattr(build, "_nvrtc_version", lambda: "0.0")
    variants.append(build.cache_key(SRC, name="tiny", arch="sm_90", options=base, defines=DEFINES))
    assert len({key, *variants}) == len(variants) + 1


def test_changed_option_compiles_a_new_file(root, monkeypatch) -> None:
    tiny()
    real_options = build._options

    def fast_math(arch, defines):
        o = real_options(arch, defines)
        o.fma = True
        return o

    monkeypatch.setattr(build, "_options", fast_math)
    tiny()
    assert len(cached_files(root)) == 2


def test_unwritable_cache_still_compiles(root, monkeypatch) -> None:
    def boom(*args, **kwargs):
        raise OSError("read-only file system")

    monkeypatch.setattr(build, "atomic_write", boom)
    with pytest.warns(RuntimeWarning, match="cannot write"):
        assert len(tiny()) > 100
    assert cached_files(root) == []
