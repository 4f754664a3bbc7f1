"""What both engine workers (_vllm_worker.py, _sglang_worker.py) share. They run in the engine's
Python with this folder first on ``sys.path`` and import it as ``_worker`` (as they import
``_double``): the command line, the capture of log lines, the environment of one plugin load, the
ranks' inputs and their rank-order sum, and the JSON every rank writes."""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import _double
import torch
import torch.multiprocessing as mp


class LogLines(logging.Handler):
    """Every message logged to the loggers it is added to, with the exception's name and text if one
    is attached."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        self.lines.append(record.getMessage() + (f" | {type(exc).__name__}: {exc}" if exc else ""))


def set_env(env: Mapping[str, str | None]) -> None:
    """Set each variable of ``env``; None removes it."""
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def rank_input(rank: int, shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Rank ``rank``'s input of call ``seed``: every process draws the same for every rank."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    return torch.randn(shape, generator=g).to(dtype)


def rank_order_sum(xs: list[torch.Tensor]) -> torch.Tensor:
    """sollat's sum of every rank's input (``sollat.gather_scatter.rank_order_reduce``: rank order,
    fp32 accumulation for 16-bit types, one rounding to the dtype). With two ranks every order of
    summation gives these bits, so the engines' own paths (gloo) give them too."""
    from sollat.collectives.gather_scatter import rank_order_reduce

    return rank_order_reduce(xs, "sum")


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shapes and dtypes and equal raw bits (NaNs compare by their bits too)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return bool(torch.equal(a.contiguous().view(ints), b.contiguous().view(ints)))


def write_rank_result(out: Path, rank: int, got: dict[str, Any]) -> None:
    """``got``, with what the doubles saw (how many were built, their batch_invariant), as
    ``out/<rank>.json``."""
    got["batch_invariant"] = [d.batch_invariant for d in _double.DOUBLES]
    got["doubles"] = len(_double.DOUBLES)
    (out / f"{rank}.json").write_text(json.dumps(got))


def _rank(rank: int, tp: Callable[[int, int, Path], None], port: int, out: Path) -> None:
    """One spawned rank: ``tp``, then both ranks leave torch.distributed together. A rank that
    exits while its process group is alive can abort in the teardown of gloo's threads
    ("terminate called without an active exception", 4 of 10 SGLang runs on 2 cores)."""
    import torch.distributed as dist

    tp(rank, port, out)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def run(loader: Callable[[Path], None], tp: Callable[[int, int, Path], None]) -> None:
    """The workers' command line: ``loader OUT`` runs ``loader(out)`` in this process, ``tp OUT``
    runs ``tp(rank, port, out)`` in two spawned ranks on a free local port."""
    mode, out = sys.argv[1], Path(sys.argv[2])
    if mode == "loader":
        loader(out)
    elif mode == "tp":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(_rank, args=(tp, port, out), nprocs=2)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
