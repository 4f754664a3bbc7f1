"""What a new user meets first, beyond the README's commands: the version from anywhere, imports
by real module paths, the verbs' help and errors, the engine plugin's log tag, the package's
errors exported."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

import sollat

ROOT = Path(__file__).resolve().parents[2]
tomllib = pytest.importorskip("tomllib")
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


# ---- the version -------------------------------------------------------------------------------
def test_the_version_is_the_metadata_or_the_checkouts() -> None:
    from sollat import _version

    assert sollat.__version__ == _version.VERSION == VERSION
    assert _version.package_version(ROOT / "sollat", lambda name: "9.8.7") == "9.8.7"  # installed: metadata

    def missing(name: str) -> str:
        raise _version.PackageNotFoundError(name)

    assert _version.package_version(ROOT / "sollat", missing) == VERSION  # a checkout: its pyproject.toml
    assert "splitlines" not in (ROOT / "sollat" / "_version.py").read_text()  # read by a TOML parser


def test_a_copy_without_metadata_or_pyproject_says_unknown(tmp_path: Path) -> None:
    from sollat import _version

    def missing(name: str) -> str:
        raise _version.PackageNotFoundError(name)

    (tmp_path / "sollat").mkdir()
    assert _version.package_version(tmp_path / "sollat", missing) == "0+unknown"
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "other"\nversion = "1.0"\n')
    assert _version.package_version(tmp_path / "sollat", missing) == "0+unknown"
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "sollat"\nversion = "2.0.1"  # x\n')
    assert _version.package_version(tmp_path / "sollat", missing) == "2.0.1"
    (tmp_path / "pyproject.toml").write_text("[project\nname = ")
    assert _version.package_version(tmp_path / "sollat", missing) == "0+unknown"


def test_version_and_info_from_the_folder_above_an_editable_clone(tmp_path: Path) -> None:
    """A clone named ``sollat``, installed editable into a venv; ``python -m sollat --version``
    (and ``info``) run from the folder above it, where ``import sollat`` finds the clone's folder
    first and makes it an empty namespace package."""
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} cannot build sollat (needs 77)")
    clone = tmp_path / "sollat"
    clone.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "docs/pypi-description.md", "sollat_dist_autoload.py"):
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, clone / name)
    shutil.copytree(ROOT / "sollat", clone / "sollat", ignore=shutil.ignore_patterns("__pycache__"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=True, with_pip=False)  # torch from this Python
    python = env_dir / "bin" / "python"
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                           "--no-build-isolation", "-e", str(clone)], capture_output=True, text=True, timeout=300)
    if done.returncode != 0 and "no such option: --python" in done.stderr:
        pytest.skip("this pip cannot install into another environment (--python needs pip 22.3)")
    assert done.returncode == 0, done.stderr
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["SOLLAT_CACHE_DIR"] = str(tmp_path / "cache")
    where = subprocess.run([str(python), "-c", "import sollat; print(sollat.__path__)"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
    assert str(clone) in where.stdout and "_NamespacePath" in where.stdout, where  # the trap is there
    got = subprocess.run([str(python), "-m", "sollat", "--version"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert got.returncode == 0 and got.stdout == f"sollat {VERSION}\n", (got.stdout, got.stderr)
    info = subprocess.run([str(python), "-m", "sollat", "info"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert info.returncode == 0, info.stderr
    assert info.stdout.startswith(f"sollat {VERSION}; torch "), info.stdout


# ---- imports by real module paths --------------------------------------------------------------
def test_no_module_is_aliased_into_sys_modules() -> None:
    code = ("import sys, sollat\n"
            "bad = [k for k, m in sys.modules.items() if k.startswith('sollat') and getattr(m, '__name__', k) != k]\n"
            "print(bad)\n"
            "import sollat.collectives.custom, sollat.collectives.rmsnorm, sollat.collectives.gather_scatter\n"
            "assert sollat.rmsnorm is sys.modules['sollat.collectives.rmsnorm']\n"
            "assert sollat.custom.Collective is sollat.collectives.custom.Collective\n"
            "assert callable(sollat.gather_scatter.rank_order_reduce)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert "sys.modules" not in (ROOT / "sollat" / "__init__.py").read_text()


def test_docs_tests_and_examples_import_real_paths() -> None:
    aliased = re.compile(r"(?:from|import)\s+sollat\.(?:custom|rmsnorm|gather_scatter)\b")
    found = [f"{p.relative_to(ROOT)}:{n}" for top in ("docs", "tests", "examples", "scripts", "sollat")
             if (ROOT / top).is_dir()
             for p in sorted((ROOT / top).rglob("*")) if p.suffix in (".py", ".md") and "results" not in p.parts
             for n, line in enumerate(p.read_text().splitlines(), 1) if aliased.search(line)]
    assert not found, found


# ---- the package's errors ----------------------------------------------------------------------
def test_every_error_the_package_raises_by_name_is_in_sollat_errors_and_exported() -> None:
    from sollat import errors

    defined = {n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, Exception)}
    assert {"SetupFailedError", "EnvironmentValueError"} <= defined
    assert defined <= set(sollat.__all__) | {"TableMismatchError", "NotOneNVLinkDomainError"}
    for name in ("SetupFailedError", "EnvironmentValueError"):
        assert getattr(sollat, name) is getattr(errors, name)
    from sollat.comm import agree

    assert agree.SetupFailedError is sollat.SetupFailedError  # what the setup agreement raises


# ---- the verbs' help and errors ----------------------------------------------------------------
@pytest.mark.parametrize("verb", ["bench", "sol", "barrier", "plot"])
def test_every_measurement_verb_has_a_description(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    from sollat import cli

    with pytest.raises(SystemExit) as e:
        cli.main([verb, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    usage, description = out.split("\n\n")[:2]
    assert usage.startswith(f"usage: python -m sollat {verb}")
    assert " ".join(description.split()) == " ".join(cli.VERBS[verb].split())


def test_bench_sizes_error_names_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    from sollat import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--sizes", "abc"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m sollat bench: error: argument --sizes: ") and "'abc'" in err
    assert err.rstrip().endswith("(see python -m sollat bench --help)") and err.count("\n") == 1


def test_bench_help_says_the_variable_wins_over_git(capsys: pytest.CaptureFixture[str]) -> None:
    from sollat import cli

    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: $SOLLAT_COMMIT, else git)" in out


# ---- the engine plugin's log tag ---------------------------------------------------------------
# vLLM's format (vllm/logger.py); newer vLLM prints %(fileinfo)s, which its formatter sets from the
# record's filename (or, at DEBUG, from the path under vLLM's own folder, else the filename).
VLLM_FORMAT = "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"


def test_the_plugin_log_tag_is_sollats_path() -> None:
    from sollat.integrations import log_source

    log = log_source.tag_sollat_source(logging.getLogger("vllm.plugins.sollat.test"))
    assert log_source.tag_sollat_source(log) is log and len(log.filters) == 1
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(logging.Formatter(VLLM_FORMAT).format(record))

    log.addHandler(Keep())
    log.setLevel(logging.INFO)
    log.propagate = False
    shim = ROOT / "sollat" / "integrations" / "vllm.py"
    log.handle(log.makeRecord(log.name, logging.INFO, str(shim), 62, "sollat: on", None, None))
    log.handle(log.makeRecord(log.name, logging.INFO, "/elsewhere/vllm.py", 7, "theirs", None, None))
    assert "[sollat/integrations/vllm.py:62] sollat: on" in lines[0], lines
    assert "[vllm.py:7] theirs" in lines[1], lines  # a record from outside sollat keeps its tag


def test_the_vllm_plugin_logger_carries_the_tag() -> None:
    text = (ROOT / "sollat" / "integrations" / "vllm_adapter.py").read_text()
    assert "tag_sollat_source(init_logger(LOGGER))" in text
