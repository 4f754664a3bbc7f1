"""Every SOLLAT_* environment variable the package reads goes through one parser
(sollat/device/environment.py) with one set of rules, and docs/settings.md lists each one.

The variables are found by scanning the package's source, so a variable added anywhere in the
package without an entry in ``environment.VARIABLES`` (and so without a parser and a row in the
docs' table) fails here."""

from __future__ import annotations

import io
import re
import tokenize
import warnings
from pathlib import Path

import pytest

from sollat.device import environment
from sollat.errors import EnvironmentValueError, UnsupportedError
from sollat.integrations import settings

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sollat"
CSRC = PACKAGE / "device" / "csrc"
DOC = ROOT / "docs" / "settings.md"
NAME = re.compile(r"\bSOLLAT_[A-Z0-9_]*[A-Z0-9]\b")
#: SOLLAT_ names in the package's strings that are not environment variables (device-code names
#: are found in csrc and need no entry).
NOT_VARIABLES = {"SOLLAT_BUFFERS": "an NVRTC define a user-written kernel reads (sollat.custom)"}
#: A value no variable takes: not 0/1, not a number, has a space, and as a path its parent
#: ("no such") does not exist in the test's working directory.
BAD = "no such/value"
GOOD = {"SOLLAT_ALLOW_PCIE_PEERS": ("1", True), "SOLLAT_BATCH_INVARIANT": ("0", False),
        "SOLLAT_CLUSTER_RANKS": ("0", False), "SOLLAT_COMMIT": ("abc1234+dirty", "abc1234+dirty"),
        "SOLLAT_ENGINE_MAX_BYTES": ("64KiB", 64 << 10), "SOLLAT_ENGINE_PLUGIN": ("1", True),
        "SOLLAT_EXPERIMENTAL_RMSNORM_TWOSHOT": ("1", True), "SOLLAT_INTERCONNECT": ("NVLink", "nvlink"),
        "SOLLAT_MAX_BLOCKS": ("32", 32), "SOLLAT_SETUP_TIMEOUT_S": ("60", 60.0),
        "SOLLAT_TIMEOUT_S": ("2.5", 2.5), "SOLLAT_CACHE_DIR": ("new-cache", None),
        "SOLLAT_DIST": ("1", True), "SOLLAT_DIST_INNER": ("Gloo", "gloo"), "SOLLAT_DIST_MAX_COMMUNICATORS": ("0", 0)}


def _strings(path: Path) -> str:
    """The text of every string literal (docstrings, f-string parts) of one source file."""
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if tok.type == tokenize.STRING or tok.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
            out.append(tok.string)
    return "\n".join(out)


def variables_in_package() -> set[str]:
    """SOLLAT_* names in the package's strings, less device-code names (found in csrc) and Python
    names the package defines (``SOLLAT_KINDS = ...``, listed in ``__all__``)."""
    device_names = {n for p in CSRC.rglob("*") if p.is_file() for n in NAME.findall(p.read_text())}
    python_names = {m.group(1) for p in PACKAGE.rglob("*.py")
                    for m in re.finditer(r"^(SOLLAT_\w+)\s*[:=]", p.read_text(), re.M)}
    found = {n for p in PACKAGE.rglob("*.py") for n in NAME.findall(_strings(p))}
    return found - device_names - python_names - set(NOT_VARIABLES)


FOUND = sorted(variables_in_package())


def test_the_scan_finds_the_variables() -> None:
    assert {"SOLLAT_TIMEOUT_S", "SOLLAT_CACHE_DIR", "SOLLAT_INTERCONNECT", "SOLLAT_ENGINE_PLUGIN"} <= set(FOUND)
    assert "SOLLAT_T" not in FOUND and "SOLLAT_PROTO" not in FOUND  # device-code names


def test_every_variable_in_the_package_has_a_parser() -> None:
    assert set(FOUND) == set(environment.VARIABLES), (
        "a SOLLAT_* name in the package is not in sollat.device.environment.VARIABLES (or the reverse); a "
        "variable needs its parser, its values and its default there, and a row in docs/settings.md")


