"""The decode benchmark's statistics against known samples: Mann-Whitney critical values from the
published two-sided 5 % tables, the Hodges-Lehmann ratio and its interval, spread and medians."""

from __future__ import annotations

import math

import pytest

from kdtree.bench.decode_stats import mann_whitney_k, speedup, spread, summarize


@pytest.mark.parametrize("n,m,critical_u", [(4, 4, 0), (5, 5, 2), (6, 6, 5), (7, 7, 8), (8, 8, 13), (10, 10, 23),
                                            (5, 8, 6), (3, 10, 3), (3, 5, 0)])
def test_interval_rank_is_the_tables_critical_u_plus_one(n, m, critical_u):
    assert mann_whitney_k(n, m) == critical_u + 1
    assert mann_whitney_k(m, n) == critical_u + 1


def test_no_interval_below_four_rounds_a_side():
    assert mann_whitney_k(3, 3) == 0
    s = speedup([2.0, 2.1, 1.9], [1.0, 1.1, 0.9])
    assert math.isnan(s.low) and math.isnan(s.high) and s.ratio == pytest.approx(2.0, rel=0.06)


def test_hodges_lehmann_ratio_and_interval_of_known_samples():
    a = [10.0, 11.0, 12.0, 13.0, 14.0]
    b = [5.0, 5.5, 6.0, 6.5, 7.0]  # exactly a / 2 elementwise
    s = speedup(a, b)
    assert s.ratio == pytest.approx(2.0)  # the median of the 25 pairwise log ratios
    assert s.median_ratio == pytest.approx(12.0 / 6.0)
    ratios = sorted(x / y for x in a for y in b)
    assert s.low == pytest.approx(ratios[2]) and s.high == pytest.approx(ratios[-3])  # k = 3 for 5 and 5
    assert s.low < s.ratio < s.high
    assert s.confidence == pytest.approx(1 - 2 * 4 / 252)  # P(U <= 2) = 4 / C(10, 5)


def test_speedup_is_symmetric_on_the_log_scale():
    a, b = [3.0, 3.3, 2.9, 3.1, 3.2], [1.0, 1.2, 0.9, 1.1, 1.05]
    there, back = speedup(a, b), speedup(b, a)
    assert there.ratio * back.ratio == pytest.approx(1.0)
    assert there.low * back.high == pytest.approx(1.0) and there.high * back.low == pytest.approx(1.0)


def test_an_interval_excludes_one_only_for_a_real_difference():
    same = speedup([1.0, 1.02, 0.98, 1.01, 0.99], [1.01, 0.99, 1.0, 0.97, 1.03])
    assert same.low < 1.0 < same.high
    faster = speedup([3.0, 3.1, 2.9, 3.05, 2.95], [1.0, 1.02, 0.98, 1.01, 0.99])
    assert faster.low > 2.5


def test_spread_and_summary():
    assert spread([77.0, 50.0]) == pytest.approx(1.54)
    assert spread([5.0]) == 1.0 and math.isnan(spread([])) and math.isnan(spread([1.0, 0.0]))
    got = summarize([3.0, 1.0, 2.0])
    assert got == {"median": 2.0, "min": 1.0, "max": 3.0, "spread": 3.0, "rounds": [3.0, 1.0, 2.0]}


def test_bad_samples_are_refused():
    with pytest.raises(ValueError, match="positive"):
        speedup([1.0, -1.0], [1.0])
    with pytest.raises(ValueError, match="at least one round"):
        speedup([], [1.0])
    with pytest.raises(ValueError, match="alpha"):
        mann_whitney_k(5, 5, alpha=1.5)
