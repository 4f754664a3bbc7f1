"""The peers in the sweep and the child processes that measure them.

NCCL reads its environment (NCCL_ALGO, NCCL_PROTO...) once per process, so each peer setting
runs in its own child process: under torchrun every rank starts one child per job, the
children form their own process group (fresh port, same MASTER_ADDR) and run ``child.py``,
which times exactly like the sollat rows and writes rows as JSON. The runner that starts a
child is a parameter, so the orchestration is tested on the CPU with a fake one.

Peers:
* ``nccl``: torch.distributed all_reduce with NCCL's own choice, then Ring and Tree with each
  of LL, LL128 and Simple as separate rows (NCCL_ALGO / NCCL_PROTO in the child's env);
* ``nccl-window``: NCCL on buffers registered as a symmetric window (torch symmetric memory,
  NCCL backend), where NCCL 2.28 can choose its symmetric-memory kernels;
* ``torch-symm``: ``torch.ops.symm_mem.one_shot_all_reduce`` and ``two_shot_all_reduce_``
  (CUDA backend); at world size 1 it runs on one GPU and is shown as a reference row.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .env import SAFETY_ENV
from .results import ERROR, SKIPPED, Row

NEEDS_2_GPUS = "needs >= 2 GPUs (virtual ranks share one GPU, and NCCL allows one rank per GPU)"
NO_TREE_AT_2 = "NCCL has no Tree algorithm at 2 ranks"
# What NCCL says (as its last error, and as a WARN) when NCCL_ALGO / NCCL_PROTO ask for something it
# cannot build here: "no algorithm/protocol available for function AllReduce with datatype ...".
NCCL_UNAVAILABLE_TEXT = "no algorithm/protocol available"


@dataclass(frozen=True)
class PeerSpec:
    name: str  # key used by --peers
    impl: str  # Row.impl of its rows
    algos: tuple[str, ...]  # Row.algo values it produces
    kind: str  # what the child runs: "nccl", "nccl-window", "torch-symm"
    env: tuple[tuple[str, str], ...] = ()  # NCCL_ALGO / NCCL_PROTO...
    min_world: int = 2

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)


def _nccl(algo: str, proto: str) -> PeerSpec:
    return PeerSpec(f"nccl-{algo.lower()}-{proto.lower()}", "nccl", (f"{algo}/{proto}",), "nccl",
                    (("NCCL_ALGO", algo), ("NCCL_PROTO", proto)))


PEERS: tuple[PeerSpec, ...] = (
    PeerSpec("nccl", "nccl", ("default",), "nccl"),
    *(_nccl(a, p) for a in ("Ring", "Tree") for p in ("LL", "LL128", "Simple")),
    PeerSpec("nccl-window", "nccl-window", ("default",), "nccl-window"),
    PeerSpec("torch-symm", "torch-symm", ("one_shot", "two_shot"), "torch-symm", min_world=1),
)
PEER_NAMES = tuple(p.name for p in PEERS)


def select_peers(spec: str | None) -> list[PeerSpec]:
    """``--peers``: 'all' (default), 'none', or a comma list of names (a prefix like 'nccl-ring' works)."""
    if spec is None or spec == "all":
        return list(PEERS)
    if spec in ("none", ""):
        return []
    out: list[PeerSpec] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        hits = [p for p in PEERS if p.name == part] or [p for p in PEERS if p.name.startswith(part)]
        if not hits:
            raise ValueError(f"unknown peer {part!r}; known: {', '.join(PEER_NAMES)}")
        out += [h for h in hits if h not in out]
    return out


@dataclass
class ChildJob:
    """Everything a child needs, written as JSON next to where it writes its result."""

    peer: str
    kind: str
    impl: str
    algos: list[str]
    env: dict[str, str]
    world_size: int
    sizes: list[int]
    dtypes: list[str]
    replays: int
    warmup: int
    max_calls: int
    max_sets: int = 4

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ChildJob:
        return cls(**json.loads(text))


@dataclass
class ChildOutcome:
    returncode: int
    output_tail: str = ""
    result: dict[str, Any] | None = None  # what the child wrote (rank 0: {"rows": [...], ...})


class Runner(Protocol):
    def __call__(self, job: ChildJob, env: dict[str, str], timeout_s: float) -> ChildOutcome: ...


@dataclass
class Placement:
    """Where this parent sits and how its ranks talk (a torchrun job, or one process)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: str = "127.0.0.1"
    all_gather: Callable[[Any], list[Any]] = field(default=lambda x: [x])
    broadcast: Callable[[Any], Any] = field(default=lambda x: x)