def test_nothing_reads_a_sollat_variable_around_the_parser() -> None:
    """No ``os.environ``/``getenv`` line names a SOLLAT_* variable, literally or through a constant
    that holds one (``OPT_IN_ENV = "SOLLAT_ENGINE_PLUGIN"``; a module's own constant of the same
    name for an engine's variable does not count)."""
    define = re.compile(r'^(\w+_ENV)\s*=\s*"(\w+)"', re.M)
    constants = {m.group(1) for p in PACKAGE.rglob("*.py") for m in define.finditer(p.read_text())
                 if m.group(2).startswith("SOLLAT_")}
    found = []
    for p in sorted(PACKAGE.rglob("*.py")):
        if p.name == "environment.py":
            continue
        text = p.read_text()
        mine = constants - {m.group(1) for m in define.finditer(text) if not m.group(2).startswith("SOLLAT_")}
        direct = re.compile(r"(environ|getenv)\b.*(SOLLAT_|\b(" + "|".join(sorted(mine)) + r")\b)")
        found += [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1)
                  if direct.search(line) and not line.lstrip().startswith("#")]
    assert not found, "read these through sollat.device.environment:\n" + "\n".join(found)


@pytest.mark.parametrize("name", FOUND)
def test_a_bad_value_is_one_error_naming_the_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                      name: str) -> None:
    monkeypatch.chdir(tmp_path)
    var = environment.VARIABLES[name]
    with pytest.raises(EnvironmentValueError) as ei:
        environment.value(name, {name: BAD})
    text = str(ei.value)
    assert text == f"sollat: {name}={BAD!r} is not understood; it takes {var.values}", text
    assert isinstance(ei.value, UnsupportedError) and ei.value.name == name
    monkeypatch.setenv(name, BAD)  # the library, from the process environment
    with pytest.raises(EnvironmentValueError, match=f"^sollat: {name}="):
        environment.value(name)
    with pytest.raises(settings.EnvironmentValueError) as plugin:  # the plugins' start-up check
        settings.check_environment({name: BAD})
    assert str(plugin.value).startswith(text) and "\n" not in str(plugin.value)


@pytest.mark.parametrize("name", FOUND)
def test_empty_is_unset_and_whitespace_is_stripped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                   name: str) -> None:
    monkeypatch.chdir(tmp_path)
    unset = environment.value(name, {})
    assert environment.value(name, {name: ""}) == unset and environment.value(name, {name: "  \t"}) == unset
    text, want = GOOD[name]
    if want is None:  # a path: relative to the working directory
        want = Path(text)
    assert environment.value(name, {name: text}) == want
    assert environment.value(name, {name: f"  {text}\n"}) == want


def test_every_variable_has_a_good_value_here() -> None:
    assert set(GOOD) == set(environment.VARIABLES)


@pytest.mark.parametrize("name", [n for n, v in environment.VARIABLES.items() if v.values == environment.BOOLEAN])
@pytest.mark.parametrize("text", ["true", "false", "yes", "no", "on", "off", "2", "01", "1 1"])
def test_one_boolean_grammar(name: str, text: str) -> None:
    with pytest.raises(EnvironmentValueError, match="it takes 0 or 1"):
        environment.flag(name, {name: text})


def test_the_interconnect_takes_its_words_in_any_case(monkeypatch: pytest.MonkeyPatch) -> None:
    from sollat.collectives import select

    for text, want in (("NVLink", "nvlink"), ("PCIe", "pcie"), ("any", "any")):
        monkeypatch.setenv("SOLLAT_INTERCONNECT", text)
        assert select.detect_interconnect(0) == want
    for text in ("nvlnk", "abc", "nvlink2"):
        monkeypatch.setenv("SOLLAT_INTERCONNECT", text)
        with pytest.raises(EnvironmentValueError, match="SOLLAT_INTERCONNECT.*nvlink, pcie, any"):
            select.detect_interconnect(0)


