"""Shared by the real-rank development scripts (one process per GPU under torchrun): start the
process group, time an eager run, take the slowest rank's figure, write the results with card,
date and commit."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from _host_timing import run_us


def start() -> int:
    """Bind this process to its GPU and join the process group; returns the local rank."""
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    return rank


def eager_us(fn: Callable[[], object], calls: int) -> float:
    """One eager run after a barrier: ``calls`` back-to-back calls, then one synchronize; wall time
    per call in µs."""
    return run_us(fn, calls, before=dist.barrier)


def slowest(v: float) -> float:
    """The largest ``v`` over the ranks (every rank must call it)."""
    t = torch.tensor([v], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def write(into: str, name: str, rows: list[dict[str, object]], **meta: object) -> None:
    """``into/name``: the rows, with card, world size, commit ($SOLLAT_COMMIT) and date."""
    Path(into).mkdir(parents=True, exist_ok=True)
    head = {"card": torch.cuda.get_device_name(), "world_size": dist.get_world_size(),
            "commit": os.environ.get("SOLLAT_COMMIT", "unknown"),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **meta}
    (Path(into) / name).write_text(json.dumps({"meta": head, "rows": rows}, indent=1))


def finish() -> None:
    dist.barrier()
    dist.destroy_process_group()
