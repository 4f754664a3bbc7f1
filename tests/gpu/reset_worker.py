"""``Communicator.reset()`` on real ranks: every wait bounded, through the store. One process per
rank under torchrun (``test_reset_bounded.py`` launches it; N processes share GPU 0 over gloo where
the host has fewer GPUs than ranks, ``_procs``).

    python -m torch.distributed.run --standalone --nproc-per-node=N tests/gpu/reset_worker.py

SECTIONS, in order, on one communicator (timeout TIMEOUT_S; the setup timeout, which bounds the
first-use agreement, SETUP_TIMEOUT_S):

* ``reset``: rank 1's kernels are absent (``testing.inject(absent=1)``); every rank sees the fault,
  every rank calls ``reset()``, which returns within ``agree.reset_wait_s(timeout)``; the next call is
  bit for bit the rank-order sum on every rank.
* ``realign``: rank 0 alone makes a call shape its peers never make: its first-use agreement round
  times out (a round its peers never entered: its rounds are one ahead of theirs). Every rank calls
  ``reset()``; then every rank makes a new call shape, which must agree and be bit for bit right
  (without the realignment its peers would read rank 0's stale round and raise).
* ``absent``: rank 1's kernels are absent again, and rank 1 never calls ``reset()`` (a dead peer);
  every other rank's ``reset()`` raises ``PeerTimeoutError`` naming rank 1 within
  ``agree.reset_wait_s(timeout)`` + a slack, never waiting on a device-group barrier, and its next
  call raises ``CommunicatorFaultedError``.

Every wait is bounded: the store's with a timeout, sollat's kernels by their fault timeout, the
whole process by WATCHDOG_S. Per rank: ``RANK r PASS section (...)`` or ``RANK r FAIL section: why``,
then ``RANK r SUMMARY passed=X failed=Y``; exit status 1 when any failed.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from typing import Any

import torch

try:  # run as a script (torchrun) or imported as tests.gpu.reset_worker (the launcher)
    from . import _procs
    from . import _reference as ref
except ImportError:
    import _procs  # type: ignore[no-redef]
    import _reference as ref  # type: ignore[no-redef]

SECTIONS = ("reset", "realign", "absent")
TIMEOUT_S = 2.0  # the communicator's device timeout
SETUP_TIMEOUT_S = 20.0  # set by the launcher: bounds rank 0's one-sided agreement round in realign
SLACK_S = 5.0  # a survivor's reset() must raise within agree.reset_wait_s(TIMEOUT_S) + this
ABSENT = 1
N = 4097
STORE_WAIT_S, WATCHDOG_S = 300.0, 400.0


emit = _procs.emit


class Run(_procs.Sections):
    def __init__(self, rank: int, world: int, dev: torch.device, store: Any, comm: Any) -> None:
        super().__init__(rank)
        self.world, self.dev, self.store, self.comm = world, dev, store, comm
        self.algo = "oneshot_ll" if "oneshot_ll" in comm.algorithms else comm.algorithms[0]
        self.calls = 0


    def barrier(self, name: str) -> None:
        keys = [f"{name}/{r}" for r in range(self.world)]
        self.store.set(keys[self.rank], "1")
        self.store.wait(keys, timedelta(seconds=STORE_WAIT_S))

    def inputs(self, n: int) -> list[torch.Tensor]:
        """Every rank's input of a new call (the same on every rank: seeds from the call's number)."""
        self.calls += 1
        out = []
        for r in range(self.world):
            g = torch.Generator(device=self.dev).manual_seed(ref.seed_of("reset", self.calls, r))
            out.append(torch.randn(n, generator=g, device=self.dev))
        return out

    def correct_call(self, n: int, what: str) -> None:
        xs = self.inputs(n)
        out = torch.full_like(xs[self.rank], float("nan"))
        self.comm.all_reduce(xs[self.rank], "sum", self.algo, out=out)
        self.comm.check()
        bad = int(ref.bitwise_bad(out, ref.rank_order_reduce(xs, "sum")).sum())
        self.expect(bad == 0, f"{what}: {bad} of {n} elements are not the rank-order sum")

    def fault(self, tag: str) -> Any:
        """One call with rank ABSENT's kernels absent; the fault this rank saw (None: none)."""
        from sollat import testing
        from sollat.errors import SollatError

        xs = self.inputs(N)
        self.barrier(f"{tag}-before")
        testing.inject(self.comm, absent=ABSENT)
        seen = None
        try:
            self.comm.all_reduce(xs[self.rank], "sum", self.algo, out=torch.empty_like(xs[self.rank]))
        except SollatError as exc:
            seen = exc
        t0 = time.monotonic()
        while seen is None and time.monotonic() - t0 < TIMEOUT_S + SLACK_S:
            try:
                self.comm.check()
            except SollatError as exc:
                seen = exc
            time.sleep(0.02)
        testing.clear(self.comm)
        return seen

    # -- sections
    def reset(self) -> None:
        from sollat.comm import agree

        self.correct_call(N, "warm-up")
        seen = self.fault("reset")
        self.expect(seen is not None or self.rank == ABSENT, "the injected absence was raised")
        self.barrier("reset-seen")
        t0 = time.monotonic()
        self.comm.reset()
        dt = time.monotonic() - t0
        self.expect(dt <= agree.reset_wait_s(TIMEOUT_S), f"reset() took {dt:.1f} s")
        self.correct_call(N, "after reset()")

    def realign(self) -> None:
        from sollat.errors import PeerTimeoutError

        if self.rank == 0:  # a call shape no peer makes: a round its peers never enter
            t0 = time.monotonic()
            try:
                self.comm.all_reduce(torch.ones(N + 2, device=self.dev), "sum", self.algo)
                self.expect(False, "a call no peer made returned")
            except PeerTimeoutError as exc:
                dt = time.monotonic() - t0
                self.expect(dt < SETUP_TIMEOUT_S + SLACK_S, f"the one-sided round raised after {dt:.1f} s")
                self.expect("did not reach agreement round" in str(exc), f"raised {exc}")
        self.barrier("realign-drifted")
        self.comm.reset()
        self.correct_call(N + 4, "a new call shape after reset()")

    def absent(self) -> None:
        from sollat.comm import agree
        from sollat.errors import CommunicatorFaultedError, PeerTimeoutError

        seen = self.fault("absent")
        if self.rank == ABSENT:  # a dead peer: no reset(), no call; it waits until its peers are done
            self.barrier("absent-done")
            return
        self.expect(seen is not None, "the injected absence was raised")
        limit = agree.reset_wait_s(TIMEOUT_S) + SLACK_S
        t0 = time.monotonic()
        try:
            self.comm.reset()
            self.expect(False, "reset() returned without rank 1")
        except PeerTimeoutError as exc:
            dt = time.monotonic() - t0
            self.expect(dt <= limit, f"reset() raised after {dt:.1f} s, limit {limit:.1f} s")
            self.expect(exc.peer == ABSENT and f"rank(s) [{ABSENT}] did not reach reset()" in str(exc),
                        f"the error names rank {ABSENT}: {exc}")
        try:
            self.comm.all_reduce(torch.ones(N, device=self.dev), "sum", self.algo)
            self.expect(False, "a call after the failed reset() returned")
        except CommunicatorFaultedError:
            pass
        self.barrier("absent-done")


