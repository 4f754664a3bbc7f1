"""Child-process orchestration of the peers (with fake runners) and the sollat sweep loop (with a
fake target): what each child gets in its environment and how failures become rows."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from sollat.bench import child, peers, sweep
from sollat.bench.env import SAFETY_ENV, dist_info
from sollat.bench.peers import (
    ChildJob,
    ChildOutcome,
    Placement,
    SubprocessRunner,
    make_jobs,
    run_jobs,
    select_peers,
)
from sollat.bench.results import Row
from sollat.bench.table import format_bench
from sollat.bench.timing import GraphTiming, calls_for, sets_for


def _jobs(world: int, names: str = "all", skip_ranks: list[int] | None = None) -> tuple[list[ChildJob], list[Row]]:
    return make_jobs(select_peers(names), world_size=world, sizes=[4, 1024], dtypes=["float32", "bfloat16"],
                     replays=3, warmup=1, max_calls=10, skip_ranks=skip_ranks)


class FakeRunner:
    """Records what it was asked to run; answers with rows shaped like a real child's."""

    def __init__(self, fail: dict[str, ChildOutcome] | None = None) -> None:
        self.calls: list[tuple[ChildJob, dict[str, str], float]] = []
        self.fail = fail or {}

    def __call__(self, job: ChildJob, env: dict[str, str], timeout_s: float) -> ChildOutcome:
        self.calls.append((job, env, timeout_s))
        if job.peer in self.fail:
            return self.fail[job.peer]
        rows = [Row(job.impl, a, job.world_size, dt, n, median_us=5.0, env=job.env).to_dict()
                for a in job.algos for dt in job.dtypes for n in job.sizes]
        return ChildOutcome(0, "", {"rows": rows})