def free_port(host: str = "") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, 0))
        return int(s.getsockname()[1])


# Variables a child must not inherit: the NCCL choices it sets itself (so "default" really is
# NCCL's default) and torchrun's agent store (the child group hosts its own store).
STRIP_VARS = ("NCCL_ALGO", "NCCL_PROTO", "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK")


def child_env(base: Mapping[str, str], job: ChildJob, where: Placement, port: int) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k not in STRIP_VARS}
    env.update(SAFETY_ENV)
    env.update(job.env)
    env.update({
        "RANK": str(where.rank), "WORLD_SIZE": str(where.world_size), "LOCAL_RANK": str(where.local_rank),
        "LOCAL_WORLD_SIZE": str(where.local_world_size), "MASTER_ADDR": where.master_addr,
        "MASTER_PORT": str(port),
    })
    return env


def unavailable_up_front(p: PeerSpec, world_size: int) -> str | None:
    """Why NCCL cannot run ``p`` at ``world_size`` ranks, known without trying; None if it may."""
    if world_size == 2 and p.env_dict.get("NCCL_ALGO", "").lower() == "tree":
        return NO_TREE_AT_2
    return None


def nccl_unavailable(env: Mapping[str, str], text: str, world_size: int) -> str | None:
    """A short reason when ``text`` (an exception or a child's output) is NCCL refusing the
    NCCL_ALGO / NCCL_PROTO it was asked for; None for every other failure, which stays an error."""
    wanted = "/".join(env[k] for k in ("NCCL_ALGO", "NCCL_PROTO") if env.get(k))
    if not wanted or NCCL_UNAVAILABLE_TEXT not in text.lower():
        return None
    return f"NCCL has no {wanted} AllReduce at {world_size} ranks here"


def _skipped_rows(p: PeerSpec, ranks: Sequence[int], dtypes: Sequence[str], sizes: Sequence[int | None],
                  reason: str) -> list[Row]:
    return [Row(p.impl, algo, R, dt, n, status=SKIPPED, reason=reason, env=p.env_dict)
            for R in ranks for algo in p.algos for dt in dtypes for n in sizes]


def make_jobs(peers: Sequence[PeerSpec], *, world_size: int, sizes: list[int], dtypes: list[str], replays: int,
              warmup: int, max_calls: int, max_sets: int = 4,
              skip_ranks: Sequence[int] | None = None) -> tuple[list[ChildJob], list[Row]]:
    """Jobs for the peers that can run at ``world_size``; for the others skipped rows saying why:
    one per algorithm, dtype and rank count in ``skip_ranks`` (the tables they belong to) for a
    world too small, and one per size (shown as ``n/a``) where NCCL has no such algorithm."""
    jobs: list[ChildJob] = []
    skipped: list[Row] = []
    for p in peers:
        if world_size < p.min_world:
            skipped += _skipped_rows(p, skip_ranks or [world_size], dtypes, [None], NEEDS_2_GPUS)
            continue
        why = unavailable_up_front(p, world_size)
        if why is not None:
            skipped += _skipped_rows(p, [world_size], dtypes, sizes, why)
            continue
        jobs.append(ChildJob(p.name, p.kind, p.impl, list(p.algos), p.env_dict, world_size, list(sizes),
                             list(dtypes), replays, warmup, max_calls, max_sets))
    return jobs, skipped


def _tail(text: str, n: int = 400) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    last = " | ".join(lines[-3:])
    return last[-n:]


def _failure_rows(job: ChildJob, reason: str) -> list[Row]:
    return [Row(job.impl, algo, job.world_size, dt, None, status=ERROR, reason=reason, env=dict(job.env))
            for algo in job.algos for dt in job.dtypes]


def _unavailable_rows(job: ChildJob, reason: str) -> list[Row]:
    return [Row(job.impl, algo, job.world_size, dt, n, status=SKIPPED, reason=reason, env=dict(job.env))
            for algo in job.algos for dt in job.dtypes for n in job.sizes]


