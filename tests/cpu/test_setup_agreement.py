"""One outcome on every rank when a Communicator's construction fails on one (sollat/comm/agree.py):
the gates with a shared store and threads as ranks (a failure, every rank failing, a rank that
never arrives, a rank that arrives after the others gave up, a store without compare_set, the
bounded store), then ``Communicator.__init__`` itself in gloo processes with the GPU parts faked
and one rank failing at each step (its environment, its scratch allocation, the rendezvous) or
never arriving: every rank raises ``SetupFailedError`` naming that rank and the cause, within the
setup timeout."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

from sollat.comm import agree
from sollat.comm.agree import SetupFailedError
from sollat.errors import PeerTimeoutError

from ._ranks import leave_together, on_threads, two_processes


def _store(timeout_s: float = 30.0) -> Any:
    from torch.distributed import HashStore

    store = HashStore()
    store.set_timeout(timedelta(seconds=timeout_s))
    return store


def _gates(store: Any, world: int, timeout_s: float, name: str) -> list[agree.Agreement]:
    return [agree.Agreement(store, name, r, world, timeout_s, seq=0) for r in range(world)]


def test_every_payload_when_every_rank_succeeds() -> None:
    gates = _gates(_store(), 3, 5.0, "ok")
    got = on_threads(3, lambda r: gates[r].gate("step", None, f"p{r}"))
    assert got == [["p0", "p1", "p2"]] * 3


def test_one_rank_fails_every_rank_raises_naming_it() -> None:
    gates = _gates(_store(), 3, 5.0, "one")
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 48.00 MiB")

    def step(r: int) -> list[str]:
        return gates[r].gate("the scratch allocation", oom if r == 1 else None)

    got = on_threads(3, step)
    assert all(isinstance(e, SetupFailedError) for e in got), got
    assert {e.step for e in got} == {"the scratch allocation"}
    assert all(e.failures == {1: "OutOfMemoryError: CUDA out of memory. Tried to allocate 48.00 MiB"} for e in got)
    assert len({str(e) for e in got}) == 1 and len({e.summary for e in got}) == 1  # one text on every rank
    assert got[1].__cause__ is oom and got[0].__cause__ is None


def test_every_rank_failing_alike_raises_its_own_error() -> None:
    gates = _gates(_store(), 2, 5.0, "all")
    errors = [ValueError("algorithms must name at least one"), ValueError("algorithms must name at least one")]
    got = on_threads(2, lambda r: gates[r].gate("arguments", errors[r]))
    assert got[0] is errors[0] and got[1] is errors[1]


def test_every_rank_failing_differently_is_one_decision() -> None:
    gates = _gates(_store(), 2, 5.0, "differently")
    errors = [TimeoutError("waited for rank 1"), RuntimeError("injected")]
    got = on_threads(2, lambda r: gates[r].gate("rendezvous", errors[r]))
    assert all(isinstance(e, SetupFailedError) for e in got), got
    assert got[0].failures == got[1].failures == {0: "TimeoutError: waited for rank 1", 1: "RuntimeError: injected"}


def test_a_rank_that_never_arrives_is_named_on_every_rank_within_the_timeout() -> None:
    gates = _gates(_store(), 3, 0.5, "absent")
    t0 = time.monotonic()
    got = on_threads(2, lambda r: gates[r].gate("the symmetric-memory rendezvous", None))
    assert time.monotonic() - t0 < 10
    assert all(isinstance(e, SetupFailedError) and e.failures == {2: "did not reach the symmetric-memory "
                                                                      "rendezvous within 0.5 s (SOLLAT_SETUP_TIMEOUT_S)"}
               for e in got), got


def test_a_rank_arriving_after_the_others_gave_up_raises_too() -> None:
    """Without the round's decision it would see every key posted and go on alone."""
    gates = _gates(_store(), 2, 0.3, "late")
    got = on_threads(2, lambda r: gates[r].gate("step", None, "x"), delay={1: 1.5})
    assert all(isinstance(e, SetupFailedError) and e.failures == {1: "did not reach step within 0.3 s "
                                                                      "(SOLLAT_SETUP_TIMEOUT_S)"} for e in got), got


def test_exchange_a_late_rank_gets_the_same_peer_timeout() -> None:
    ags = _gates(_store(), 2, 0.3, "xlate")
    got = on_threads(2, lambda r: ags[r].exchange("v"), delay={1: 1.5})
    assert all(isinstance(e, PeerTimeoutError) and e.peer == 1 for e in got), got


def test_a_store_without_compare_set_still_agrees() -> None:
    class Plain:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            if name == "compare_set":
                raise AttributeError(name)
            return getattr(self.inner, name)

    store = Plain(_store())
    gates = _gates(store, 2, 5.0, "plain")
    assert on_threads(2, lambda r: gates[r].gate("step", None, str(r))) == [["0", "1"]] * 2


def test_store_timeout_bounds_a_wait_inside_and_restores_it() -> None:
    store = _store(30.0)
    t0 = time.monotonic()
    with agree.store_timeout(store, 0.2), pytest.raises(Exception):  # noqa: B017 (the store's own timeout type)
        store.get("never-set")
    assert time.monotonic() - t0 < 10
    assert store.timeout == timedelta(seconds=30)


