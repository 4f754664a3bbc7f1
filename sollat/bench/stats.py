"""Summary statistics of repeated timings (pure Python, no torch)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile ``q`` in [0, 100] of ``values`` (numpy's default method)."""
    if not values:
        raise ValueError("percentile of no values")
    xs = sorted(values)
    if len(xs) == 1:
        return float(xs[0])
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))


@dataclass(frozen=True)
class Stats:
    """Median and spread of one measurement repeated ``n`` times (unit given by the caller)."""

    median: float
    p10: float
    p90: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Stats:
        vals = [float(v) for v in values]
        return cls(
            median=percentile(vals, 50),
            p10=percentile(vals, 10),
            p90=percentile(vals, 90),
            min=min(vals),
            max=max(vals),
            n=len(vals),
        )

    @property
    def spread_pct(self) -> float:
        """(p90 - p10) / median in percent: the run-to-run spread reported next to every median."""
        return 100.0 * (self.p90 - self.p10) / self.median if self.median > 0 else 0.0

    def scaled(self, factor: float) -> Stats:
        return Stats(self.median * factor, self.p10 * factor, self.p90 * factor, self.min * factor,
                     self.max * factor, self.n)

    def to_dict(self) -> dict[str, float]:
        d: dict[str, float] = {k: float(v) for k, v in asdict(self).items()}
        d["n"] = self.n
        d["spread_pct"] = self.spread_pct
        return d

    @classmethod
    def from_dict(cls, d: dict[str, float]) -> Stats:
        return cls(float(d["median"]), float(d["p10"]), float(d["p90"]), float(d["min"]), float(d["max"]),
                   int(d["n"]))