def test_the_library_sites_read_through_the_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    from sollat.bench.env import git_commit
    from sollat.collectives import algorithms, validate
    from sollat.device import topology

    monkeypatch.setenv("SOLLAT_ALLOW_PCIE_PEERS", " 1 ")
    assert topology.allow_pcie_from_env()
    monkeypatch.setenv("SOLLAT_ALLOW_PCIE_PEERS", "yes")
    with pytest.raises(EnvironmentValueError, match="SOLLAT_ALLOW_PCIE_PEERS"):
        topology.allow_pcie_from_env()
    monkeypatch.setenv("SOLLAT_EXPERIMENTAL_RMSNORM_TWOSHOT", "true")
    with pytest.raises(EnvironmentValueError, match="SOLLAT_EXPERIMENTAL_RMSNORM_TWOSHOT"):
        algorithms.rmsnorm_twoshot_enabled()
    monkeypatch.setenv("SOLLAT_TIMEOUT_S", "")
    assert validate.default_timeout_s() == 30.0
    monkeypatch.setenv("SOLLAT_TIMEOUT_S", " 7 ")
    assert validate.default_timeout_s() == 7.0
    monkeypatch.setenv("SOLLAT_COMMIT", "deadbeef")
    assert git_commit() == "deadbeef" and git_commit("cafe") == "cafe"  # --commit, then the variable
    monkeypatch.setenv("SOLLAT_ENGINE_MAX_BYTES", "2")
    with pytest.raises(EnvironmentValueError, match=r"bytes >= 1024 \(1 KiB\)"):
        settings.engine_max_bytes()


def test_the_cache_is_created_only_where_the_user_said(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from sollat.device import build

    deep = tmp_path / "no" / "such" / "tree"
    monkeypatch.setenv("SOLLAT_CACHE_DIR", str(deep))
    with pytest.raises(EnvironmentValueError, match="SOLLAT_CACHE_DIR"):
        build.cache_dir()
    assert not (tmp_path / "no").exists()
    a_file = tmp_path / "passwd"
    a_file.write_text("root:x:0:0\n")
    monkeypatch.setenv("SOLLAT_CACHE_DIR", str(a_file))
    with pytest.raises(EnvironmentValueError, match="SOLLAT_CACHE_DIR=.*a directory"):
        build.cache_dir()
    leaf = tmp_path / "cache"
    monkeypatch.setenv("SOLLAT_CACHE_DIR", f" {leaf} ")
    assert build.cache_dir() == leaf / "cubin" and (leaf / "cubin").is_dir()


def test_the_cache_warning_is_one_line_without_source(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from sollat.device import build

    root = tmp_path / "shared"
    (root / "cubin").mkdir(parents=True)
    (root / "cubin").chmod(0o777)
    monkeypatch.setenv("SOLLAT_CACHE_DIR", str(root))
    monkeypatch.setattr(build, "_fallback_dirs", {})
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        build.cache_dir()
    [w] = [w for w in got if "cubin cache" in str(w.message)]
    shown = warnings.formatwarning(w.message, w.category, w.filename, w.lineno, None)
    assert shown.count("\n") == 1 and "others can write" in shown, shown


def test_the_cli_prints_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from sollat import cli

    monkeypatch.setenv("SOLLAT_CACHE_DIR", "/no/such/dir/anywhere")
    assert cli.main(["info"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "SOLLAT_CACHE_DIR='/no/such/dir/anywhere' is not understood" in err


def _doc_rows() -> dict[str, list[str]]:
    rows = {}
    for line in DOC.read_text().splitlines():
        m = re.match(r"\|\s*`(SOLLAT_\w+)`\s*\|(.*)\|\s*$", line)
        if m:
            rows[m.group(1)] = [c.strip() for c in m.group(2).split("|")]
    return rows


def test_the_docs_table_lists_every_variable_with_its_values_and_default() -> None:
    rows = _doc_rows()
    assert set(rows) == set(environment.VARIABLES), set(rows) ^ set(environment.VARIABLES)
    for name, var in environment.VARIABLES.items():
        values, default = rows[name][0], rows[name][1]
        assert values == var.values, (name, values)
        assert default == var.default, (name, default)
