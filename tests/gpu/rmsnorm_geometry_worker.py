"""The fused AllReduce + RMSNorm at row geometries that leave warps or blocks without a line, on
real ranks: one process per rank under torchrun (``test_rmsnorm_geometry_procs.py`` launches it;
N processes share GPU 0 over gloo where the host has fewer GPUs than ranks, ``_procs``). Processes
sharing a GPU time-slice, so a block of one rank is held back for a whole slice while its
siblings and its peers' blocks run on: the stall a row cluster's buffer reuse must survive.

    python -m torch.distributed.run --standalone --nproc-per-node=3 tests/gpu/rmsnorm_geometry_worker.py

The cut rounds a block's threads up to whole warps, so a row cluster's last block can get a warp's
worth of lines or none (``rmsnorm.row_exchange``: 2880 bf16 on LL leaves warp 5 of block 3 empty,
5376 bf16 on LL block 7 of 8); a cluster reuses its row buffers (two parities) from its third row
on, which only a communicator with fewer fused blocks than the algorithms' 32 gives it
(``rmsnorm_max_blocks``). SECTIONS, in order:

* ``geometry:default|8|4``: a Communicator with that ``rmsnorm_max_blocks``; every fused algorithm
  at hidden 2880, 5376, 6144, 7168 (bf16; fp32 at 2880 and 5376, whose fp32 cuts leave warps
  empty too) and 1 to 512 rows (above 16 rows no call has a row cluster: those run with the
  default blocks only), REPEATS calls of each shape back to back with fresh inputs and poisoned
  outputs, one rank starting each late by a few ms in turn; every call's y and residual_out bit for
  bit ``sollat.rmsnorm.reference`` on every rank.
* ``late_peer``: rank 1's kernels return at once (``testing.inject(absent=1)``) at cuts with empty
  warps and blocks: every rank raises PeerTimeoutError naming rank 1 (the two-shot: a rank other
  than the one that detected it) within the timeout and a slack, and after ``reset()`` the
  communicator computes right again.
* ``cross-rank``: every output's raw-bit digest, compared across ranks through the store.

Every wait is bounded: the store's with a timeout, sollat's kernels by their fault timeout, the
whole process by WATCHDOG_S. Per rank: ``RANK r PLAN ...``, ``RANK r PASS section (...)`` or
``RANK r FAIL section: why``, then ``RANK r SUMMARY passed=X failed=Y``; exit status 1 when any
failed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import time
from datetime import timedelta
from typing import Any

import torch

try:  # run as a script (torchrun) or imported as tests.gpu.rmsnorm_geometry_worker (the launcher)
    from . import _procs
    from . import _reference as ref
except ImportError:
    import _procs  # type: ignore[no-redef]
    import _reference as ref  # type: ignore[no-redef]

CAPS: dict[str, int | None] = {"default": None, "8": 8, "4": 4}  # rmsnorm_max_blocks per section
SECTIONS = (*(f"geometry:{c}" for c in CAPS), "late_peer", "cross-rank")
HIDDEN = (2880, 5376, 6144, 7168)
FP32_HIDDEN = (2880, 5376)
ROWS = (1, 2, 3, 4, 5, 8, 12, 16, 17, 64, 512)
CLUSTER_ROWS = 16  # the most rows a call still gives row clusters (rmsnorm.row_geometry)
REPEATS = 2
EPS = 1e-6
POISON = 1234.5  # finite: an element the kernel did not write shows
MAIN_TIMEOUT_S = 10.0  # processes time-slicing one GPU wait for each other's slices
LATE_TIMEOUT_S = 2.0
LATE_ABSENT = 1  # a middle rank at 3 or more processes
FAULT_SLACK_S = 5.0  # the fault must reach every rank within the timeout and this
LATE_SHAPES = ((2880, torch.bfloat16, 5), (5376, torch.bfloat16, 3), (2880, torch.float32, 3))
STAGGER_S = 0.004
STORE_WAIT_S, WATCHDOG_S = 300.0, 1200.0


emit = _procs.emit


def fused_algos() -> list[str]:
    """The fused algorithms: the one-shots, and the two-shot where its variable enables it."""
    from sollat.collectives import algorithms, rmsnorm

    return [a for a in rmsnorm.ALGOS if a in rmsnorm.AUTO_ALGOS or algorithms.rmsnorm_twoshot_enabled()]


class Run(_procs.Sections):
    def __init__(self, rank: int, world: int, dev: torch.device, store: Any) -> None:
        super().__init__(rank)
        self.world, self.dev, self.store = world, dev, store
        self.digests: list[str] = []
        self.calls = 0

    # -- bookkeeping
    def progress(self) -> str:
        return f", {self.calls} calls so far"

    def exchange(self, name: str, value: str) -> list[str]:
        keys = [f"{name}/{r}" for r in range(self.world)]
        self.store.set(keys[self.rank], value)
        self.store.wait(keys, timedelta(seconds=STORE_WAIT_S))
        return [self.store.get(k).decode() for k in keys]

    def inputs(self, tag: str, rows: int, hidden: int, dtype: torch.dtype
               ) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        """Every rank's x of a new call, and the residual and weight (equal on every rank, as in
        tensor parallelism): the same bits in every process (seeds from the call's number)."""
        self.calls += 1

        def randn(*parts: object, shape: tuple[int, ...]) -> torch.Tensor:
            g = torch.Generator(device=self.dev).manual_seed(ref.seed_of(tag, self.calls, *parts))
            return torch.randn(shape, generator=g, device=self.dev).to(dtype)

        xs = [randn("x", r, shape=(rows, hidden)) for r in range(self.world)]
        return xs, randn("res", shape=(rows, hidden)), (1 + 0.1 * randn("w", shape=(hidden,)).float()).to(dtype)

    def same_bits(self, got: torch.Tensor, want: torch.Tensor, what: str) -> None:
        got = got.cpu()
        if int(ref.bitwise_bad(got, want)):
            self.expect(False, f"{what}: {ref.first_difference(got, want)}")
        self.digests.append(f"{what}={ref.digest(got)}")

    # -- sections
    def geometry(self, cap_name: str) -> None:
        import sollat
        from sollat.collectives import rmsnorm

        cap = CAPS[cap_name]
        comm = sollat.Communicator(timeout_s=MAIN_TIMEOUT_S, rmsnorm_max_blocks=cap)
        turn = 0
        for algo in fused_algos():
            for hidden, dtype in [(h, torch.bfloat16) for h in HIDDEN] + [(h, torch.float32) for h in FP32_HIDDEN]:
                for rows in ROWS:
                    if rows > CLUSTER_ROWS and (cap is not None or dtype != torch.bfloat16):
                        continue
                    pending = []
                    for rep in range(REPEATS):
                        what = f"{algo} cap={cap_name} {str(dtype).removeprefix('torch.')} {rows}x{hidden} #{rep}"
                        xs, res, w = self.inputs(what, rows, hidden, dtype)
                        y = torch.full_like(xs[self.rank], POISON)
                        r = torch.full_like(res, POISON)
                        turn += 1
                        if turn % self.world == self.rank:  # this rank starts late, each in turn
                            torch.cuda.synchronize(self.dev)
                            time.sleep(STAGGER_S)
                        comm.all_reduce_rmsnorm(xs[self.rank], res, w, EPS, algo, out=y, residual_out=r)
                        pending.append((what, xs, res, w, y, r))
                    for what, xs, res, w, y, r in pending:
                        want_y, want_r = rmsnorm.reference(xs, res, w, EPS)
                        self.same_bits(y, want_y, f"{what} y")
                        self.same_bits(r, want_r, f"{what} residual_out")
        comm.check()

    def late_peer(self) -> None:
        import sollat
        from sollat import testing
        from sollat.collectives import rmsnorm

        comm = sollat.Communicator(timeout_s=LATE_TIMEOUT_S, rmsnorm_max_blocks=8)
        absent = LATE_ABSENT if self.world > LATE_ABSENT else 0
        for algo in fused_algos():
            for hidden, dtype, rows in LATE_SHAPES:
                what = f"{algo} {str(dtype).removeprefix('torch.')} {rows}x{hidden} rank {absent} absent"
                xs, res, w = self.inputs(what, rows, hidden, dtype)
                comm.all_reduce_rmsnorm(xs[self.rank], res, w, EPS, algo)  # planned and compiled first
                comm.check()
                self.exchange(f"late/{what}/ready", "1")
                testing.inject(comm, absent=absent)
                y = torch.full_like(xs[self.rank], POISON)
                t0 = time.monotonic()
                err: BaseException | None = None
                try:
                    comm.all_reduce_rmsnorm(xs[self.rank], res, w, EPS, algo, out=y)
                except sollat.SollatError as exc:
                    err = exc
                err = err or self.poll_fault(comm, t0, LATE_TIMEOUT_S + FAULT_SLACK_S)
                waited = time.monotonic() - t0
                if self.expect(isinstance(err, sollat.PeerTimeoutError), f"{what}: expected PeerTimeoutError, got {err!r}"):
                    assert isinstance(err, sollat.PeerTimeoutError)
                    if algo == "twoshot_sentinel":  # may name a row's owner (algorithms.py: why it is experimental)
                        self.expect(err.peer != err.rank, f"{what}: the error names the detecting rank: {err}")
                    else:
                        self.expect(err.peer == absent, f"{what}: the error names peer {err.peer}: {err}")
                    self.expect(waited <= LATE_TIMEOUT_S + FAULT_SLACK_S, f"{what}: raised after {waited:.1f} s")
                torch.cuda.synchronize(self.dev)
                self.exchange(f"late/{what}/seen", "1")  # every rank's kernel has ended
                testing.clear(comm)
                comm.reset()
                ys, rs = comm.all_reduce_rmsnorm(xs[self.rank], res, w, EPS, algo)
                want_y, want_r = rmsnorm.reference(xs, res, w, EPS)
                self.same_bits(ys, want_y, f"{what}, after reset: y")
                self.same_bits(rs, want_r, f"{what}, after reset: residual_out")
                comm.check()

    @staticmethod
    def poll_fault(comm: Any, t0: float, limit_s: float) -> BaseException | None:
        """comm.check() until it raises or limit_s after t0 (a rank whose own kernel completed
        raises only once a peer's fault record has reached it)."""
        import sollat

        while True:
            try:
                comm.check()
            except sollat.SollatError as exc:
                return exc
            if time.monotonic() - t0 > limit_s:
                return None
            time.sleep(0.02)

    def cross_rank(self) -> None:
        mine = hashlib.sha256("\n".join(self.digests).encode()).hexdigest()[:24]
        seen = self.exchange("cross-rank", f"{mine}:{len(self.digests)}")
        self.expect(len(set(seen)) == 1, f"the ranks' outputs differ: digests of all outputs {seen}")
        self.expect(len(self.digests) > 0, "no output was checked")


def main() -> int:
    started = _procs.start_child("sollat-rmsnorm-geometry", WATCHDOG_S)
    if started is None:
        return 1
    rank, world, dev, shared, store = started
    run = Run(rank, world, dev, store)
    how = f"{world} processes sharing one GPU (gloo)" if shared else "one GPU per rank (NCCL)"
    emit(f"RANK {rank} PLAN {','.join(SECTIONS)} ({how}, {torch.cuda.get_device_name(dev)}, torch {torch.__version__})")
    t0 = time.monotonic()
    for name in SECTIONS:
        what, _, arg = name.partition(":")
        fn = {"geometry": lambda arg=arg: run.geometry(arg), "late_peer": run.late_peer,
              "cross-rank": run.cross_rank}[what]
        run.section(name, fn)
    with contextlib.suppress(Exception):  # leave together: no rank exits while a peer still needs the store
        run.exchange("done", "1")
    emit(f"RANK {rank} SUMMARY passed={run.passed} failed={run.failed} ({time.monotonic() - t0:.0f} s)")
    sys.stderr.flush()
    os._exit(0 if run.failed == 0 else 1)  # no teardown: a peer that failed differently must not hang the exit


if __name__ == "__main__":
    sys.exit(main())
