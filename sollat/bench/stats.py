"""Summary statistics of repeated timings (numpy's percentiles, linear interpolation; no torch)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np


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
        vals = np.asarray(values, dtype=np.float64)
        if vals.ndim != 1 or vals.size == 0:
            raise ValueError(f"Stats of no values (or not a list of numbers): {values!r}")
        median, p10, p90 = (float(v) for v in np.percentile(vals, [50, 10, 90]))
        return cls(median=median, p10=p10, p90=p90, min=float(vals.min()), max=float(vals.max()), n=int(vals.size))

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
