"""Metric gate: thresholds held, a missing figure is an error naming it, extras recorded."""

from __future__ import annotations

from kdtree.gates.base import GateContext, Outcome, run_check
from kdtree.gates.metric import check_metric
from kdtree.gates.spec import MetricGateSpec, Threshold

SPEC = MetricGateSpec(name="toy-metric", thresholds=[
    Threshold(figure="contiguity", op=">=", value=0.9),
    Threshold(figure="copied_bytes", op="<=", value=1e6, unit=" B"),
])


def test_all_within_passes_and_extras_are_recorded():
    r = check_metric(SPEC, {"contiguity": 0.95, "copied_bytes": 10.0, "runs": 3}, GateContext())
    assert r.outcome is Outcome.PASSED
    assert r.key_figure().name == "contiguity"
    extra = next(f for f in r.figures if f.name == "runs")
    assert extra.value == 3 and extra.threshold is None


def test_a_miss_fails():
    r = check_metric(SPEC, {"contiguity": 0.5, "copied_bytes": 10.0}, GateContext())
    assert r.outcome is Outcome.FAILED and "contiguity" in r.summary


def test_missing_figure_is_an_error_naming_it():
    r = check_metric(SPEC, {"contiguity": 0.95}, GateContext())
    assert r.outcome is Outcome.ERROR
    assert "copied_bytes" in r.summary and r.details["missing"] == ["copied_bytes"]


def test_nan_fails_and_non_number_is_an_error():
    r = check_metric(SPEC, {"contiguity": float("nan"), "copied_bytes": 1.0}, GateContext())
    assert r.outcome is Outcome.FAILED and "not a number" in r.summary
    r = check_metric(SPEC, {"contiguity": "high", "copied_bytes": 1.0}, GateContext())
    assert r.outcome is Outcome.ERROR and "contiguity" in r.summary


def test_run_check_turns_an_exception_into_error():
    def check(spec, ctx):
        raise ZeroDivisionError("figure computation broke")

    r = run_check(SPEC, check, GateContext())
    assert r.outcome is Outcome.ERROR and "ZeroDivisionError" in r.summary and r.traceback


def test_run_check_via_metric_passes_through():
    r = run_check(SPEC, lambda spec, ctx: check_metric(spec, {"contiguity": 1.0, "copied_bytes": 0.0}, ctx),
                  GateContext())
    assert r.outcome is Outcome.PASSED and r.duration_s >= 0
