"""Specs fail at load with the field path; the project's own phases load and are honest."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kdtree.gates.base import GateContext, Outcome, run_check
from kdtree.orchestrator.plan import load_plan, read_plan_spec
from kdtree.orchestrator.specs import PlanSpec

PROJECT_PLAN = read_plan_spec(__import__("pathlib").Path(__file__).resolve().parents[2])  # this repository's own plan


def test_bad_threshold_in_a_phase_spec_names_the_field(project):
    path = project.root / project.pkg / "p1.py"
    path.write_text(path.read_text().replace('op=">="', 'op="=>"'))
    res = project.cli("status", expect=2)
    assert f"phase module {project.pkg}.p1: bad SPEC ({path}:" in res.stderr
    assert "Threshold.op: Input should be '>='" in res.stderr


def test_bad_spec_given_as_data_names_the_full_field_path(project):
    path = project.root / project.pkg / "p1.py"
    path.write_text(path.read_text() + """
SPEC = {"id": "p1", "title": "alpha", "objective": "o", "inputs": ["src/p1/**"],
        "gates": [{"kind": "metric", "name": "speed",
                   "thresholds": [{"figure": "speedup", "op": "=>", "value": 3}]},
                  {"kind": "metric", "name": "exact", "thresholds": []}]}
""")
    res = project.cli("status", expect=2)
    assert "gates.0.metric.thresholds.0.op: Input should be" in res.stderr
    assert "gates.1.metric.thresholds: List should have at least 1 item" in res.stderr


def test_unknown_field_in_a_phase_spec_is_rejected(project):
    path = project.root / project.pkg / "p1.py"
    path.write_text(path.read_text().replace('objective="test phase p1",',
                                             'objective="test phase p1", inputz=[],'))
    res = project.cli("status", expect=2)
    assert "inputz" in res.stderr and "Extra inputs are not permitted" in res.stderr


def test_checks_for_unknown_gates_are_rejected(project):
    path = project.root / project.pkg / "p1.py"
    path.write_text(path.read_text().replace('"exact": check_exact,', '"exakt": check_exact,'))
    res = project.cli("status", expect=2)
    assert "CHECKS has ['exakt']" in res.stderr


def test_bad_plan_table_names_the_field(project):
    py = project.root / "pyproject.toml"
    py.write_text(py.read_text().replace("markdown =", "markdwn ="))
    res = project.cli("status", expect=2)
    assert "tool.orchestrate.markdwn" in res.stderr and "tool.orchestrate.markdown" in res.stderr


def test_missing_phase_module_is_a_clear_error(project):
    py = project.root / "pyproject.toml"
    py.write_text(py.read_text().replace(f'"{project.pkg}.p2"', '"nowhere.p2"'))
    res = project.cli("status", expect=2)
    assert "phase module nowhere.p2 cannot be imported" in res.stderr


def test_plan_spec_rejects_absolute_paths_and_duplicates():
    with pytest.raises(ValidationError, match="markdown"):
        PlanSpec(id="x", markdown="/etc/plan.md", phases=["a"])
    with pytest.raises(ValidationError, match="listed twice"):
        PlanSpec(id="x", markdown="p.md", phases=["a", "a"])


def test_this_projects_pyproject_names_its_four_phases_in_order(tmp_path):
    plan = load_plan(tmp_path, is_git=False, spec=PROJECT_PLAN)
    assert [(p.id, p.spec.title) for p in plan.phases] == [
        ("phase1", "kernel"), ("phase2", "backend"), ("phase3", "graph capture"), ("phase4", "defrag")]
    assert PROJECT_PLAN.markdown == "plans/0002-sm120-verify-kernel-defrag.md"
    p1 = plan.phase("phase1").spec
    assert [g.name for g in p1.gates] == ["build", "build_sm90a", "accuracy", "token_exact", "speedup",
                                          "speedup_naive", "scatter", "sanitizer"]
    speed = p1.gate("speedup")
    # Thresholds (the phase is done): 3x the Triton baseline on every config at L >= 32k.
    assert (speed.min_median_speedup, speed.min_each_speedup, speed.min_roofline_median,
            speed.min_roofline_each) == (3, 3, None, None)
    naive = p1.gate("speedup_naive")
    assert (naive.min_median_speedup, naive.min_each_speedup) == (1.5, 1.0)
    assert p1.gate("scatter").thresholds[0].value == 1.05
    # Targets (best in the field, never blocking); the earlier thresholds are kept as targets.
    goals = {(t.figure, t.op, t.value) for t in speed.targets}
    assert goals == {("fa2_min_speedup", ">=", 1.0), ("fa2_median_speedup", ">=", 1.25),
                     ("median_roofline", ">=", 0.36), ("median_speedup", ">=", 20.0),
                     ("min_speedup", ">=", 5.0), ("median_roofline", ">=", 0.5),
                     ("min_roofline", ">=", 0.35), ("fa3_min_speedup_tc", ">=", 1.0),
                     ("fa3_median_speedup", ">=", 1.15), ("median_roofline", ">=", 0.75),  # issue 35
                     ("flashmla_median_speedup", ">=", 0.9),
                     ("sm120_path_fa2_sm120smem_median_speedup", ">=", 2.0),  # the sm_120 path (issue 35)
                     ("sm120_path_median_speedup", ">=", 12.0)}
    assert {(t.figure, t.op, t.value) for t in naive.targets} == {("median_speedup", ">=", 2.0)}
    assert p1.gate("build").max_shared_bytes == 101376
    hopper = p1.gate("build_sm90a")  # issue 17: the wgmma variant's own resources, sm_90's limit
    assert (hopper.archs, hopper.max_shared_bytes, hopper.required_sass) == (["sm_90a"], 232448, ["HGMMA"])


def test_every_project_gate_without_its_work_reports_not_implemented(tmp_path):
    plan = load_plan(tmp_path, is_git=False, spec=PROJECT_PLAN)
    for phase in plan.phases:
        if phase.id in ("phase1", "phase4"):  # their work exists; tests/phases covers their gates
            continue
        for gate in phase.spec.gates:
            result = run_check(gate, phase.checks.get(gate.name), GateContext(device="cpu"))
            assert result.outcome in (Outcome.NOT_IMPLEMENTED, Outcome.SKIPPED), (phase.id, gate.name)
            assert result.outcome is not Outcome.PASSED
