"""The package's version, from its one source, ``pyproject.toml``'s ``[project] version``.

* Run from a source checkout (the package directory sits beside the ``pyproject.toml`` of the
  project named ``sollat``; ``PYTHONPATH=.`` or an editable install): that file's version, so a
  checkout on ``PYTHONPATH`` reports the version of the code it runs, installed or not.
* Installed from a wheel: the installed distribution's metadata (built from that same field).
* Neither (a copy of the package without either): ``0+unknown``.

The file is read with a line scanner, not a TOML parser: Python 3.10 has no ``tomllib``, and the
two keys it needs are plain ``key = "value"`` lines of the ``[project]`` table.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _installed_version
from pathlib import Path

NAME = "sollat"
UNKNOWN = "0+unknown"
_KEY = re.compile(r'^\s*(name|version)\s*=\s*"([^"]*)"\s*(?:#.*)?$')


def checkout_version(pyproject: Path) -> str | None:
    """``[project] version`` of ``pyproject`` if it is sollat's, else None (no such file, another
    project's, or no version there)."""
    try:
        text = pyproject.read_text(encoding="utf-8")
    except OSError:
        return None
    keys: dict[str, str] = {}
    table = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            table = stripped
        elif table == "[project]" and (m := _KEY.match(line)):
            keys.setdefault(m.group(1), m.group(2))
    return keys.get("version") if keys.get("name") == NAME else None


def package_version(package_dir: Path, installed: Callable[[str], str] = _installed_version) -> str:
    """The version of the package in ``package_dir`` (see the module docstring for the order)."""
    found = checkout_version(package_dir.parent / "pyproject.toml")
    if found:
        return found
    try:
        return installed(NAME)
    except PackageNotFoundError:
        return UNKNOWN
