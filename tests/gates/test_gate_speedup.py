"""The speedup gate judges samples it is handed (`kdtree.bench.speed.SpeedMeasurement`): no timer,
no callable runs here."""

from __future__ import annotations

import math

import pytest

from kdtree.bench.speed import ConfigSamples, SpeedMeasurement
from kdtree.gates.base import Outcome
from kdtree.gates.spec import SpeedupGateSpec
from kdtree.gates.speedup import judge_speedup

SPEC = SpeedupGateSpec(name="toy-speed", baseline="toy-baseline", min_median_speedup=2.0, min_each_speedup=1.5,
                       trials=2, warmup=2, repeats=5)


def samples(name, cand, base, **kw):
    return ConfigSamples(config=name, params={}, seeds=[1, 2], input_sets=2, agree_rel_l2=0.0, timed=True,
                         seconds={"": cand, "baseline": base}, last_call_rel_l2={"": 0.0}, **kw)


def fig(result, name):
    return next(f for f in result.figures if f.name == name)


def test_speedups_are_ratios_of_medians_held_to_the_spec():
    m = SpeedMeasurement([samples("a", [1.0, 1.0, 9.0], [3.0, 3.0, 3.0]), samples("b", [1.0], [1.8])],
                         timer="scripted", lead_s=0.0, others=[])
    r = judge_speedup(SPEC, m)
    assert fig(r, "median_speedup").value == pytest.approx(2.4) and fig(r, "min_speedup").value == pytest.approx(1.8)
    assert r.outcome is Outcome.PASSED and r.details["timer"] == "scripted"
    assert r.details["configs"][0]["candidate"] == {"median_ms": 1e3, "min_ms": 1e3, "max_ms": 9e3}


def test_disagreeing_stale_and_impossible_configs_are_judged_from_the_samples():
    disagree = ConfigSamples(config="d", params={}, seeds=[1], input_sets=1, agree_rel_l2=math.nan)
    stale = samples("s", [1.0], [3.0])
    stale.last_call_rel_l2[""] = 0.5
    r = judge_speedup(SPEC, SpeedMeasurement([disagree, stale], timer="t", lead_s=0.0, others=[]))
    assert fig(r, "disagreeing_configs").value == 1 and fig(r, "stale_configs").value == 1
    assert r.outcome is Outcome.FAILED
    fast = samples("f", [1.0], [3.0], floor_s=2.0)
    assert judge_speedup(SPEC, SpeedMeasurement([fast], timer="t", lead_s=0.0, others=[])).outcome is Outcome.ERROR
