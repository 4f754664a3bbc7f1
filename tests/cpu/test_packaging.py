"""The package as a new user meets it: metadata, LICENSE, the pinned NVRTC, one version, a tidy
namespace, and the wheel that pip builds from this checkout."""

from __future__ import annotations

import email
import os
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
    assert project["license"] == {"text": "Apache-2.0"}
    assert "License :: OSI Approved :: Apache Software License" in project["classifiers"]
    text = (ROOT / "LICENSE").read_text()
    assert text.split("\n")[1].strip() == "Apache License" and "Version 2.0, January 2004" in text
    for section in range(1, 10):  # the nine sections of the terms, in order
        assert re.search(rf"^   {section}\. [A-Z]", text, re.M), section
    assert "END OF TERMS AND CONDITIONS" in text and len(text.splitlines()) >= 200
    # metadata 2.4 (the license file in .dist-info/licenses/) needs setuptools 77 or newer
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
def test_version_comes_from_pyproject(capsys: pytest.CaptureFixture[str]) -> None:
    import sollat
    from sollat import cli

    assert sollat.__version__ == pyproject()["project"]["version"]
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"sollat {sollat.__version__}\n"
    version = re.escape(sollat.__version__)
    for path in (ROOT / "sollat").rglob("*.py"):  # no second copy of the version in the code
        assert not re.search(rf"""["']{version}["']""", path.read_text()), path


def test_a_checkout_on_pythonpath_reports_its_version_installed_or_not() -> None:
    """README's test command run from a checkout on PYTHONPATH, never installed: the version is
    pyproject.toml's, not 0+unknown (the metadata lookup is made to fail, as without an install)."""
    code = ("import importlib.metadata as m\n"
            "def missing(name): raise m.PackageNotFoundError(name)\n"
            "m.version = missing\n"
            "import sollat; print(sollat.__version__)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT / "tests", env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == pyproject()["project"]["version"]


def test_an_installed_copy_reports_its_metadata_version(tmp_path: Path) -> None:
    from sollat import _version

    site = tmp_path / "site-packages"
    (site / "sollat").mkdir(parents=True)  # an installed package: no pyproject.toml beside it
    assert _version.package_version(site / "sollat", lambda name: "9.8.7") == "9.8.7"

    def missing(name: str) -> str:
        raise _version.PackageNotFoundError(name)

    assert _version.package_version(site / "sollat", missing) == "0+unknown"
    (site / "pyproject.toml").write_text('[project]\nname = "other"\nversion = "1.0"\n')  # not sollat's
    assert _version.package_version(site / "sollat", missing) == "0+unknown"
    (site / "pyproject.toml").write_text('[tool.x]\nversion = "5"\n[project]\nname = "sollat"  # the name\n'
                                         'version = "2.0.1"\n[project.urls]\nversion = "x"\n')
    assert _version.package_version(site / "sollat", missing) == "2.0.1"  # a checkout, not installed
    assert _version.package_version(site / "sollat", lambda name: "9.8.7") == "9.8.7"  # the metadata first


# ---- metadata: classifiers, the index's description --------------------------------------------
def test_the_metadata_names_an_author_and_urls() -> None:
    project = pyproject()["project"]
    assert [a["name"] for a in project["authors"]] and all(a["name"].strip() for a in project["authors"])
    urls = project["urls"]
    assert {"Homepage", "Documentation"} <= set(urls), urls
    for name, url in urls.items():  # a public address, or a path of this repository
        assert url.startswith("https://") or (ROOT / url).exists(), (name, url)


def test_classifiers_describe_the_package() -> None:
    project = pyproject()["project"]
    classifiers = project["classifiers"]
    assert classifiers == sorted(set(classifiers)) and len(classifiers) >= 10
    assert [c for c in classifiers if c.startswith("License ::")] == ["License :: OSI Approved :: Apache Software License"]
    assert "Environment :: GPU :: NVIDIA CUDA" in classifiers and "Operating System :: POSIX :: Linux" in classifiers
    oldest = re.fullmatch(r">=3\.(\d+)", project["requires-python"])
    assert oldest
    pythons = sorted(int(c.rsplit(".", 1)[1]) for c in classifiers
                     if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c))
    assert pythons and pythons[0] == int(oldest.group(1)) and pythons == list(range(pythons[0], pythons[-1] + 1))
    trove = pytest.importorskip("trove_classifiers")
    assert not set(classifiers) - set(trove.classifiers), set(classifiers) - set(trove.classifiers)


