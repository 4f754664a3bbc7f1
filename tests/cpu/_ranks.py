"""Ranks for the CPU tests of multi-rank host logic: on threads (one store, no processes), or as
processes over gloo that write what each saw to ``<rank>.json`` and leave together."""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any


def on_threads(world: int, fn: Callable[[int], Any], delay: dict[int, float] | None = None,
               join_s: float = 60.0) -> list[Any]:
    """fn(rank) on a thread per rank (rank r starts after delay[r] s): each result or exception."""
    import time

    out: list[Any] = [None] * world

    def run(r: int) -> None:
        time.sleep((delay or {}).get(r, 0.0))
        try:
            out[r] = fn(r)
        except BaseException as exc:  # collected and compared by the test
            out[r] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_s)
    return out


def two_processes(worker: Callable[..., None], args: tuple[Any, ...], out: Path) -> dict[int, Any]:
    """``worker(rank, port, *args, str(out))`` in 2 spawned processes (``port``: a free local one for
    the process group's store); what each wrote to ``out/<rank>.json``."""
    return processes(worker, args, out, 2)


def processes(worker: Callable[..., None], args: tuple[Any, ...], out: Path, world: int) -> dict[int, Any]:
    """``worker(rank, port, *args, str(out))`` in ``world`` spawned processes; what each wrote to
    ``out/<rank>.json``."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(port, *args, str(out)), nprocs=world)
    return {r: json.loads((out / f"{r}.json").read_text()) for r in range(world)}


def leave_together(rank: int, prefix: str, timeout_s: float, world: int = 2) -> None:
    """The end of a worker of ``processes``: every rank is done before any leaves, and rank 0, which
    serves the store, leaves last (a process-group teardown could wait on collectives a failed
    construction never ran)."""
    import torch.distributed as dist

    store = dist.distributed_c10d._get_default_store()
    store.set(f"{prefix}done/{rank}", "1")
    store.wait([f"{prefix}done/{r}" for r in range(world)], timedelta(seconds=timeout_s))
    if rank != 0:
        store.set(f"{prefix}left/{rank}", "1")
    else:
        store.wait([f"{prefix}left/{r}" for r in range(1, world)], timedelta(seconds=timeout_s))
    os._exit(0)