def test_cause_is_one_line_and_capped() -> None:
    text = agree.cause(RuntimeError("first line\n  second line " + "x" * 1000))
    assert "\n" not in text and text.startswith("RuntimeError: first line second line")
    assert len(text) == agree.MAX_CAUSE_CHARS and text.endswith("...")


# ---- Communicator.__init__ in gloo processes, the GPU parts faked -----------------------------------
SETUP_TIMEOUT_S = 6.0


def _fake_gpu(rank: int, scenario: str) -> None:
    """What a Communicator touches of the GPU, on the CPU; the scenario's fault on rank 1."""
    import os

    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    import sollat.comm.real as real
    from sollat.device import topology

    real.cuda_device = lambda device, who: torch.device("cuda", 0)  # type: ignore[assignment]
    topology.describe_local = lambda device, r: topology.GpuDescription(  # type: ignore[assignment]
        r, "host", 0, f"0000:{r + 1:02x}:00.0", None, (), False, False)
    topology.outside_domain_path = lambda descriptions, r, outside: "sollat"  # type: ignore[assignment]

    def empty(size: int, dtype: torch.dtype, device: Any) -> torch.Tensor:
        if scenario == "oom" and rank == 1:
            raise torch.OutOfMemoryError("CUDA out of memory (injected on rank 1)")
        return torch.empty(size, dtype=dtype)

    def rendezvous(buf: torch.Tensor, group_name: str) -> Any:
        if rank == 1:
            raise RuntimeError("rendezvous failed (injected on rank 1)")
        # as torch's rendezvous: wait in the process group's store for every peer's handle
        dist.distributed_c10d._get_default_store().get("symmetric_memory-handle-of-rank-1")
        raise AssertionError("unreachable: rank 1 never posts its handle")

    symm_mem.empty = empty  # type: ignore[assignment]
    symm_mem.rendezvous = rendezvous  # type: ignore[assignment]
    if scenario == "env" and rank == 1:
        os.environ["SOLLAT_BATCH_INVARIANT"] = "yes"


def _construct(rank: int, port: int, scenario: str, out: str) -> None:
    import os

    import torch.distributed as dist

    import sollat

    os.environ["SOLLAT_SETUP_TIMEOUT_S"] = str(SETUP_TIMEOUT_S)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=300))  # the store's own wait: far beyond the test's
    _fake_gpu(rank, scenario)
    got: dict[str, Any] = {}
    t0 = time.monotonic()
    if scenario == "absent" and rank == 1:
        time.sleep(SETUP_TIMEOUT_S + 3)  # never constructs it
    else:
        try:
            sollat.Communicator(max_blocks=16)
            got["error"] = None
        except Exception as exc:
            got.update(error=type(exc).__name__, step=getattr(exc, "step", None),
                       failures={str(k): v for k, v in getattr(exc, "failures", {}).items()},
                       cause=type(exc.__cause__).__name__ if exc.__cause__ else None)
    got["seconds"] = time.monotonic() - t0
    Path(out, f"{rank}.json").write_text(json.dumps(got))
    leave_together(rank, "test-", 120)


@pytest.mark.parametrize("scenario", ["env", "oom", "rendezvous", "absent"])
def test_construction_failing_on_one_rank_is_one_decision(tmp_path: Path, scenario: str) -> None:
    got = two_processes(_construct, (scenario,), tmp_path)
    ranks = [0] if scenario == "absent" else [0, 1]
    step = {"env": "the argument and environment checks", "oom": "the scratch allocation",
            "rendezvous": "the symmetric-memory rendezvous", "absent": "the argument and environment checks"}[scenario]
    cause = {"env": "EnvironmentValueError: sollat: SOLLAT_BATCH_INVARIANT='yes' is not understood; it takes 0 or 1 "
                    "(or unset)",
             "oom": "OutOfMemoryError: CUDA out of memory (injected on rank 1)",
             "rendezvous": "RuntimeError: rendezvous failed (injected on rank 1)",
             "absent": f"did not reach the argument and environment checks within {SETUP_TIMEOUT_S:g} s "
                       "(SOLLAT_SETUP_TIMEOUT_S)"}[scenario]
    for r in ranks:
        g = got[r]
        assert g["error"] == "SetupFailedError" and g["step"] == step, (r, g)
        assert g["failures"]["1"] == cause, (r, g)
        assert g["seconds"] < SETUP_TIMEOUT_S + 5, (r, g)  # within the setup timeout, never the store's 300 s
    if scenario == "rendezvous":  # rank 0 gave up waiting in the store after half the setup timeout
        assert set(got[0]["failures"]) == {"0", "1"} and got[0]["failures"] == got[1]["failures"]
    elif scenario != "absent":
        assert set(got[0]["failures"]) == {"1"} and got[0]["cause"] is None
        assert got[1]["cause"] in ("EnvironmentValueError", "OutOfMemoryError")
