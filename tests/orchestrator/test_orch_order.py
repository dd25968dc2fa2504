"""Plan order: a later phase refuses while an earlier one is not passed-and-fresh; --force; `run` alone."""

from __future__ import annotations

import json


def test_later_phase_refuses_while_earlier_pending(project):
    res = project.cli("run", "p2", "--device", "cpu", expect=2)
    assert "p2 is blocked by p1, which is pending" in res.stderr
    assert "--force" in res.stderr
    assert project.records("p2") == []


def test_later_phase_refuses_while_earlier_failed(project):
    project.knobs(p1={"speed": "fail"})
    project.cli("run", "p1", "--device", "cpu", expect=1)
    res = project.cli("run", "p2", "--device", "cpu", expect=2)
    assert "blocked by p1, which is failed" in res.stderr


def test_force_runs_and_records_that_it_was_forced(project):
    res = project.cli("run", "p2", "--device", "cpu", "--force", expect=0)
    assert "forced past p1" in res.stdout
    (path,) = project.records("p2")
    rec = json.loads(path.read_text())
    assert rec["forced"] is True and rec["forced_over"] == ["p1"]
    assert project.phase("p2")["last_run"]["forced"] is True


def test_passing_earlier_phase_unblocks_the_next(project):
    project.cli("run", "p1", "--device", "cpu", expect=0)
    project.cli("run", "p2", "--device", "cpu", expect=0)
    rec = json.loads(project.records("p2")[0].read_text())
    assert rec["forced"] is False and rec["forced_over"] == []


def test_run_without_phase_runs_in_order_from_first_not_passed(project):
    res = project.cli("run", "--device", "cpu", expect=0)
    assert len(project.records("p1")) == 1 and len(project.records("p2")) == 1
    assert res.stdout.index("p1: passed") < res.stdout.index("p2: passed")
    res = project.cli("run", "--device", "cpu", expect=0)
    assert "nothing to run" in res.stdout
    assert len(project.records("p1")) == 1


def test_run_without_phase_stops_at_first_that_does_not_pass(project):
    project.knobs(p1={"exact": "fail"})
    res = project.cli("run", "--device", "cpu", expect=1)
    assert "stopping: p1 did not pass" in res.stdout
    assert project.records("p2") == []


def test_run_without_phase_starts_after_passed_phases(project):
    project.cli("run", "p1", "--device", "cpu")
    project.cli("run", "--device", "cpu")
    assert len(project.records("p1")) == 1 and len(project.records("p2")) == 1


def test_unknown_phase_and_gate_are_refused(project):
    res = project.cli("run", "p9", "--device", "cpu", expect=2)
    assert "unknown phase 'p9'" in res.stderr and "p1, p2" in res.stderr
    res = project.cli("run", "p1", "--gate", "nope", "--device", "cpu", expect=2)
    assert "no gate 'nope'" in res.stderr and "speed, exact" in res.stderr
    res = project.cli("run", "--gate", "speed", expect=2)
    assert "need a PHASE" in res.stderr
