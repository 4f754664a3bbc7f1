"""The one timing method every row uses (docs/measurement.md).

1. A few eager calls (compiles kernels, allocates lazily-created state, surfaces errors).
2. Capture ``calls`` back-to-back calls in one CUDA graph; call i uses input set i mod n, so
   consecutive calls never read the same buffers and nothing is served from a warm L2 that a
   real step would not have.
3. Replay the graph ``warmup`` times, then ``replays`` times with a CUDA event before and after
   each replay, all on one stream without host synchronisation in between.
4. Per replay: elapsed / calls = microseconds per call. Report median, p10, p90, min, max.

:func:`time_calls` is the one implementation; the apps (``sollat.apps.decode``) and the scripts
time with it too.

In a torchrun job every rank does the same after a host barrier; rank 0 keeps, per replay,
the slowest rank's time (the collective is done when the last rank is done).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .stats import Stats

DEFAULT_CALLS = 100
MIN_CALLS = 8
LARGE_BYTES = 256 << 10  # above this, fewer calls per graph: each call is long enough on its own


def calls_for(nbytes: int, max_calls: int = DEFAULT_CALLS) -> int:
    """Calls per graph: ``max_calls`` up to 256 KiB, then fewer (inversely with size), at least 8."""
    if nbytes <= LARGE_BYTES:
        return max_calls
    return max(MIN_CALLS, min(max_calls, round(max_calls * LARGE_BYTES / nbytes)))


def sets_for(bytes_per_set: int, *, max_sets: int = 4, budget_bytes: int = 4 << 30) -> int:
    """How many input (and output) sets to rotate over: up to ``max_sets``, within a memory budget."""
    if bytes_per_set <= 0:
        return max_sets
    return max(2, min(max_sets, budget_bytes // (2 * bytes_per_set)))


@dataclass
class GraphTiming:
    per_call_us: list[float]  # one value per timed replay
    calls: int  # calls per graph
    replays: int

    @property
    def stats(self) -> Stats:
        return Stats.of(self.per_call_us)


def time_calls(call: Callable[[int], None], *, calls: int, replays: int, warmup: int = 2, eager: int = 2,
               sync: Callable[[], None] | None = None, device: Any = None, graph: bool = True,
               barrier_each: bool = False) -> GraphTiming:
    """Time ``call(i)`` (i = 0..calls-1) by CUDA-graph replay; see the module docstring.

    The one timing helper of sollat (the bench, ``tune``, the apps and the scripts): ``eager``
    calls, ``calls`` calls captured in one graph, ``warmup`` untimed replays, then ``replays``
    timed ones; ``GraphTiming.stats.median`` is the figure every caller reports.

    ``sync`` is called (after a device synchronisation) right before the timed replays, so that
    all ranks of a torchrun job start together; it is a host barrier there and None otherwise.
    ``barrier_each``: instead, before every timed replay call ``sync`` (a device synchronisation
    when it is None) and wait for the replay to end, so each replay starts with the ranks aligned
    and an idle GPU. ``graph=False`` runs the ``calls`` calls eagerly wherever a replay would run
    (timing an eager path the same way).
    """
    import torch

    for i in range(eager):
        call(i)
    torch.cuda.synchronize(device)
    captured: Any = None
    if graph:
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured):
            for i in range(calls):
                call(i)

    def run_eagerly() -> None:
        for i in range(calls):
            call(i)

    run: Callable[[], None] = captured.replay if captured is not None else run_eagerly

    def align() -> None:
        if sync is not None:
            sync()
        else:
            torch.cuda.synchronize(device)

    try:
        for _ in range(warmup):
            run()
        torch.cuda.synchronize(device)
        if sync is not None and not barrier_each:
            sync()
        stream = torch.cuda.current_stream(device)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
        for s, e in zip(starts, ends, strict=True):
            if barrier_each:
                align()
            s.record(stream)
            run()
            e.record(stream)
            if barrier_each:
                e.synchronize()
        torch.cuda.synchronize(device)
        per_call = [s.elapsed_time(e) * 1000.0 / calls for s, e in zip(starts, ends, strict=True)]
    finally:
        del run, captured
    return GraphTiming(per_call, calls, replays)


def event_times_ms(fn: Callable[[], object], n: int, device: Any) -> list[float]:
    """Milliseconds of each of ``n`` back-to-back ``fn()`` calls: CUDA events between the calls on a
    CUDA ``device`` (no host synchronisation until the last one), the wall clock elsewhere. For work
    that is timed as it runs (an app's decode steps, a solver's chunks) rather than replayed."""
    import torch

    if torch.device(device).type != "cuda":
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return times
    events = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
    events[0].record()
    for i in range(n):
        fn()
        events[i + 1].record()
    torch.cuda.synchronize(device)
    return [events[i].elapsed_time(events[i + 1]) for i in range(n)]


def slowest_rank(value: float) -> float:
    """The largest ``value`` over the ranks of the default process group (``value`` itself when
    there is none): a collective is done when its last rank is."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return value
    got: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(got, value)
    return max(got)


def empty_kernel() -> Any:
    from ..device.build import get_kernel

    return get_kernel("probe_barrier.cu", "sollat_empty")


def measure_floor(device: Any, *, calls: int = DEFAULT_CALLS, replays: int = 30, pdl: bool = False,
                  grid: tuple[int, int] = (1, 1), block: int = 32, sync: Callable[[], None] | None = None) -> GraphTiming:
    """The empty-kernel floor: ``calls`` empty launches in one graph, timed like every row."""
    import torch

    from ..device.launch import ensure_device, launch, launch_config

    dev = torch.device(device)
    ensure_device(dev.index or 0)
    kernel = empty_kernel()
    config = launch_config(grid, block, pdl=pdl)

    def call(_i: int) -> None:
        launch(kernel, config, (), device=dev)

    return time_calls(call, calls=calls, replays=replays, sync=sync, device=dev)


def floor_record(device: Any, *, calls: int, replays: int, sync: Callable[[], None] | None = None) -> dict[str, Any]:
    """Floor with and without programmatic dependent launch, as stored in the result files."""
    plain = measure_floor(device, calls=calls, replays=replays, pdl=False, sync=sync)
    pdl = measure_floor(device, calls=calls, replays=replays, pdl=True, sync=sync)
    s, sp = plain.stats, pdl.stats
    return {
        "what": "empty kernel, 1 block x 32 threads, back-to-back in one CUDA graph",
        "calls_per_graph": calls,
        "replays": replays,
        "median_us": s.median,
        "stats_us": s.to_dict(),
        "pdl_median_us": sp.median,
        "pdl_stats_us": sp.to_dict(),
    }
