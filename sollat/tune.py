"""``python -m sollat tune``: measure every algorithm on this machine and write the selection table.

What the verb does, in a user's words, is :data:`DESCRIPTION` (its ``--help``). Underneath:
timing is the benchmark's (``sollat.bench.timing``: CUDA-graph replay of back-to-back calls,
median); the table's path is ``table_path`` under ``select.user_table_dir()`` unless ``--out``
names a folder (for example ``sollat/collectives/tuning/`` to ship it); ``select.write_table``
replaces the file atomically (``os.replace``), so a reader never sees part of one.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from .collectives import select
from .collectives.algorithms import ALGORITHMS
from .collectives.select import NCCL, Rule, Table

#: ``tune --help``'s text: what the verb does and where the table goes, in a user's words.
DESCRIPTION = (
    "Measure every algorithm on this machine and write the selection table that algo=\"auto\" reads. "
    "With one GPU it tunes virtual ranks (--ranks); under torchrun it tunes the real group and also "
    "measures NCCL and torch symmetric memory's two-shot as auto runs them, so the table hands a size "
    "over wherever a library is faster. Each figure is the median of CUDA-graph replays of back-to-back "
    "calls, as in python -m sollat bench. The table goes to sollat's cache (SOLLAT_CACHE_DIR, default "
    "~/.cache/sollat, folder tuning/), one file per GPU model, world size, mode (real or virtual) and "
    "interconnect, where auto finds it; --out writes it elsewhere. Under torchrun only rank 0 writes, "
    "to its host: copy the file to every other host. The file is replaced in one step, never rewritten "
    "in place."
)
DEFAULT_SIZES = [1 << k for k in range(7, 25)]  # 128 B .. 16 MiB (virtual ranks)
DEFAULT_SIZES_REAL = [1 << k for k in range(7, 27)]  # 128 B .. 64 MiB


def rules_from_winners(winners: list[tuple[int, str]]) -> tuple[Rule, ...]:
    """Merge per-size winners (sorted by size) into rules: each run of one winner is one rule
    ending at the largest size it won. A run that ends in NCCL stays NCCL up to its end."""
    rules: list[Rule] = []
    for nbytes, algo in sorted(winners):
        if rules and rules[-1].algorithm == algo:
            rules[-1] = Rule(nbytes, algo)
        else:
            rules.append(Rule(nbytes, algo))
    return tuple(rules)


def table_path(gpu: str, world_size: int, mode: str, interconnect: str, root: Path | None = None) -> Path:
    """One file per selection key (``select`` module docstring): a re-tune replaces the old table."""
    slug, ic = (re.sub(r"[^A-Za-z0-9]+", "-", x).strip("-").lower() for x in (gpu, interconnect))
    return (root or select.user_table_dir()) / f"{slug}-ws{world_size}-{mode}-{ic or 'any'}.json"


def write_result(gpu: str, ranks: int, rules: tuple[Rule, ...], *, distributed: bool, note: str,
                 out: Path | None = None) -> Path:
    """Write the measured table under its key: mode from ``distributed``, interconnect detected."""
    mode = "real" if distributed else "virtual"
    interconnect = select.detect_interconnect(torch.cuda.current_device()) if distributed else select.ANY
    table = Table(gpu, ranks, rules, note=note, mode=mode, interconnect=interconnect)
    return select.write_table(table, table_path(gpu, ranks, mode, interconnect, out))


def write_measurements(path: Path, doc: dict[str, object]) -> Path:
    """``--json``: the measured times (NaN/Inf as null), what ``allreduce_goal`` checks a table against."""
    from .bench import results

    return results.write_json(path, doc)


def allreduce_goal(doc: dict[str, object], table: Table, *, within: float = 1.03) -> dict[str, object]:
    """For ``--json``'s measurements, at how many sizes ``auto`` under ``table`` (its choice among the
    measured algorithms, library paths included where they were measured) takes at most ``within``
    times the fastest measured time, and the sizes where it does not."""
    sizes = doc["sizes"]
    assert isinstance(sizes, list)
    dtype = getattr(torch, str(doc["dtype"]))
    misses, met = [], 0
    for s in sizes:
        us = {k: v for k, v in s["us"].items() if v is not None and math.isfinite(v)}
        if not us:
            continue
        mine = tuple(a for a in us if a not in select.LIBRARY_PATHS)
        pick = select.choose(table, s["bytes"], dtype, "sum", deterministic=False,
                             handovers=frozenset(a for a in us if a in select.HANDOVERS), available=mine)
        fastest = min(us.values())
        ratio = us[pick] / fastest if pick in us else math.inf
        if ratio <= within:
            met += 1
        else:
            misses.append({"bytes": s["bytes"], "auto": pick, "fastest": min(us, key=lambda k: us[k]), "ratio": ratio})
    return {"sizes": len(sizes), "within": within, "met": met, "misses": misses}


def driver_version() -> str:
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:
        return "unknown"


def measure(run: Callable[[str, int, torch.dtype], float], algos: list[str], sizes: list[int],
            dtype: torch.dtype) -> list[tuple[int, str, dict[str, float]]]:
    out = []
    for nbytes in sizes:
        times = {a: run(a, nbytes, dtype) for a in algos}
        best = min(times, key=lambda a: times[a])
        out.append((nbytes, best, times))
        cells = "  ".join(f"{a}={t:.2f}" for a, t in times.items())
        print(f"{nbytes:>10} B  best {best:<18} {cells}", flush=True)
    return out


def _virtual_runner(ranks: int) -> tuple[Callable[[str, int, torch.dtype], float], list[str], str, int]:
    from . import VirtualCommunicator
    from .bench.timing import calls_for
    from .bench.virtual import rotating_sets, time_rotating

    comm = VirtualCommunicator(ranks)
    dev = comm.device

    def run(algo: str, nbytes: int, dtype: torch.dtype) -> float:
        n = max(1, nbytes // torch.tensor([], dtype=dtype).element_size())
        calls = calls_for(nbytes * ranks, 50)  # fewer calls per graph where every rank's message is large
        t = time_rotating(comm, algo, rotating_sets(ranks, n, dtype, dev, 4), calls=calls, replays=15, device=dev)
        comm.check()
        return t.stats.median

    # as on real ranks: never an algorithm whose correctness rests on an unproven hardware property
    return run, [a for a in comm.algorithms if not ALGORITHMS[a].rests_on], comm.gpu_name, comm.max_blocks


def _distributed_runner(max_bytes: int) -> tuple[Callable[[str, int, torch.dtype], float], list[str], str, int]:
    import torch.distributed as dist

    from . import Communicator
    from .bench.timing import time_calls

    if not dist.is_initialized():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl")
    # torch_twoshot is measured through sollat (input copied into its buffer), as `auto` runs it
    comm = Communicator(torch_twoshot_bytes=max_bytes)
    dev = comm.device

    def run(algo: str, nbytes: int, dtype: torch.dtype) -> float:
        if algo in select.HANDOVERS and not select.handover_serves(algo, dtype, "sum", nbytes):
            return float("inf")
        n = max(1, nbytes // torch.tensor([], dtype=dtype).element_size())
        xs = [torch.randn(n, device=dev).to(dtype) for _ in range(4)]
        outs = [torch.empty_like(x) for x in xs]
        if algo == NCCL:
            def call(i: int) -> None:
                dist.all_reduce(outs[i % 4])
        else:
            def call(i: int) -> None:
                comm.all_reduce(xs[i % 4], algo=algo, out=outs[i % 4])
        t = time_calls(call, calls=50, replays=15, device=dev, sync=dist.barrier)
        worst = torch.tensor([t.stats.median], device=dev)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # a collective is done when its last rank is
        return float(worst.item())

    # never an algorithm whose real-rank correctness rests on an unproven hardware property
    algos = [a for a in comm.algorithms if not ALGORITHMS[a].rests_on]
    return run, [*algos, NCCL, *(h for h in comm.handovers if h != NCCL)], comm.gpu_name, comm.max_blocks


def _sizes(text: str) -> list[int]:
    from .bench.sizes import parse_sizes

    try:
        return parse_sizes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parser() -> argparse.ArgumentParser:
    from .cli_args import PROG, Parser, int_range
    from .device.layout import MAX_RANKS

    p = Parser(prog=f"{PROG} tune", description=DESCRIPTION)
    p.add_argument("--ranks", type=int_range(2, MAX_RANKS), default=4,
                   help=f"virtual ranks when not under torchrun, 2..{MAX_RANKS} (default 4)")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"],
                   help="element type of the measured calls (default bfloat16)")
    p.add_argument("--sizes", type=_sizes, default=None,
                   help="byte sizes: a comma list and/or LO:HI[:FACTOR], units K/M (default 128 B .. 64 MiB under "
                        "torchrun, .. 16 MiB on virtual ranks, x2)")
    p.add_argument("--out", default=None, help="directory to write the table to (default: user cache)")
    p.add_argument("--json", default=None, metavar="PATH",
                   help="also write every measured time (per size and algorithm) to this JSON file")
    return p


def _nothing_measured(why: str) -> int:
    from .cli_args import PROG

    print(f"{PROG} tune: error: nothing could be measured: {why}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    if not torch.cuda.is_available():
        return _nothing_measured("no CUDA GPU is visible (torch.cuda.is_available() is False), so no table was "
                                 f"written; the built-in tables are in {select.TUNING_DIR}")
    distributed = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    sizes = a.sizes or (DEFAULT_SIZES_REAL if distributed else DEFAULT_SIZES)
    dtype = getattr(torch, a.dtype)
    run, algos, gpu, max_blocks = _distributed_runner(max(sizes)) if distributed else _virtual_runner(a.ranks)
    ranks = int(os.environ["WORLD_SIZE"]) if distributed else a.ranks
    results = measure(run, algos, sizes, dtype)
    unserved = [nb for nb, best, times in results if not math.isfinite(times[best])]
    if unserved:  # every rank sees the same times (the slowest rank's), so every rank stops here
        return _nothing_measured(f"no algorithm ran at {', '.join(f'{nb} B' for nb in unserved)} "
                                 f"({a.dtype}), so no table was written")
    rules = rules_from_winners([(nb, best) for nb, best, _ in results])
    driver = driver_version()
    how = (f"{ranks} GPUs under torchrun, NCCL included" if distributed else
           f"{ranks} virtual ranks on one GPU (they share its SMs and L2: this does not predict NVLink)")
    from .bench.env import git_commit

    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    command = " ".join(["python -m sollat tune", *(sys.argv[2:] if argv is None else argv)])
    note = (f"measured by `sollat tune` on {gpu} (driver {driver}), {how}, dtype {a.dtype}, max_blocks {max_blocks}, "
            f"commit {git_commit()}, date {date}, command `{command}`")
    if distributed and int(os.environ["RANK"]) != 0:
        return 0
    if a.json:
        write_measurements(Path(a.json), {"card": gpu, "ranks": ranks, "mode": "real" if distributed else "virtual",
                                          "dtype": a.dtype, "date": date, "commit": git_commit(), "command": command,
                                          "sizes": [{"bytes": nb, "best": best, "us": times}
                                                    for nb, best, times in results]})
    path = write_result(gpu, ranks, rules, distributed=distributed, note=note, out=Path(a.out) if a.out else None)
    print(f"sollat tune: wrote {path}")
    print(json.dumps([{"max_bytes": r.max_bytes, "algorithm": r.algorithm} for r in rules]))
    return 0


__all__ = ["NCCL", "allreduce_goal", "main", "rules_from_winners", "table_path", "write_measurements", "write_result"]
