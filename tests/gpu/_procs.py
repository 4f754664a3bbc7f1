"""Real ranks as processes: the launcher the multi-process GPU tests share, and the set-up each
child runs.

With one GPU per rank, a child is one process per GPU over NCCL. With fewer GPUs than ranks, all
N processes share GPU 0 over a gloo process group (NCCL refuses two ranks on one GPU) with
``TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1`` (torch's symmetric memory refuses ranks on one
device without it). That mode proves processes, IPC through symmetric memory, faults seen by
other processes, stream and call ordering; it never measures speed: the processes' kernels
time-slice on the GPU (docs/testing.md).

Used by the launcher (pytest) and imported by the child scripts run under torchrun (as
``_procs`` from this folder).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parents[2]
#: Never let a child use NVLink multicast.
SAFETY = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
OVERLAP_ENV = "TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES"
#: Set by the launcher: the children share GPU 0 (fewer GPUs than ranks).
SHARED_ENV = "SOLLAT_TEST_SHARED_GPU"
#: Set by the launcher: the folder where each rank writes its verdict, ``rank<r>.json`` (RankResult).
RESULTS_ENV = "SOLLAT_TEST_RESULTS"
#: Failures of one section a result file keeps (the rest are counted).
MAX_FAILURES_KEPT = 20


def emit(line: str) -> None:
    """One line of a child's output in one write (the ranks share the pipe)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Sections:
    """A child's sections: ``section(name, fn)`` runs one and prints ``RANK r PASS name (T s...)``
    or ``RANK r FAIL name: problems`` (what the launcher reads); ``expect`` records a problem and
    lets the section go on; an exception ends the section as a problem."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.passed = self.failed = 0
        self.problems: list[str] = []

    def progress(self) -> str:
        """What a PASS line adds after its time (", N calls so far" in a subclass that counts)."""
        return ""

    def section(self, name: str, fn: Callable[[], None]) -> None:
        self.problems = []
        t0 = time.monotonic()
        try:
            fn()
        except Exception as exc:
            where = traceback.extract_tb(exc.__traceback__)[-1]
            self.problems.append(f"{type(exc).__name__}: {exc} (at {where.filename}:{where.lineno})")
        dt = time.monotonic() - t0
        if self.problems:
            self.failed += 1
            emit(f"RANK {self.rank} FAIL {name}: {'; '.join(self.problems)[:2000]}")
        else:
            self.passed += 1
            emit(f"RANK {self.rank} PASS {name} ({dt:.1f} s{self.progress()})")

    def expect(self, ok: bool, what: str) -> bool:
        if not ok:
            self.problems.append(what)
        return ok


def shares_gpu(nproc: int, gpus: int) -> bool:
    """Whether ``nproc`` ranks must share GPU 0: fewer GPUs than ranks."""
    return gpus < nproc


#: The world size the default test run launches where ranks share a GPU: odd, so that every order of
#: summation is not the same (at 2 ranks a + b == b + a), and the fewest peers that still are many.
#: The other world sizes run with ``-m ''`` (marked slow: each launch takes minutes there).
DEFAULT_SHARED_WORLD = 3


def world_param(nproc: int, gpus: int) -> object:
    """``nproc`` as a pytest parameter: marked slow where its ranks would share a GPU and it is not
    DEFAULT_SHARED_WORLD."""
    import pytest

    slow = shares_gpu(nproc, gpus) and nproc != DEFAULT_SHARED_WORLD
    return pytest.param(nproc, marks=[pytest.mark.slow] if slow else [])


def child_env(nproc: int, gpus: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a launch: this one, the safety variables, the checkout on PYTHONPATH,
    and in shared mode the variables that let N processes be ranks on one GPU."""
    env = dict(os.environ)
    env.update(extra or {})
    env.update(SAFETY)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    if shares_gpu(nproc, gpus):
        env[OVERLAP_ENV] = "1"
        env[SHARED_ENV] = "1"
    else:
        env.pop(SHARED_ENV, None)
    return env


