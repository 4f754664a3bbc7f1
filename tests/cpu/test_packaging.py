"""The package as a new user meets it: metadata, LICENSE, the pinned NVRTC, one version, a tidy
namespace, and the wheel that pip builds from this checkout."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
tomllib = pytest.importorskip("tomllib")


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


# ---- license -----------------------------------------------------------------------------------
def test_license_file_is_the_apache_2_text_pyproject_names() -> None:
    project = pyproject()["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.split("\n")[1].strip() == "Apache License" and "Version 2.0, January 2004" in text
    for section in range(1, 10):  # the nine sections of the terms, in order
        assert re.search(rf"^   {section}\. [A-Z]", text, re.M), section
    assert "END OF TERMS AND CONDITIONS" in text and len(text.splitlines()) >= 200
    # the SPDX form of `license` needs setuptools 77 or newer to build
    build = pyproject()["build-system"]["requires"]
    assert any(re.fullmatch(r"setuptools>=(\d+)", r) and int(r.split(">=")[1]) >= 77 for r in build), build


# ---- NVRTC: the extra pins what CI checks ------------------------------------------------------
def nvrtc_pin() -> str:
    extra = pyproject()["project"]["optional-dependencies"]["nvrtc"]
    assert len(extra) == 1
    m = re.fullmatch(r"nvidia-cuda-nvrtc==(\d+\.\d+\.\d+)", extra[0])
    assert m, f"the nvrtc extra must pin one NVRTC version, got {extra[0]!r}"
    return m.group(1)


def test_nvrtc_extra_pins_the_version_ci_compiles_with() -> None:
    pin = nvrtc_pin()
    assert pin.startswith("13.0."), "the GPU hosts' torch cu130 has NVRTC 13.0; a newer one accepts code 13.0 rejects"
    ci = (ROOT / ".ci" / "run").read_text()
    for other in re.findall(r"nvidia-cuda-nvrtc==([\d.]+)", ci):  # a separate CI pin may only repeat it
        assert other == pin


# ---- one version -------------------------------------------------------------------------------
def test_version_comes_from_the_package_metadata(capsys: pytest.CaptureFixture[str]) -> None:
    import sollat
    from sollat import cli

    assert sollat.__version__ == pyproject()["project"]["version"]
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"sollat {sollat.__version__}\n"
    version = re.escape(sollat.__version__)
    for path in (ROOT / "sollat").rglob("*.py"):  # no second copy of the version in the code
        assert not re.search(rf"""["']{version}["']""", path.read_text()), path


# ---- the namespace -----------------------------------------------------------------------------
def test_import_sollat_gives_testing_and_a_tidy_dir() -> None:
    """In a fresh interpreter: after ``import sollat`` alone, ``sollat.testing`` is there, and
    ``dir(sollat)`` lists public names only, every one of which resolves."""
    code = ("import sollat; assert callable(sollat.testing.inject) and callable(sollat.testing.clear); "
            "names = dir(sollat); print(' '.join(names)); [getattr(sollat, n) for n in names]")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    names = done.stdout.split()
    assert "annotations" not in names and "testing" in names and "Communicator" in names
    assert all(not n.startswith("_") or n == "__version__" for n in names), names


def test_reduce_scatter_reference_refuses_an_unknown_op() -> None:
    import torch

    from sollat.collectives.gather_scatter import rank_order_reduce, reduce_scatter_reference
    from sollat.errors import UnsupportedError

    xs = [torch.arange(4.0), torch.arange(4.0) + 10]
    with pytest.raises(UnsupportedError, match=r"one of sum, max, min, got 'bogus'"):
        reduce_scatter_reference(xs, op="bogus")
    with pytest.raises(UnsupportedError, match="got 'prod'"):
        rank_order_reduce(xs, "prod")
    assert [t.tolist() for t in reduce_scatter_reference(xs, op="min")] == [[0.0, 1.0], [2.0, 3.0]]


# ---- the wheel pip builds ----------------------------------------------------------------------
def test_the_wheel_carries_license_pins_and_kernel_sources(tmp_path: Path) -> None:
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} cannot build the SPDX license field (needs 77)")
    src = tmp_path / "src"  # a copy: the build leaves build/ and *.egg-info behind
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "sollat", src / "sollat", ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (wheel,) = (tmp_path / "dist").glob("sollat-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        licence = z.read(next(n for n in names if n.endswith(".dist-info/licenses/LICENSE"))).decode()
    assert licence == (ROOT / "LICENSE").read_text()
    assert "License-Expression: Apache-2.0" in meta and f"Version: {pyproject()['project']['version']}" in meta
    assert f'Requires-Dist: nvidia-cuda-nvrtc=={nvrtc_pin()}; extra == "nvrtc"' in meta
    assert 'Requires-Dist: matplotlib; extra == "bench"' in meta
    assert "sollat/device/csrc/include/sollat/abi.h" in names and "sollat/device/csrc/kernels/allreduce_oneshot.cu" in names
    assert any(n.startswith("sollat/collectives/tuning/") and n.endswith(".json") for n in names)
