"""Statistics of the decode benchmark's rounds: medians, spread, and a speedup with its
confidence interval.

The speedup of arm A over arm B is estimated on the log scale with the Hodges-Lehmann estimator
(the median of every pairwise difference log a_i - log b_j, so the ratio of a typical round of A
to a typical round of B) and its distribution-free confidence interval from the Mann-Whitney U
statistic's exact null distribution: with n and m rounds, the interval runs from the k-th smallest
to the k-th largest of the n*m pairwise differences, k - 1 being the largest U with
P(U <= k - 1) <= alpha / 2. The interval is exp()'d back to a ratio. With 5 rounds each, k = 3
(a 96.8 % interval for alpha = 0.05); with fewer than 4 rounds a side no 95 % interval exists and
the bounds are NaN.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence


def spread(values: Sequence[float]) -> float:
    """max / min of positive samples (1.0 = no spread); NaN for an empty list or a non-positive value."""
    vals = list(values)
    if not vals or min(vals) <= 0:
        return math.nan
    return max(vals) / min(vals)


@lru_cache(maxsize=None)
def _u_counts(n: int, m: int) -> tuple[int, ...]:
    """Number of arrangements of n x's and m y's for each value of U (x above y pairs), 0..n*m."""
    # f(n, m)[u] = f(n-1, m)[u-m] + f(n, m-1)[u]: the largest element is an x (beating all m y's) or a y
    if n == 0 or m == 0:
        return (1,)
    a, b = _u_counts(n - 1, m), _u_counts(n, m - 1)
    out = [0] * (n * m + 1)
    for u, c in enumerate(a):
        out[u + m] += c
    for u, c in enumerate(b):
        out[u] += c
    return tuple(out)


def mann_whitney_k(n: int, m: int, alpha: float = 0.05) -> int:
    """The rank k of the Hodges-Lehmann interval's bounds: the largest k with P(U <= k - 1) <= alpha/2
    under the null; 0 when even U = 0 is too likely (no interval at this level)."""
    if n < 1 or m < 1:
        raise ValueError(f"need at least one sample a side, got {n} and {m}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    counts = _u_counts(n, m)
    total = sum(counts)
    cum, k = 0, 0
    for u, c in enumerate(counts):
        cum += c
        if cum / total > alpha / 2:
            break
        k = u + 1
    return k


@dataclass(frozen=True)
class Speedup:
    """A over B: Hodges-Lehmann ratio, the ratio of medians, and the interval (`low`, `high`)."""

    ratio: float
    median_ratio: float
    low: float
    high: float
    confidence: float  # the interval's exact coverage under the null (NaN without an interval)

    def to_dict(self) -> dict:
        return {"ratio": self.ratio, "median_ratio": self.median_ratio, "low": self.low, "high": self.high,
                "confidence": self.confidence}


def speedup(a: Sequence[float], b: Sequence[float], alpha: float = 0.05) -> Speedup:
    """How many times faster A's rounds are than B's (both positive rates, e.g. tokens/s)."""
    a, b = list(a), list(b)
    if not a or not b:
        raise ValueError("speedup: need at least one round of each side")
    if min(a) <= 0 or min(b) <= 0:
        raise ValueError(f"speedup: rates must be positive, got min {min(a)} and {min(b)}")
    diffs = sorted(math.log(x) - math.log(y) for x in a for y in b)
    hl = math.exp(statistics.median(diffs))
    med = statistics.median(a) / statistics.median(b)
    k = mann_whitney_k(len(a), len(b), alpha)
    if k == 0:
        return Speedup(hl, med, math.nan, math.nan, math.nan)
    counts = _u_counts(len(a), len(b))
    tail = sum(counts[:k]) / sum(counts)
    return Speedup(hl, med, math.exp(diffs[k - 1]), math.exp(diffs[-k]), 1 - 2 * tail)


def summarize(values: Sequence[float]) -> dict:
    """median, min, max, spread (max/min) and the samples themselves."""
    vals = list(values)
    if not vals:
        return {"median": math.nan, "min": math.nan, "max": math.nan, "spread": math.nan, "rounds": []}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "spread": spread(vals),
            "rounds": vals}