def launch(script: Path, nproc: int, args: list[str], env: dict[str, str], timeout_s: float) -> tuple[int, str]:
    """torchrun ``script`` on ``nproc`` processes; (exit status, stdout + stderr). The whole
    process group is killed on timeout (status -9, the output so far kept)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           str(script), *args]
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        return -9, (out or "") + f"\n[launcher] killed after {timeout_s:.0f} s"
    return p.returncode, out


def _assert_from_output(rc: int, out: str, nproc: int, sections: list[str] | None = None) -> list[str]:
    """A launch's verdict from its output: every rank printed its PLAN (``sections``, or rank 0's
    when None), PASS for each planned section and SUMMARY failed=0, and the launch exited 0.
    Returns the sections."""
    fails = "\n".join(line for line in out.splitlines() if " FAIL " in line or " fail: " in line)
    tail = f"FAIL lines:\n{fails[-4000:]}\n--- last 6000 characters of output ---\n{out[-6000:]}"
    if sections is None:
        plan = re.search(r"RANK 0 PLAN (\S+)", out)
        assert plan is not None, tail
        sections = plan.group(1).split(",")
    planned = ",".join(sections)
    for r in range(nproc):
        assert f"RANK {r} PLAN {planned} " in out, f"rank {r} has no (or another) PLAN\n{tail}"
        missing = [sec for sec in sections if f"RANK {r} PASS {sec} (" not in out]
        assert not missing, f"rank {r}: no PASS for {missing}\n{tail}"
        assert re.search(rf"RANK {r} SUMMARY passed={len(sections)} failed=0\b", out), f"rank {r}: SUMMARY\n{tail}"
    assert rc == 0, f"torchrun exit status {rc}\n{tail}"
    return sections


def result_path(folder: str | Path, rank: int) -> Path:
    return Path(folder) / f"rank{rank}.json"


class RankResult:
    """One rank's verdict, as a JSON file the launcher reads (``read_results``, ``verdict``),
    rewritten whole (a temporary file, then a rename) after every change, so that what a rank that
    died or hung had finished is on disk. No folder (``RESULTS_ENV`` unset, e.g. a launch by hand):
    nothing is written.

    The file: ``rank``; ``plan`` (the sections it will run, None before it knows); ``skipped``
    ("name: why"); ``sections``: name -> {``passed``, ``failures`` (the first MAX_FAILURES_KEPT),
    ``failure_count``, ``seconds``}; ``errors`` (failures outside a section: set-up, an abort, a
    hang); ``summary``: {``passed``, ``failed``} once the rank finished, else None."""

    def __init__(self, rank: int, folder: str | None = None) -> None:
        self.folder = folder if folder is not None else os.environ.get(RESULTS_ENV) or None
        self.data: dict[str, Any] = {"rank": rank, "plan": None, "skipped": [], "sections": {}, "errors": [],
                                     "summary": None}
        self._lock = threading.Lock()  # a watchdog thread may write while the rank's main thread does

    def plan(self, sections: list[str], skipped: list[str]) -> None:
        self.data["plan"], self.data["skipped"] = list(sections), list(skipped)
        self._write()

    def section(self, name: str, failures: list[str], seconds: float) -> None:
        self.data["sections"][name] = {"passed": not failures, "failures": failures[:MAX_FAILURES_KEPT],
                                       "failure_count": len(failures), "seconds": round(seconds, 3)}
        self._write()

    def error(self, message: str) -> None:
        self.data["errors"].append(message)
        self._write()

    def finish(self, passed: int, failed: int) -> None:
        self.data["summary"] = {"passed": passed, "failed": failed}
        self._write()

    def _write(self) -> None:
        if self.folder is None:
            return
        path = result_path(self.folder, self.data["rank"])
        with self._lock:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data, indent=1))
            os.replace(tmp, path)


def read_results(folder: str | Path, nproc: int) -> list[dict[str, Any] | None]:
    """Every rank's result file (None where a rank wrote none, or one that is not JSON)."""
    out: list[dict[str, Any] | None] = []
    for r in range(nproc):
        try:
            out.append(json.loads(result_path(folder, r).read_text()))
        except (OSError, ValueError):
            out.append(None)
    return out


