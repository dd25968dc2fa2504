"""Summaries of the samples a measurement hands a gate."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Spread:
    """Median, min and max of a list of timings, in seconds."""

    median: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> "Spread":
        if not samples:
            raise ValueError("no timings to summarise")
        return cls(statistics.median(samples), min(samples), max(samples), len(samples))

    def ms(self) -> dict[str, float]:
        return {"median_ms": self.median * 1e3, "min_ms": self.min * 1e3, "max_ms": self.max * 1e3}
