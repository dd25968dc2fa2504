"""Gate targets: recorded met / not met / not measured with the margin, shown, never blocking."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kdtree.gates.base import Figure, GateResult, Outcome
from kdtree.gates.spec import Target
from kdtree.orchestrator.plan import load_plan, read_plan_spec
from kdtree.orchestrator.specs import RunRecord
from kdtree.orchestrator.store import ResultStore
from kdtree.orchestrator.targets import evaluate_target, shown_targets, target_text
from orch_project import make_project

PROJECT_PLAN = read_plan_spec(__import__("pathlib").Path(__file__).resolve().parents[2])  # this repository's own plan

TARGETS = ('Target(figure="speedup", op=">=", value=4.0, unit="x", note="easy"), '
           'Target(figure="speedup", op=">=", value=8.4, unit="x", note="best in the field"), '
           'Target(figure="fa2_speedup", op=">=", value=1.0, unit="x")')

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def targeted(tmp_path):
    proj = make_project(tmp_path / "repo", targets=TARGETS)
    yield proj
    proj.forget_modules()


def test_targets_are_recorded_with_status_and_margin_and_never_block(targeted):
    targeted.cli("run", "p1", "--device", "cpu")  # passes although a target is not met
    rec = json.loads(targeted.records("p1")[0].read_text())
    easy, best, fa2 = rec["targets"]
    assert (easy["status"], easy["measured"], easy["target"]) == ("met", 4.2, 4.0)
    assert easy["margin"] == pytest.approx(0.2) and easy["ratio"] == pytest.approx(1.05)
    assert (best["status"], best["measured"]) == ("not met", 4.2)
    assert best["margin"] == pytest.approx(-4.2) and best["ratio"] == pytest.approx(0.5)
    assert fa2["status"] == "not measured" and fa2["measured"] is None
    assert fa2["reason"] == "the gate recorded no figure 'fa2_speedup'"
    assert rec["state"] == "passed" and targeted.phase("p1")["state"] == "passed"
    targeted.cli("run", "p2", "--device", "cpu")  # a missed target blocks no later phase


def test_status_and_the_plan_show_the_targets(targeted):
    targeted.cli("run", "p1", "--device", "cpu")
    text = targeted.cli("status").stdout
    assert "target speedup 4.2x >= 8.4x: not met (-4.2x, 0.50 of the target)" in text
    assert "target speedup 4.2x >= 4x: met (+0.2x, 1.05x the target)" in text
    assert "target fa2_speedup >= 1x: not measured (the gate recorded no figure 'fa2_speedup')" in text
    plan = targeted.plan_path.read_text()
    assert "| speed | speedup >= 8.4x (best in the field) | 4.2x | not met | -4.2x (0.50 of the target) |" in plan
    assert "| speed | fa2_speedup >= 1x | — | not measured | the gate recorded no figure 'fa2_speedup' |" in plan
    js = targeted.phase("p1")["last_run"]["targets"]
    assert [t["status"] for t in js] == ["met", "not met", "not measured"]
    assert js[1]["text"] == "speedup 4.2x >= 8.4x: not met (-4.2x, 0.50 of the target)"


def test_a_failed_gate_is_still_measured_and_a_skipped_one_is_not(tmp_path):
    extra = ('MetricGateSpec(name="gpu", requires=["exe:no-such-tool-xyz"], '
             'thresholds=[Threshold(figure="f", op=">=", value=1)], '
             'targets=[Target(figure="f", op=">=", value=2)]),')
    proj = make_project(tmp_path / "r", extra_gate=extra, extra_checks='"gpu": check_speed',
                        targets='Target(figure="speedup", op=">=", value=1.0)')
    proj.knobs(p1={"speed": "fail"})
    proj.cli("run", "p1", "--device", "cpu", expect=1)
    speed, gpu = json.loads(proj.records("p1")[0].read_text())["targets"]
    assert (speed["status"], speed["measured"]) == ("met", 1.5)  # figures of a failed gate count
    assert gpu["status"] == "not measured"
    assert gpu["reason"] == "the gate was skipped: no-such-tool-xyz is not on PATH"
    proj.forget_modules()


def test_changing_a_target_makes_nothing_stale(targeted):
    targeted.cli("run", "p1", "--device", "cpu")
    path = targeted.root / targeted.pkg / "p1.py"
    path.write_text(path.read_text().replace("value=8.4", "value=9.9"))
    assert targeted.phase("p1")["state"] == "passed"
    path.write_text(path.read_text().replace("value=3.0", "value=3.5"))  # a threshold does
    assert targeted.phase("p1")["state"] == "stale"


@pytest.mark.parametrize("op, value, measured, status, margin, ratio", [
    (">=", 2.0, 3.0, "met", 1.0, 1.5),
    (">", 3.0, 3.0, "not met", 0.0, 1.0),
    ("<=", 1.05, 1.10, "not met", -0.05, 1.05 / 1.10),
    ("<", 2.0, 1.0, "met", 1.0, 2.0),
    ("==", 0.0, 2.0, "not met", -2.0, None),
])
def test_margin_and_ratio_follow_the_direction_of_the_target(op, value, measured, status, margin, ratio):
    result = GateResult(gate="g", kind="metric", outcome=Outcome.PASSED,
                        figures=[Figure(name="x", value=measured)])
    t = evaluate_target("g", Target(figure="x", op=op, value=value), result)
    assert t.status == status
    assert t.margin == pytest.approx(margin)
    assert (t.ratio is None) if ratio is None else t.ratio == pytest.approx(ratio)


@pytest.mark.parametrize("outcome, figures, reason", [
    (Outcome.ERROR, [Figure(name="x", value=9.0)], "the gate ended in error: boom"),
    (Outcome.NOT_IMPLEMENTED, [], "the gate was not-implemented: later"),
    (Outcome.PASSED, [Figure(name="x", value=float("nan"))], "the figure 'x' is NaN (nothing was measured)"),
])
def test_not_measured_says_why(outcome, figures, reason):
    result = GateResult(gate="g", kind="metric", outcome=outcome, figures=figures, summary="boom",
                        reason="later" if outcome is Outcome.NOT_IMPLEMENTED else None)
    t = evaluate_target("g", Target(figure="x", op=">=", value=1.0), result)
    assert (t.status, t.reason, t.margin) == ("not measured", reason, None)
    assert target_text(t) == f"x >= 1: not measured ({reason})"
    assert evaluate_target("g", Target(figure="x", op=">=", value=1.0), None).reason == \
        "the gate did not run in this run"


def test_every_committed_phase1_record_loads_and_shows_the_current_targets():
    """Records written before targets existed load, and the current targets are evaluated on them."""
    plan = load_plan(REPO_ROOT, True, PROJECT_PLAN)
    records = ResultStore(plan.results_path).records("phase1")
    assert len(records) >= 8 and all(r.schema_version >= 1 for r in records)
    old = [r for r in records if not r.targets]  # written before targets existed
    assert len(old) >= 8
    spec = plan.phase("phase1").spec
    targets, evaluated_now = shown_targets(old[-1], spec)
    assert evaluated_now
    by_goal = {(t.figure, t.target): t for t in targets}
    assert by_goal[("median_speedup", 20.0)].status == "not met"
    assert by_goal[("fa2_min_speedup", 1.0)].status == "not measured"
    assert by_goal[("median_speedup", 2.0)].gate == "speedup_naive"
    again = RunRecord.model_validate(json.loads(old[-1].model_dump_json()))
    assert again == old[-1]
