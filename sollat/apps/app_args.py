"""The command-line options and checks every app shares (``cg_args.py``, ``decode_args.py``): where
the ranks run (torchrun or virtual ranks on one device), how a run goes (graph, seed, JSON) and the
``--backends`` that may run there.

No option may be a prefix of a torchrun option: torchrun takes abbreviations of its own options
anywhere on the command line (tests/cpu/test_torchrun_options.py checks every app)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

import torch

from .backends import SOLLAT_KINDS, BackendSpec, parse_backend_list


def add_placement_arguments(p: argparse.ArgumentParser, *, virtual_flag: str, ranks: str) -> None:
    """``virtual_flag`` R (all R ``ranks`` in this process on one device) and ``--device``."""
    p.add_argument(virtual_flag, type=int, default=None, metavar="R",
                   help=f"run all R {ranks} in this process on one device")
    p.add_argument("--device", default=None, help="device for virtual ranks (default: cuda if present)")


def add_run_arguments(p: argparse.ArgumentParser, *, replayed: str, seed_help: str | None = None) -> None:
    """``--no-graph`` (run the ``replayed`` units eagerly), ``--seed`` and ``--json``."""
    p.add_argument("--no-graph", action="store_true", help=f"run {replayed} eagerly instead of as a CUDA graph")
    p.add_argument("--seed", type=int, default=0, help=seed_help)
    p.add_argument("--json", dest="json_path", default=None, help="also write the results here (rank 0)")


def check_at_least(parser: argparse.ArgumentParser, args: argparse.Namespace,
                   least: Mapping[str, float]) -> None:
    """``parser.error`` for the first option (by its ``dest``, in ``least``'s order) that was given
    (is not None) and is below its least value."""
    for dest, low in least.items():
        value = getattr(args, dest)
        if value is not None and value < low:
            parser.error(f"--{dest.replace('_', '-')} must be >= {low}")


def resolve_placement(parser: argparse.ArgumentParser, env: Mapping[str, str], *, virtual: int | None,
                      virtual_flag: str, device: str | None, check_whole: bool,
                      check_flag: str) -> tuple[bool, int, str]:
    """(distributed, world size, device) for an app: torchrun (one process per GPU) or ``virtual``
    ranks in this process. Contradictory options end through ``parser.error`` (exit status 2)."""
    distributed = "WORLD_SIZE" in env and "RANK" in env
    if distributed:
        if virtual is not None:
            parser.error(f"{virtual_flag} runs every rank in one process; do not combine it with torchrun")
        if device is not None:
            parser.error("--device is set by torchrun (cuda:LOCAL_RANK)")
        if check_whole:
            parser.error(f"{check_flag} needs the whole problem on one device: use {virtual_flag}")
        return True, int(env["WORLD_SIZE"]), f"cuda:{int(env.get('LOCAL_RANK', '0'))}"
    world = 1 if virtual is None else virtual
    if world < 1:
        parser.error(f"{virtual_flag} must be >= 1")
    return False, world, device or ("cuda" if torch.cuda.is_available() else "cpu")


def checked_backends(parser: argparse.ArgumentParser, text: str, *, device: str, distributed: bool,
                     virtual_flag: str, refused: Mapping[str, str], under_torchrun: str) -> list[BackendSpec]:
    """The backends ``text`` lists, each one able to run on ``device``; otherwise ``parser.error``.
    ``refused`` maps the kinds this app never runs to why (``{label}`` names the backend);
    ``under_torchrun`` names the backends that it runs with one process per GPU."""
    try:
        backends = parse_backend_list(text)
    except ValueError as e:
        parser.error(str(e))
    on_gpu = torch.device(device).type == "cuda"
    for spec in backends:
        if spec.kind in refused:
            parser.error(refused[spec.kind].format(label=spec.label))
        if spec.kind == "dist_sollat" and not distributed:
            parser.error(f"backend {spec.label} runs only under torchrun (one process per GPU; with {virtual_flag} "
                         "use sollat)")
        if spec.kind in (*SOLLAT_KINDS, "dist_sollat") and not on_gpu:
            parser.error(f"backend {spec.label} needs a CUDA device (device is {device})")
        if distributed and spec.kind in ("reference", "cpu"):
            parser.error(f"backend {spec.label} runs only with {virtual_flag} (under torchrun use {under_torchrun})")
    return backends