def test_peer_catalogue() -> None:
    names = [p.name for p in peers.PEERS]
    assert names[0] == "nccl"
    for algo in ("ring", "tree"):
        for proto in ("ll", "ll128", "simple"):
            assert f"nccl-{algo}-{proto}" in names
    assert "nccl-window" in names and "torch-symm" in names
    ring_ll = select_peers("nccl-ring-ll")[0]
    assert ring_ll.env_dict == {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"} and ring_ll.algos == ("Ring/LL",)


def test_virtual_mode_runs_only_world_size_1_peers() -> None:
    jobs, skipped = _jobs(1, skip_ranks=[2, 4, 8])
    assert [j.peer for j in jobs] == ["torch-symm"]
    assert jobs[0].algos == ["one_shot", "two_shot"] and jobs[0].world_size == 1
    # every NCCL row appears, for every rank count and dtype, with the reason
    assert {r.ranks for r in skipped} == {2, 4, 8}
    assert all(r.status == "skipped" and "needs >= 2 GPUs" in r.reason and r.nbytes is None for r in skipped)
    assert len(skipped) == 3 * 2 * (1 + 6 + 1)  # ranks x dtypes x (default + 6 algo/proto + window)


def test_each_child_gets_its_own_nccl_environment() -> None:
    jobs, skipped = _jobs(4)
    assert not skipped and len(jobs) == len(peers.PEERS)
    runner = FakeRunner()
    base = {"PATH": "/bin", "NCCL_ALGO": "Tree", "NCCL_PROTO": "LL", "TORCHELASTIC_USE_AGENT_STORE": "True",
            "NCCL_NVLS_ENABLE": "1"}
    ports = iter(range(30000, 30100))
    where = Placement(rank=0, world_size=4, local_rank=0, local_world_size=4, master_addr="10.0.0.1",
                      all_gather=lambda x: [x, (0, "", ""), (0, "", ""), (0, "", "")], broadcast=lambda x: next(ports))
    rows = run_jobs(jobs, runner, where, timeout_s=42.0, environ=base)
    assert len(runner.calls) == len(jobs)
    seen_ports = set()
    for job, env, timeout in runner.calls:
        assert timeout == 42.0
        for k, v in SAFETY_ENV.items():
            assert env[k] == v  # forced, even over an inherited NCCL_NVLS_ENABLE=1
        assert "TORCHELASTIC_USE_AGENT_STORE" not in env
        assert env["RANK"] == "0" and env["WORLD_SIZE"] == "4" and env["LOCAL_RANK"] == "0"
        assert env["MASTER_ADDR"] == "10.0.0.1" and env["PATH"] == "/bin"
        seen_ports.add(env["MASTER_PORT"])
        if job.peer in ("nccl", "nccl-window", "torch-symm"):
            assert "NCCL_ALGO" not in env and "NCCL_PROTO" not in env  # NCCL's own choice, not the inherited one
        else:
            algo, proto = job.algos[0].split("/")
            assert env["NCCL_ALGO"] == algo and env["NCCL_PROTO"] == proto
    assert len(seen_ports) == len(jobs)  # a fresh port per job
    labels = {r.label for r in rows}
    assert {"nccl", "nccl Ring/LL", "nccl Tree/LL128", "nccl symmetric", "torch symm_mem one_shot"} <= labels
    assert len(rows) == sum(len(j.algos) * 2 * 2 for j in jobs)


def test_failures_become_rows_with_reasons() -> None:
    jobs, _ = _jobs(4, "nccl,nccl-tree-ll,torch-symm")
    runner = FakeRunner({
        "nccl-tree-ll": ChildOutcome(1, "Traceback ...\nRuntimeError: NCCL error: invalid usage\n"),
        "torch-symm": ChildOutcome(124, "(killed after 5 s)"),
    })
    rows = run_jobs(jobs, runner, Placement(world_size=1), timeout_s=5.0)
    tree = [r for r in rows if r.algo == "Tree/LL"]
    assert len(tree) == 2 and all(r.status == "error" and r.nbytes is None for r in tree)
    assert "exited with code 1" in tree[0].reason and "invalid usage" in tree[0].reason
    symm = [r for r in rows if r.impl == "torch-symm"]
    assert symm and all("timed out" in r.reason for r in symm)
    assert all(r.ok for r in rows if r.impl == "nccl" and r.algo == "default")


def test_a_failure_on_another_rank_is_reported_by_rank_0() -> None:
    jobs, _ = _jobs(2, "nccl")
    where = Placement(rank=0, world_size=2, all_gather=lambda x: [x, (3, "segfault", "")], broadcast=lambda x: x)
    rows = run_jobs(jobs, FakeRunner(), where, timeout_s=1.0)
    assert rows and all(r.status == "error" and "rank 1" in r.reason and "segfault" in r.reason for r in rows)


# What torch raises when NCCL_ALGO / NCCL_PROTO ask for something NCCL cannot build (the NCCL part
# after torch's, past the 300 characters a row reason keeps).
NCCL_NO_ALGO = ("DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3690, "
                "invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.27.5\n"
                "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\nLast error:\n"
                "Error : no algorithm/protocol available for function AllReduce with datatype ncclFloat32. "
                "NCCL_ALGO was set to Tree. NCCL_PROTO was set to LL.")


def test_tree_is_na_at_2_ranks_without_starting_a_child() -> None:
    jobs, skipped = _jobs(2)
    assert not any(j.peer.startswith("nccl-tree") for j in jobs)
    assert {j.peer for j in jobs} == {p.name for p in peers.PEERS if not p.name.startswith("nccl-tree")}
    assert {(r.algo, r.dtype, r.nbytes) for r in skipped} == {
        (a, dt, n) for a in ("Tree/LL", "Tree/LL128", "Tree/Simple") for dt in ("float32", "bfloat16") for n in (4, 1024)}
    assert all(r.status == "skipped" and r.reason == "NCCL has no Tree algorithm at 2 ranks" and r.ranks == 2
               for r in skipped)
    jobs, skipped = _jobs(4)
    assert not skipped and "nccl-tree-ll" in {j.peer for j in jobs}


def test_a_child_refused_by_nccl_gives_na_rows_and_other_failures_stay_errors() -> None:
    jobs, _ = _jobs(4, "nccl,nccl-tree-ll,nccl-ring-simple")
    runner = FakeRunner({
        "nccl-tree-ll": ChildOutcome(1, f"NCCL WARN Error : no algorithm/protocol available ...\n{NCCL_NO_ALGO}\n"
                                        "torch.distributed.elastic...: exit 1"),
        "nccl-ring-simple": ChildOutcome(1, "RuntimeError: NCCL error: unhandled cuda error"),
    })
    rows = run_jobs(jobs, runner, Placement(), timeout_s=5.0)
    tree = [r for r in rows if r.algo == "Tree/LL"]
    assert {(r.dtype, r.nbytes) for r in tree} == {(dt, n) for dt in ("float32", "bfloat16") for n in (4, 1024)}
    assert all(r.status == "skipped" and r.reason == "NCCL has no Tree/LL AllReduce at 4 ranks here" for r in tree)
    ring = [r for r in rows if r.algo == "Ring/Simple"]
    assert ring and all(r.status == "error" and "unhandled cuda error" in r.reason for r in ring)
    # the same text from NCCL's own choice (nothing was forced) is an error, not n/a
    assert peers.nccl_unavailable({}, NCCL_NO_ALGO, 4) is None
    # refused on another rank: rank 0 reports n/a too
    where = Placement(rank=0, world_size=2, all_gather=lambda x: [x, (1, "x", "NCCL has no Tree/LL AllReduce")],
                      broadcast=lambda x: x)
    rows = run_jobs(jobs[1:2], FakeRunner(), where, timeout_s=1.0)
    assert rows and all(r.status == "skipped" and r.reason == "NCCL has no Tree/LL AllReduce" for r in rows)


@pytest.mark.parametrize("env,text,status", [
    ({"NCCL_ALGO": "Tree", "NCCL_PROTO": "LL"}, NCCL_NO_ALGO, "skipped"),
    ({"NCCL_ALGO": "Tree", "NCCL_PROTO": "LL"}, "NCCL error: unhandled system error", "error"),
    ({}, NCCL_NO_ALGO, "error"),
    ({}, "size must be a multiple of 16", "unsupported"),
], ids=["forced-and-refused", "forced-other-failure", "default-same-text", "refused-size"])
def test_child_row_status_of_a_failed_call(env: dict[str, str], text: str, status: str) -> None:
    job = ChildJob("p", "nccl", "nccl", ["Tree/LL"], env, 2, [4], ["float32"], 3, 1, 10)
    row = child.mark_failed(Row("nccl", "Tree/LL", 2, "float32", 4), RuntimeError(text), job, 2)
    assert row.status == status
    if status == "skipped":
        assert row.reason == "NCCL has no Tree/LL AllReduce at 2 ranks here"
    else:
        assert "RuntimeError" in row.reason and len(row.reason) <= 300


def test_table_shows_na_with_the_reason_once() -> None:
    jobs, skipped = _jobs(2, "nccl,nccl-tree-ll")
    rows = run_jobs(jobs, FakeRunner(), Placement(), timeout_s=1.0) + skipped
    text = format_bench({"ranks": [2], "dtypes": ["float32"], "mode": "torchrun"}, None, None, rows)
    header = next(ln for ln in text.splitlines() if ln.split()[:2] == ["#", "size"])
    assert "nccl Tree/LL" in header
    body = [ln for ln in text.splitlines() if ln.startswith("  ")]
    assert len(body) == 2 and all(ln.split()[-2:] == ["n/a", "nccl"] for ln in body), text
    assert text.count("# n/a nccl Tree/LL: NCCL has no Tree algorithm at 2 ranks") == 1
    assert "err" not in text


def test_other_ranks_return_no_rows() -> None:
    jobs, _ = _jobs(2, "nccl")
    where = Placement(rank=1, world_size=2, all_gather=lambda x: [(0, "", ""), x], broadcast=lambda x: 29999)
    runner = FakeRunner()
    assert run_jobs(jobs, runner, where, timeout_s=1.0) == []
    assert runner.calls[0][1]["RANK"] == "1" and runner.calls[0][1]["MASTER_PORT"] == "29999"


def test_child_job_json_round_trip() -> None:
    jobs, _ = _jobs(2)
    for j in jobs:
        assert ChildJob.from_json(j.to_json()) == j


def _fake_python(tmp_path: Path, body: str) -> str:
    script = tmp_path / "fake-python"
    script.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    script.chmod(0o755)
    return str(script)


def test_subprocess_runner_plumbing(tmp_path: Path) -> None:
    fake = _fake_python(tmp_path, """
        import json, os, sys
        assert sys.argv[1:3] == ["-m", "sollat.bench.child"], sys.argv
        job = json.load(open(sys.argv[3]))
        rows = [{"impl": job["impl"], "algo": a, "ranks": job["world_size"], "dtype": "float32", "nbytes": 4,
                 "median_us": float(os.environ["MASTER_PORT"])} for a in job["algos"]]
        json.dump({"rows": rows}, open(sys.argv[4], "w"))
        print("child done")
    """)
    jobs, _ = _jobs(1, "torch-symm")
    runner = SubprocessRunner(python=fake, workdir=tmp_path)
    out = runner(jobs[0], {"MASTER_PORT": "12345", "RANK": "0"}, timeout_s=60)
    assert out.returncode == 0 and "child done" in out.output_tail
    assert out.result is not None and [r["median_us"] for r in out.result["rows"]] == [12345.0, 12345.0]


def test_subprocess_runner_timeout_and_crash(tmp_path: Path) -> None:
    jobs, _ = _jobs(1, "torch-symm")
    slow = SubprocessRunner(python=_fake_python(tmp_path, "import time\ntime.sleep(30)\n"), workdir=tmp_path)
    out = slow(jobs[0], {}, timeout_s=1)
    assert out.returncode == 124 and out.result is None
    crash = SubprocessRunner(python=_fake_python(tmp_path, "import sys\nprint('boom', file=sys.stderr)\nsys.exit(3)\n"),
                             workdir=tmp_path)
    out = crash(jobs[0], {}, timeout_s=30)
    assert out.returncode == 3 and "boom" in out.output_tail
    rows = run_jobs(jobs, crash, Placement(), timeout_s=30)
    assert rows and all("code 3" in r.reason and "boom" in r.reason for r in rows)


def test_dist_info_reads_torchrun_env() -> None:
    assert dist_info({}) is None and dist_info({"WORLD_SIZE": "1"}) is None
    info = dist_info({"WORLD_SIZE": "4", "RANK": "2", "LOCAL_RANK": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
    assert info is not None and info.rank == 2 and info.world_size == 4 and info.master_addr == "h"


def test_calls_and_sets() -> None:
    assert calls_for(4) == 100 and calls_for(256 << 10) == 100
    assert calls_for(1 << 20) == 25 and calls_for(64 << 20) == 8 and calls_for(4, 50) == 50
    assert sets_for(1024) == 4 and sets_for(8 * (64 << 20)) == 4 and sets_for(1 << 31) == 2


# ---- the sweep loop, with a fake target and fake timings ------------------------------------

class FakeTarget:
    ranks = 2

    def __init__(self) -> None:
        self.recovered = 0
        self.calls: list[str] = []

    @property
    def algorithms(self) -> tuple[str, ...]:
        return ("oneshot_ll", "twoshot_ll")

    def selected(self, nbytes: int, dtype: str) -> str:
        return "oneshot_ll" if nbytes < 1024 else "twoshot_ll"

    def buffers(self, nbytes: int, dtype: str, n_sets: int) -> Any:
        return (nbytes, n_sets)

    def call(self, bufs: Any, i: int, algo: str) -> None:
        from sollat.errors import PeerTimeoutError, UnsupportedError

        self.calls.append(algo)
        if algo == "twoshot_ll" and bufs[0] == 4:
            raise UnsupportedError("all_reduce: too small for two-shot")
        if algo == "oneshot_ll" and bufs[0] == 1024:
            raise PeerTimeoutError("peer 1 did not deliver", rank=0, peer=1, slot=0, epoch=1)

    def check(self, bufs: Any, dtype: str, algo: str = "") -> str:
        return "ok"

    def finish(self) -> None:
        pass

    def recover(self) -> None:
        self.recovered += 1

    def sync(self) -> None:
        return None


def test_sweep_rows_statuses(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_time_calls(call, *, calls, replays, warmup=2, eager=2, sync=None, device=None):  # noqa: ANN001
        call(0)
        return GraphTiming([1.0 + 0.1 * i for i in range(replays)], calls, replays)

    monkeypatch.setattr(sweep, "time_calls", fake_time_calls)
    monkeypatch.setattr(sweep, "_recover", lambda t: (t.recover(), None)[1])
    target = FakeTarget()
    cfg = sweep.SweepConfig(sizes=[4, 1024], dtypes=["float32"], algos=None, replays=5, max_calls=10)
    rows = sweep.sweep_target(target, cfg)
    got = {(r.algo, r.nbytes): r for r in rows}
    assert set(got) == {(a, n) for a in ("oneshot_ll", "twoshot_ll", "auto") for n in (4, 1024)}
    assert got[("oneshot_ll", 4)].ok and got[("oneshot_ll", 4)].median_us == pytest.approx(1.2)
    assert got[("oneshot_ll", 4)].calls_per_graph == 10 and got[("oneshot_ll", 4)].check == "ok"
    assert got[("twoshot_ll", 4)].status == "unsupported" and "too small" in got[("twoshot_ll", 4)].reason
    assert got[("oneshot_ll", 1024)].status == "error" and "PeerTimeoutError" in got[("oneshot_ll", 1024)].reason
    assert target.recovered == 1  # the faulted communicator was reset
    assert got[("auto", 4)].selected == "oneshot_ll" and got[("auto", 1024)].selected == "twoshot_ll"


def test_sweep_unknown_algorithm_and_agreement(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sweep, "time_calls", lambda call, **k: GraphTiming([1.0, 2.0, 3.0], k["calls"], 3))
    monkeypatch.setattr(sweep, "_recover", lambda t: (t.recover(), None)[1])
    cfg = sweep.SweepConfig(sizes=[4], dtypes=["bfloat16"], algos=["oneshot_ll", "magic"], replays=3)
    # another rank failed: this rank reports it too (and all ranks take the same path)
    rows = sweep.sweep_target(FakeTarget(), cfg, agree=lambda x: [x, ("error", "PeerTimeoutError: x")],
                              gather=lambda v: [t * 2 for t in v])
    by = {r.algo: r for r in rows}
    assert by["magic"].status == "unsupported" and "no algorithm 'magic'" in by["magic"].reason
    assert by["oneshot_ll"].status == "error" and "on another rank" in by["oneshot_ll"].reason
    # an error elsewhere outranks "unsupported" here, so every rank recovers together
    row = Row("sollat", "x", 2, "float32", 4, status="unsupported", reason="too small")
    sweep._agree_status(row, [("unsupported", "too small"), ("error", "boom")])
    assert row.status == "error" and "boom" in row.reason
    rows = sweep.sweep_target(FakeTarget(), cfg, agree=lambda x: [x, x], gather=lambda v: [t * 2 for t in v])
    assert {r.algo: r for r in rows}["oneshot_ll"].median_us == pytest.approx(4.0)  # the slowest rank's values


def test_job_json_is_plain_json() -> None:
    jobs, _ = _jobs(2, "nccl-ring-ll128")
    d = json.loads(jobs[0].to_json())
    assert d["env"] == {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL128"} and d["sizes"] == [4, 1024]


class _SumComm:
    """Stands in for VirtualCommunicator on the CPU: a plain float32 sum in rank order."""

    algorithms = ("oneshot_ll",)

    def __init__(self, corrupt: bool = False) -> None:
        self.corrupt = corrupt

    def all_reduce(self, ins: Any, op: str, algo: str, out: Any) -> Any:
        acc = ins[0].float()
        for x in ins[1:]:
            acc = acc + x.float()
        for r, o in enumerate(out):
            o.copy_(acc.to(o.dtype))
            if self.corrupt and r == 1:
                o[0] += 1.0
        return out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_virtual_target_rotates_inputs_and_checks_outputs(dtype: str) -> None:
    t = sweep.VirtualTarget.__new__(sweep.VirtualTarget)
    t.ranks, t.device, t.comm = 3, "cpu", _SumComm()
    bufs = t.buffers(4096, dtype, 3)
    ins, outs = bufs
    assert len(ins) == 3 and len(ins[0]) == 3 and ins[0][0].numel() == 4096 // ins[0][0].element_size()
    assert all(o.isnan().all() for o in outs[2])  # outputs start poisoned
    for i in range(5):
        t.call(bufs, i, "oneshot_ll")
    assert t.check(bufs, dtype) == "ok"
    t.comm = _SumComm(corrupt=True)
    for i in range(3):
        t.call(bufs, i, "oneshot_ll")
    verdict = t.check(bufs, dtype)
    assert verdict.startswith("mismatch") and "rank 1" in verdict
