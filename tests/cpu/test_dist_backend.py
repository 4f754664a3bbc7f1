"""The ``sollat`` torch.distributed backend on CPU: registration, the route this torch takes, what
is served and what is handed to the inner backend, the functional collectives, subgroups and a
call that differs between ranks (three spawned ranks, ``_dist_worker.py``, with a stand-in for the
kernels that computes sollat's rank-order arithmetic): eager, torch.compile(fullgraph=True) and a DTensor
tensor-parallel MLP reach the stand-in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sollat.integrations import dist_backend

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _run(mode: str, tmp_path: Path, env: dict[str, str] | None = None) -> dict[int, dict]:
    out = tmp_path / mode
    out.mkdir()
    proc = subprocess.run([sys.executable, str(HERE / "_dist_worker.py"), mode, str(out)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    got = {int(p.stem): json.loads(p.read_text()) for p in out.glob("*.json")}
    assert proc.returncode == 0 and len(got) == 3, proc.stderr[-4000:]
    errors = {r: g["error"] for r, g in got.items() if "error" in g}
    assert not errors, "\n".join(f"rank {r}:\n{e}" for r, e in errors.items())
    return got


def _torch_minor() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


def test_routing_handover_funcol_subgroups_and_mismatch(tmp_path: Path) -> None:
    got = _run("checks", tmp_path)
    want_route = "backend" if _torch_minor() >= (2, 14) else "process_group"
    assert {g["route"] for g in got.values()} == {want_route}
    assert all(g["funcol_served"] == 3 for g in got.values())
    # ranks 0 and 2 built one more communicator for their subgroup; rank 1 did not
    assert [got[r]["doubles"] for r in range(3)] == [2, 1, 2]
    assert {g["mismatch"] for g in got.values()} == {"CallMismatchError"}


def test_the_one_line_setup_comes_up_without_cuda(tmp_path: Path) -> None:
    got = _run("setup", tmp_path)
    assert {g["backend"] for g in got.values()} == {"cpu:gloo,cuda:sollat"}


def test_torch_loads_the_backend_through_its_entry_point(tmp_path: Path) -> None:
    """torch >= 2.14 finds the backend by its entry point: the ranks never call register()."""
    from importlib.metadata import entry_points

    if _torch_minor() < (2, 14):
        pytest.skip(f"torch {torch.__version__} loads no torch.distributed.backends entry points (2.14 and later do)")
    if not any(e.name == "sollat" for e in entry_points(group="torch.distributed.backends")):
        pytest.skip("sollat is not installed here (pip install -e . declares its entry points)")
    got = _run("setup", tmp_path, {"SOLLAT_TEST_ENTRY_POINT": "1"})
    assert {g["backend"] for g in got.values()} == {"cpu:gloo,cuda:sollat"}


def test_the_zero_change_mode_builds_sollat_groups_that_keep_their_backend_name(tmp_path: Path) -> None:
    got = _run("zero_change", tmp_path)
    assert {(g["backend"], g["sub_backend"]) for g in got.values()} == {("gloo", "gloo")}


def test_the_zero_change_mode_starts_at_import_torch_only_when_asked(tmp_path: Path) -> None:
    """torch runs the ``torch.backends`` entry point at import: with SOLLAT_DIST=1 the mode is on,
    without it sollat is not even imported (a stand-in distribution declares the entry point)."""
    info = tmp_path / "sollat_ep-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sollat-ep\nVersion: 0.0\n")
    text = (ROOT / "pyproject.toml").read_text()
    line = text.split('[project.entry-points."torch.backends"]\n', 1)[1].splitlines()[0]
    entry = line.replace(" ", "").replace('"', "")
    (info / "entry_points.txt").write_text(f"[torch.backends]\n{entry}\n")
    code = ("import sys, torch\nprint('imported' if 'sollat' in sys.modules else 'absent')\n"
            "from sollat.integrations import dist_zero_change as z\nprint('on' if z.enabled() else 'off')")
    path = os.pathsep.join([str(tmp_path), str(ROOT)])
    for value, want in (("1", ["imported", "on"]), ("", ["absent", "off"])):
        env = {**os.environ, "PYTHONPATH": path, "SOLLAT_DIST": value}
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
        assert proc.stdout.split() == want, proc.stderr[-3000:]


def test_the_zero_change_mode_refuses_an_untested_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    from sollat.errors import UnsupportedError
    from sollat.integrations import dist_zero_change

    monkeypatch.setattr(dist_zero_change, "torch_release", lambda: "2.99")
    with pytest.raises(UnsupportedError, match="tested on torch 2.11, 2.13, 2.14"):
        dist_zero_change.enable()
    assert not dist_zero_change.enabled()


def test_registration_is_idempotent_and_names_the_backend() -> None:
    import torch.distributed as dist

    dist_backend.register()
    dist_backend.register()
    assert "SOLLAT" in dist.Backend._plugins
    assert dist.Backend._plugins["SOLLAT"].extended_api


def test_the_entry_point_names_register() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split('[project.entry-points."torch.distributed.backends"]\n', 1)[1].split("\n[", 1)[0]
    assert 'sollat = "sollat.integrations.dist_backend:register"' in section.splitlines()
    from importlib import import_module

    assert import_module("sollat.integrations.dist_backend").register is dist_backend.register


def test_the_route_matches_what_this_torch_offers() -> None:
    base = dist_backend.python_backend_base()
    assert (base is not None) == (_torch_minor() >= (2, 14))
    assert dist_backend.route() == ("backend" if base is not None else "process_group")


def test_a_bad_inner_setting_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from sollat.errors import EnvironmentValueError

    monkeypatch.setenv(dist_backend.INNER_ENV, "mpi")
    with pytest.raises(EnvironmentValueError, match="SOLLAT_DIST_INNER='mpi'.*nccl, gloo"):
        dist_backend._inner_kind(None, 0, 2)


def test_the_decode_app_takes_dist_sollat_under_torchrun_only(capsys: pytest.CaptureFixture[str]) -> None:
    from sollat.apps.backends import make_backend, parse_backend_spec
    from sollat.apps.decode_args import parse_args

    assert parse_backend_spec("dist_sollat").label == "dist_sollat"
    with pytest.raises(ValueError, match="only sollat and sollat_fused take an algorithm"):
        parse_backend_spec("dist_sollat:oneshot_ll")
    with pytest.raises(SystemExit):
        parse_args(["--device", "cpu", "--backends", "dist_sollat"], {})
    assert "runs only under torchrun" in capsys.readouterr().err
    with pytest.raises(ValueError, match="runs only under torchrun"):
        make_backend("dist_sollat", world_size=2, device="cpu", distributed=False)