def main() -> int:
    started = _procs.start_child("sollat-reset-worker", WATCHDOG_S)
    if started is None:
        return 1
    rank, world, dev, shared, store = started
    import sollat

    comm = sollat.Communicator(timeout_s=TIMEOUT_S)
    run = Run(rank, world, dev, store, comm)
    how = f"{world} processes sharing one GPU (gloo)" if shared else "one GPU per rank (NCCL)"
    emit(f"RANK {rank} PLAN {','.join(SECTIONS)} ({how}, {torch.cuda.get_device_name(dev)}, "
         f"SOLLAT_SETUP_TIMEOUT_S={os.environ.get('SOLLAT_SETUP_TIMEOUT_S')})")
    t0 = time.monotonic()
    for name in SECTIONS:
        run.section(name, getattr(run, name))
    try:  # leave together: no rank exits while a peer still needs the store
        run.barrier("done")
    except Exception as exc:
        emit(f"RANK {rank} leaving without its peers: {exc}")
    emit(f"RANK {rank} SUMMARY passed={run.passed} failed={run.failed} ({time.monotonic() - t0:.0f} s)")
    sys.stderr.flush()
    os._exit(0 if run.failed == 0 else 1)  # no teardown: a peer that failed differently must not hang the exit


if __name__ == "__main__":
    sys.exit(main())