def verdict(results: list[dict[str, Any] | None], sections: list[str] | None = None) -> tuple[list[str], list[str]]:
    """(the planned sections, what is wrong): every rank wrote its file, planned ``sections`` (or
    rank 0's plan when None), passed each of them, has no error outside a section, and finished with
    a summary of that many passed and none failed. Empty "what is wrong": every rank passed."""
    problems: list[str] = []
    if sections is None:
        first = results[0] if results else None
        sections = list(first["plan"]) if first is not None and first.get("plan") is not None else []
        if not sections:
            problems.append("rank 0 wrote no plan")
    for r, res in enumerate(results):
        if res is None:
            problems.append(f"rank {r}: no result file")
            continue
        if res.get("plan") != sections:
            problems.append(f"rank {r}: plan {res.get('plan')} is not {sections}")
        for err in res.get("errors", []):
            problems.append(f"rank {r}: {err}")
        done = res.get("sections", {})
        for name in sections:
            sec = done.get(name)
            if sec is None:
                problems.append(f"rank {r}: section {name} has no result")
            elif not sec.get("passed"):
                shown = "; ".join(sec.get("failures", [])[:3])
                more = sec.get("failure_count", 0) - min(3, len(sec.get("failures", [])))
                problems.append(f"rank {r}: section {name} failed: {shown}" + (f" (+{more} more)" if more > 0 else ""))
        summary = res.get("summary")
        if summary != {"passed": len(sections), "failed": 0}:
            problems.append(f"rank {r}: summary {summary} (the rank did not finish, or not every section passed)")
    return sections, problems


def assert_every_rank_passed(rc: int, out: str, nproc: int, sections: list[str] | None = None,
                             results: str | Path | None = None) -> list[str]:
    """A launch's verdict: with ``results`` (the folder of RESULTS_ENV), from every rank's result
    file (``verdict``); without, from the output (every rank printed its PLAN, PASS for each planned
    section and SUMMARY failed=0); and the launch exited 0. Returns the sections."""
    if results is None:
        return _assert_from_output(rc, out, nproc, sections)
    planned, problems = verdict(read_results(results, nproc), sections)
    fails = "\n".join(line for line in out.splitlines() if " FAIL " in line or " fail: " in line)
    tail = f"FAIL lines:\n{fails[-4000:]}\n--- last 6000 characters of output ---\n{out[-6000:]}"
    assert not problems, "\n".join(problems[:40]) + "\n" + tail
    assert rc == 0, f"torchrun exit status {rc}\n{tail}"
    return planned


def init_ranks(timeout_s: float) -> tuple[int, int, object, bool]:
    """In a child: the process group and this rank's device. Returns (rank, world size, device,
    shared). Shared (the launcher's SHARED_ENV): every rank on GPU 0, a gloo group; else rank r on
    GPU LOCAL_RANK, NCCL. Raises if the safety variables are not set."""
    import torch
    import torch.distributed as dist

    for var, want in SAFETY.items():
        if os.environ.get(var) != want:
            raise RuntimeError(f"{var} must be {want} (NVLink multicast stays off)")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    shared = os.environ.get(SHARED_ENV) == "1"
    dev = torch.device("cuda", 0 if shared else local)
    torch.cuda.set_device(dev)
    if shared:
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    else:
        dist.init_process_group("nccl", device_id=dev, timeout=timedelta(seconds=timeout_s))
    return rank, world, dev, shared


def start_child(store_prefix: str, watchdog_s: float) -> tuple[int, int, Any, bool, Any] | None:
    """A child's start: ``init_ranks`` (on failure the FAIL and SUMMARY lines the launcher reads,
    and None), a watchdog that ends the process after ``watchdog_s`` (faulthandler needs no GIL, so
    a hang anywhere ends there), and a store under ``store_prefix``. Returns (rank, world size,
    device, shared, store)."""
    import faulthandler

    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0"))
    try:
        rank, world, dev, shared = init_ranks(600.0)
    except RuntimeError as exc:
        emit(f"RANK {rank} FAIL init: {exc}")
        emit(f"RANK {rank} SUMMARY passed=0 failed=1")
        return None
    faulthandler.dump_traceback_later(watchdog_s, exit=True)
    store = dist.PrefixStore(store_prefix, dist.distributed_c10d._get_default_store())
    return rank, world, dev, shared, store