def long_description() -> str:
    readme = pyproject()["project"]["readme"]
    assert readme["content-type"] == "text/markdown"
    return (ROOT / readme["file"]).read_text()


def test_the_index_description_has_no_links_into_the_checkout_and_no_history() -> None:
    from .test_no_history import history_references

    text = long_description()
    assert text.startswith("# sollat\n\nsollat is a Python library of barrier-free GPU collectives for PyTorch")
    targets = re.findall(r"\]\(([^)]*)\)", text) + re.findall(r"^\[[^\]]+\]:\s*(\S+)", text, re.M)
    assert all(re.match(r"https://", t) for t in targets), targets  # no relative link (dead on an index page)
    assert not history_references(text), history_references(text)
    assert "License: Apache-2.0" in text and pyproject()["project"]["license"] == {"text": "Apache-2.0"}


def test_the_index_description_names_what_exists() -> None:
    from sollat import cli

    text = long_description()
    project = pyproject()["project"]
    for extra in re.findall(r"sollat\[(\w+)\]", text):
        assert extra in project["optional-dependencies"], extra
    listed = re.search(r"command-line verbs \(([^)]*)\)", text)
    assert listed
    verbs = re.findall(r"`python -m sollat\s+(\w+)", text) + re.findall(r"`(\w+)`", listed.group(1))
    assert len(verbs) >= 4 and set(verbs) <= set(cli.VERBS), verbs
    import sollat

    for name in re.findall(r"sollat\.(\w+)\(", text):
        assert name in sollat.__all__, name
    assert f"torch {project['dependencies'][0].split('>=')[1]} or newer" in text  # torch>=2.11


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
    for name in ("pyproject.toml", "README.md", "LICENSE", pyproject()["project"]["readme"]["file"],
                 *(f"{m}.py" for m in pyproject()["tool"]["setuptools"]["py-modules"])):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
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
    assert f"Version: {pyproject()['project']['version']}" in meta
    fields = email.message_from_string(meta)  # as pip 23's `pip show` reads it: the License field
    assert fields["License"] == "Apache-2.0" and fields["Author"] == "The sollat maintainers", meta
    assert "Classifier: License :: OSI Approved :: Apache Software License" in meta
    assert sorted(fields.get_all("Project-URL")) == sorted(f"{k}, {v}" for k, v in pyproject()["project"]["urls"].items())
    head, body = meta.split("\n\n", 1)
    assert [line.split(": ", 1)[1] for line in head.splitlines() if line.startswith("Classifier: ")] == \
        pyproject()["project"]["classifiers"]
    assert "Description-Content-Type: text/markdown" in head and body == long_description()
    assert f'Requires-Dist: nvidia-cuda-nvrtc=={nvrtc_pin()}; extra == "nvrtc"' in meta
    assert 'Requires-Dist: matplotlib; extra == "bench"' in meta
    assert "sollat/device/csrc/include/sollat/abi.h" in names and "sollat/device/csrc/kernels/allreduce_oneshot.cu" in names
    assert any(n.startswith("sollat/collectives/tuning/") and n.endswith(".json") for n in names)
    # every probe kernel the wheel ships is one the package runs (no diagnostic copy of a kernel)
    probes = {Path(n).name for n in names if "/csrc/probes/" in n}
    code = "\n".join(p.read_text() for p in (ROOT / "sollat").rglob("*.py") if p.name != "build.py")
    assert probes and all(f'"{name}"' in code for name in probes), probes
    assert not [n for n in names if re.search(r"(^|/)diag_", n)], names
    assert "sollat_dist_autoload.py" in names  # the torch.backends entry point's module
