"""Made-up results in the real schema, for the CPU tests of the writers and plots (test data, not
part of the library).

The numbers follow the shape of the H200 reference figures (a ~1 us floor at small sizes,
linear growth at large ones) but are not measurements; everything built from them says so
(meta["synthetic"] is True and the card is "synthetic").
"""

from __future__ import annotations

from typing import Any

from sollat.bench.results import OK, SKIPPED, UNSUPPORTED, BarrierRow, Row
from sollat.bench.stats import Stats

SOLLAT_ALGOS = ("oneshot_ll", "oneshot_sentinel", "twoshot_ll", "twoshot_sentinel")


def _latency(base: float, per_kib: float, nbytes: int, ranks: int) -> float:
    return base * (1 + 0.25 * (ranks - 2)) + per_kib * nbytes / 1024 * ranks / 2


def _row(impl: str, algo: str, ranks: int, dtype: str, nbytes: int, us: float, **kw: Any) -> Row:
    r = Row(impl, algo, ranks, dtype, nbytes, calls_per_graph=100, replays=7, check="ok", **kw)
    return r.set_stats(Stats.of([us * f for f in (0.97, 0.99, 1.0, 1.0, 1.01, 1.03, 1.08)]))


def bench_results(*, mode: str = "virtual", ranks: tuple[int, ...] = (2, 4), dtypes: tuple[str, ...] = ("float32",),
                  sizes: tuple[int, ...] = (4, 256, 16 << 10, 1 << 20), with_nccl: bool = False) -> dict[str, Any]:
    """A bench.json document: {"meta", "floor", "sol", "rows"} (rows as Row objects)."""
    rows: list[Row] = []
    for R in ranks:
        for dt in dtypes:
            for n in sizes:
                for i, algo in enumerate(SOLLAT_ALGOS):
                    if algo.startswith("oneshot") and n > (4 << 20):
                        rows.append(Row("sollat", algo, R, dt, n, status=UNSUPPORTED, reason="too large"))
                        continue
                    rows.append(_row("sollat", algo, R, dt, n, _latency(1.6 + 0.3 * i, 0.004 / (1 + i % 2), n, R)))
                rows.append(_row("sollat", "auto", R, dt, n, _latency(1.6, 0.002, n, R), selected="oneshot_ll"))
                if with_nccl:
                    rows.append(_row("nccl", "default", R, dt, n, _latency(8.0, 0.002, n, R)))
                    rows.append(_row("nccl", "Ring/LL", R, dt, n, _latency(9.0, 0.003, n, R),
                                     env={"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"}))
            if not with_nccl:
                rows.append(Row("nccl", "default", R, dt, None, status=SKIPPED, reason="needs >= 2 GPUs"))
    if mode == "virtual":
        for dt in dtypes:
            for n in sizes:
                rows.append(_row("torch-symm", "one_shot", 1, dt, n, _latency(3.4, 0.001, n, 1)))
    meta = {"tool": "bench", "card": "synthetic", "mode": mode, "ranks": list(ranks),
            "world_size": 1 if mode == "virtual" else ranks[0], "dtypes": list(dtypes), "sizes": list(sizes),
            "replays": 7, "date": "2026-01-01T12:00:00+00:00", "commit": "abc1234", "synthetic": True}
    floor = {"median_us": 0.55, "stats_us": Stats.of([0.54, 0.55, 0.56]).to_dict(), "calls_per_graph": 100}
    sol = {"card": "synthetic", "l2_rtt_ns": 135.0, "remote_store_ns": 271.5, "sol_ns": 541.5,
           "remote_kind": "a ping-pong between two SMs of one GPU (synthetic)", "notes": [],
           "fence": {"name": "fence.sc.gpu (= __threadfence)", "method": "synthetic", "status": "ok",
                     "median_ns": 135.0, "min_ns": 134.0, "max_ns": 137.0, "p10_ns": 134.5, "p90_ns": 136.0,
                     "spread_pct": 1.1, "n": 5, "cycles": 267.0},
           "pingpong": {"name": "SM-to-SM ping-pong (one GPU), round trip", "method": "synthetic", "status": "ok",
                        "median_ns": 543.0, "min_ns": 530.0, "max_ns": 560.0, "p10_ns": 535.0, "p90_ns": 550.0,
                        "spread_pct": 2.8, "n": 5, "cycles": 1075.0, "reference_rtt_ns": 543.0}}
    return {"meta": meta, "floor": floor, "sol": sol, "rows": rows}


def barrier_results(ranks: tuple[int, ...] = (2, 4, 8, 16)) -> dict[str, Any]:
    rows: list[BarrierRow] = []
    for R in ranks:
        for variant, base in (("a2a relaxed", 0.7), ("a2a acq_rel", 0.9)):
            us = base + 0.05 * R
            rows.append(BarrierRow(variant, R, "in-kernel").set_stats(Stats.of([us * 0.98, us, us * 1.04])))
            rows.append(BarrierRow(variant, R, "graph").set_stats(Stats.of([us * 1.5, us * 1.6, us * 1.7])))
        rows.append(BarrierRow("nccl lsa", R, "in-kernel", status=SKIPPED, reason="not measured"))
    meta = {"tool": "barrier", "card": "synthetic", "mode": "virtual", "ranks": list(ranks),
            "date": "2026-01-01T12:00:00+00:00", "commit": "abc1234", "synthetic": True}
    return {"meta": meta, "floor": {"median_us": 0.55}, "rows": rows}


__all__ = ["OK", "SOLLAT_ALGOS", "barrier_results", "bench_results"]
