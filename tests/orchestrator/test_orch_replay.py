"""`orchestrate replay`: a recorded run's seeds come back to the gate in order; nothing is recorded."""

from __future__ import annotations

import json

import pytest

from orch_project import make_project

# A gate whose outcome depends on its random draws only: it fails when the first seed is odd.
DRAWS_GATE = 'MetricGateSpec(name="draws", thresholds=[Threshold(figure="odd_first", op="==", value=0)]),'
DRAWS_CHECK = '''"draws": lambda spec, ctx: verdict(spec.name, spec.kind, [Figure(
    name="odd_first", value=[ctx.fresh_seed(), ctx.fresh_seed()][0] % 2, threshold=0, op="==", key=True)]),'''


@pytest.fixture
def project(tmp_path):
    proj = make_project(tmp_path / "repo", extra_gate=DRAWS_GATE, extra_checks=DRAWS_CHECK)
    yield proj
    proj.forget_modules()


def _recorded(project) -> dict:
    record = json.loads(project.records("p1")[-1].read_text())
    return next(r for r in record["results"] if r["gate"] == "draws")


def test_a_run_records_the_seeds_each_gate_drew(project):
    project.cli("run", "p1", "--device", "cpu", expect=None)
    draws = _recorded(project)
    seeds = draws["details"]["seeds_drawn"]
    assert len(seeds) == 2 and all(isinstance(s, int) for s in seeds)
    assert draws["figures"][0]["value"] == seeds[0] % 2


def test_replay_hands_the_recorded_seeds_back_and_records_nothing(project):
    project.cli("run", "p1", "--device", "cpu", expect=None)
    seeds = _recorded(project)["details"]["seeds_drawn"]
    before = project.records("p1")
    run_id = json.loads(before[-1].read_text())["run_id"]
    expected_exit = 0 if seeds[0] % 2 == 0 else 1
    res = project.cli("replay", "p1", "draws", "--run", run_id[:20], "--device", "cpu", "--json",
                      expect=expected_exit)
    replayed = json.loads(res.stdout)
    assert replayed["details"]["seeds_drawn"] == seeds
    assert project.records("p1") == before  # not recorded


def test_replay_with_given_seeds_decides_by_them(project):
    assert project.cli("replay", "p1", "draws", "--seed", "4", "--seed", "7", "--device", "cpu",
                       expect=0).stdout.count("replay, not recorded") == 1
    res = project.cli("replay", "p1", "draws", "--seed", "5", "--device", "cpu", expect=1)
    assert "the gate drew 2 seeds and 1 were given" in res.stderr


def test_replay_refuses_what_it_cannot_do(project):
    res = project.cli("replay", "p1", "draws", "--device", "cpu", expect=2)
    assert "--run RUN_ID" in res.stderr
    res = project.cli("replay", "p1", "draws", "--run", "nope", "--device", "cpu", expect=2)
    assert "has no run 'nope'" in res.stderr
    res = project.cli("replay", "p1", "nogate", "--seed", "1", "--device", "cpu", expect=2)
    assert "has no gate 'nogate'" in res.stderr
    project.cli("run", "p1", "--device", "cpu", expect=None)
    run_id = json.loads(project.records("p1")[-1].read_text())["run_id"]
    res = project.cli("replay", "p1", "speed", "--run", run_id, "--device", "cpu", expect=2)
    assert "gate 'speed' drew no random seeds, so there is nothing to replay" in res.stderr
    assert "`orchestrate run p1 --gate speed`" in res.stderr and "before seeds were kept" not in res.stderr