def _outcome_rows(job: ChildJob, outcome: ChildOutcome, codes: Sequence[tuple[int, str, str]]) -> list[Row]:
    """Rank 0's rows of one job from every rank's (exit code, output tail, n/a reason)."""
    failed = [(r, c, t, na) for r, (c, t, na) in enumerate(codes) if c != 0]
    unavailable = [na for _, _, _, na in failed if na]
    if unavailable:  # NCCL has no such algorithm here: n/a, not an error
        return _unavailable_rows(job, unavailable[0])
    if failed:
        r, c, t, _ = failed[0]
        what = "timed out" if c in (124, -9) else f"exited with code {c}"
        return _failure_rows(job, f"child of rank {r} {what}: {t}" if t else f"child of rank {r} {what}")
    if not outcome.result or "rows" not in outcome.result:
        return _failure_rows(job, "child wrote no result")
    return [Row.from_dict(d) for d in outcome.result["rows"]]


def run_jobs(jobs: Sequence[ChildJob], runner: Runner, where: Placement, *, timeout_s: float,
             environ: Mapping[str, str] | None = None, progress: Any = None) -> list[Row]:
    """Run every job on every rank (one child per rank per job, all ranks in step); rank 0
    returns the rows (from its child's result, or one error row per algo and dtype saying why, or
    n/a rows when a child failed because NCCL has no algorithm/protocol it was asked for)."""
    base = dict(os.environ if environ is None else environ)
    rows: list[Row] = []
    for job in jobs:
        port = where.broadcast(free_port() if where.rank == 0 else 0)
        env = child_env(base, job, where, port)
        try:
            outcome = runner(job, env, timeout_s)
        except Exception as exc:
            outcome = ChildOutcome(-1, f"could not start the child: {type(exc).__name__}: {exc}")
        na = None if outcome.returncode == 0 else nccl_unavailable(job.env, outcome.output_tail, job.world_size)
        codes = where.all_gather((outcome.returncode, _tail(outcome.output_tail), na or ""))
        if where.rank == 0:
            rows += _outcome_rows(job, outcome, codes)
        if progress is not None:
            progress.advance(note=job.peer)
    return rows


class SubprocessRunner:
    """Starts ``python -m sollat.bench.child JOB.json RESULT.json`` with the given environment."""

    def __init__(self, python: str | None = None, workdir: str | Path | None = None) -> None:
        self.python = python or sys.executable
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="sollat-bench-"))

    def __call__(self, job: ChildJob, env: dict[str, str], timeout_s: float) -> ChildOutcome:
        rank = env.get("RANK", "0")
        job_path = self.workdir / f"{job.peer}-rank{rank}-job.json"
        res_path = self.workdir / f"{job.peer}-rank{rank}-result.json"
        job_path.write_text(job.to_json())
        res_path.unlink(missing_ok=True)
        env = dict(env)
        root = str(Path(__file__).resolve().parents[2])  # the child imports this same sollat
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        try:
            proc = subprocess.run([self.python, "-m", "sollat.bench.child", str(job_path), str(res_path)], env=env,
                                  capture_output=True, text=True, timeout=timeout_s)
            code, out = proc.returncode, (proc.stdout or "") + (proc.stderr or "")
        except subprocess.TimeoutExpired as exc:  # subprocess.run kills the child it started
            out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            return ChildOutcome(124, out + f"\n(killed after {timeout_s:.0f} s)")
        result = json.loads(res_path.read_text()) if res_path.exists() else None
        return ChildOutcome(code, out, result)


def torch_placement() -> Placement:
    """The Placement of this process in an initialised torch.distributed job."""
    import torch.distributed as dist

    from .env import dist_info

    info = dist_info()
    assert info is not None and dist.is_initialized()

    def all_gather(x: Any) -> list[Any]:
        out: list[Any] = [None] * info.world_size
        dist.all_gather_object(out, x)
        return out

    def broadcast(x: Any) -> Any:
        box = [x]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    return Placement(info.rank, info.world_size, info.local_rank, info.local_world_size, info.master_addr,
                     all_gather, broadcast)
