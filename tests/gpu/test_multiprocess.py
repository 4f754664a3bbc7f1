"""Real ranks (one process per GPU under torchrun, sollat.Communicator): the suite in mp_suite.py
on every visible GPU, then its compile-skew section in a second launch with an empty kernel cache.
Every rank must print PASS for every section of its PLAN and SUMMARY failed=0. Skips with fewer
than 2 GPUs."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.multigpu, pytest.mark.slow]

ROOT = Path(__file__).parents[2]
SUITE = Path(__file__).with_name("mp_suite.py")
# never let a child use NVLink multicast
SAFETY = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
MAIN_TIMEOUT_S = 1500
SKEW_TIMEOUT_S = 400

needs_two_gpus = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                    reason="needs >= 2 GPUs")


def launch(nproc: int, args: list[str], extra_env: dict[str, str], timeout_s: int) -> tuple[int, str]:
    """torchrun the suite; (exit status, stdout + stderr). The whole process group is killed on timeout."""
    env = dict(os.environ)
    env.update(extra_env)
    env.update(SAFETY)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", str(SUITE), *args]
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        return -9, (out or "") + f"\n[launcher] killed after {timeout_s} s"
    return p.returncode, out


def assert_all_passed(rc: int, out: str, nproc: int) -> list[str]:
    """Every rank printed its PLAN, PASS for each planned section, SUMMARY failed=0; exit 0."""
    fails = "\n".join(line for line in out.splitlines() if " FAIL " in line or " fail: " in line)
    tail = f"FAIL lines:\n{fails[-4000:]}\n--- last 6000 characters of output ---\n{out[-6000:]}"
    plan = re.search(r"RANK 0 PLAN (\S+)", out)
    assert plan is not None, tail
    sections = plan.group(1).split(",")
    for r in range(nproc):
        assert f"RANK {r} PLAN {plan.group(1)} " in out, f"rank {r} has no (or another) PLAN\n{tail}"
        missing = [sec for sec in sections if f"RANK {r} PASS {sec} (" not in out]
        assert not missing, f"rank {r}: no PASS for {missing}\n{tail}"
        assert re.search(rf"RANK {r} SUMMARY passed={len(sections)} failed=0\b", out), f"rank {r}: SUMMARY\n{tail}"
    assert rc == 0, f"torchrun exit status {rc}\n{tail}"
    return sections


@needs_two_gpus
def test_real_rank_suite() -> None:
    n = torch.cuda.device_count()
    rc, out = launch(n, [], {}, MAIN_TIMEOUT_S)
    assert_all_passed(rc, out, n)


@needs_two_gpus
def test_real_rank_compile_skew(tmp_path: Path) -> None:
    n = torch.cuda.device_count()
    cache = tmp_path / "empty-cache"
    cache.mkdir()
    rc, out = launch(n, ["--only", "skew"], {"SOLLAT_CACHE_DIR": str(cache), "SOLLAT_MP_SECTIONS": "",
                                             "SOLLAT_MP_SKIP": ""}, SKEW_TIMEOUT_S)
    assert assert_all_passed(rc, out, n) == ["skew"]
