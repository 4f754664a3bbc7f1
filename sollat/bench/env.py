"""Where the benchmark runs: GPU presence, virtual vs torchrun mode, the safety environment and
the metadata every result file carries (card, ranks, date, commit, versions)."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import socket
import subprocess
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..device import environment

# Set in this process and in every child: sollat never touches NVLink multicast, and neither
# may the peers it measures (NCCL NVLS, torch symmetric-memory multicast, NVSHMEM NVLS).
SAFETY_ENV: dict[str, str] = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

NO_GPU_MESSAGE = (
    "sollat {cmd}: no CUDA GPU is present (torch.cuda.is_available() is False), so there is nothing "
    "to measure here.\n"
    "The protocols can be checked on the CPU with the protocol model:\n"
    "    python -m sollat model --demo\n"
    "Result files from a GPU run can be re-plotted here with:\n"
    "    python -m sollat plot RESULTS_DIR"
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def apply_safety_env(environ: MutableMapping[str, str] | None = None) -> None:
    """Force the no-multicast settings (before any NCCL or symmetric-memory initialisation)."""
    env = os.environ if environ is None else environ
    env.update(SAFETY_ENV)


def gpu_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available()) and torch.cuda.device_count() > 0
    except Exception:
        return False


@dataclass(frozen=True)
class DistInfo:
    """This process's place in a torchrun job (from the environment torchrun sets)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int


def dist_info(environ: MutableMapping[str, str] | None = None) -> DistInfo | None:
    """The torchrun placement, or None when this is a single process (virtual-rank mode)."""
    env = os.environ if environ is None else environ
    try:
        world = int(env.get("WORLD_SIZE", "1"))
    except ValueError:
        return None
    if world <= 1:
        return None
    return DistInfo(
        rank=int(env.get("RANK", "0")),
        world_size=world,
        local_rank=int(env.get("LOCAL_RANK", "0")),
        local_world_size=int(env.get("LOCAL_WORLD_SIZE", str(world))),
        master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
        master_port=int(env.get("MASTER_PORT", "29500")),
    )


def git_commit(override: str | None = None) -> str:
    """``override`` (``--commit``), else ``$SOLLAT_COMMIT``, else the checkout's short commit
    (``+dirty`` when it has changes), else 'unknown'. An explicit commit wins over git: a copied
    work tree (a device machine's) can carry git metadata older than its files."""
    if override:
        return override
    forced = environment.value("SOLLAT_COMMIT")
    if forced is not None:
        return str(forced)
    try:
        head = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode == 0 and head.stdout.strip():
            dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10)
            return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except Exception:
        pass
    return "unknown"


def versions() -> dict[str, str]:
    out: dict[str, str] = {"python": platform.python_version()}
    try:
        import torch

        out["torch"] = torch.__version__
        out["cuda"] = str(torch.version.cuda)
        try:
            out["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception:
            out["nccl"] = "unavailable"
    except Exception:
        pass
    try:
        import cuda.core

        out["cuda_core"] = str(getattr(cuda.core, "__version__", "?"))
    except Exception:
        pass
    try:
        from importlib.metadata import version

        out["sollat"] = version("sollat")
    except Exception:
        out["sollat"] = "source"
    return out


def card_name(device_index: int = 0) -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return str(torch.cuda.get_device_name(device_index))
    except Exception:
        pass
    return "no GPU"


def collect_meta(*, tool: str, mode: str, ranks: list[int], world_size: int, commit: str | None,
                 args: dict[str, Any] | None = None, device_index: int = 0) -> dict[str, Any]:
    gpu_count = 0
    try:
        import torch

        gpu_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        pass
    return {
        "tool": tool,
        "card": card_name(device_index),
        "gpu_count": gpu_count,
        "mode": mode,  # "virtual" (R ranks on one GPU, one process) or "distributed" (torchrun)
        "ranks": ranks,
        "world_size": world_size,
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "commit": git_commit(commit),
        "host": socket.gethostname(),
        "versions": versions(),
        "safety_env": dict(SAFETY_ENV),
        "args": args or {},
    }
