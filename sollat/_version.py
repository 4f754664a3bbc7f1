"""The package's version, from its one source, ``pyproject.toml``'s ``[project] version``.

* Installed (a wheel, or an editable install of a checkout): the distribution's metadata,
  ``importlib.metadata.version("sollat")``, which the build wrote from that field.
* Not installed, run from a source checkout on ``PYTHONPATH``: the checkout's ``pyproject.toml``
  beside the package directory, read with ``tomllib`` (Python 3.11 and newer).
* Neither: ``0+unknown``.

Importable on its own (``from sollat._version import VERSION``): the command line reads the
version here, not from ``sollat/__init__.py``, so ``python -m sollat --version`` works even where
``import sollat`` finds a folder named ``sollat`` first (the parent folder of a clone, with an
editable install), which Python then imports as an empty namespace package.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _installed_version
from pathlib import Path

NAME = "sollat"
UNKNOWN = "0+unknown"


def checkout_version(pyproject: Path) -> str | None:
    """``[project] version`` of ``pyproject`` if it is sollat's, else None (no such file, another
    project's, not TOML, or no ``tomllib`` to read it)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        return None
    try:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    found = project.get("version")
    return found if project.get("name") == NAME and isinstance(found, str) else None


def package_version(package_dir: Path, installed: Callable[[str], str] = _installed_version) -> str:
    """The version of the package in ``package_dir`` (see the module docstring for the order)."""
    try:
        return installed(NAME)
    except PackageNotFoundError:
        return checkout_version(package_dir.parent / "pyproject.toml") or UNKNOWN


VERSION = package_version(Path(__file__).resolve().parent)
