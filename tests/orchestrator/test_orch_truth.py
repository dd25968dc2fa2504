"""A record means what it says, whatever the gate prints, the clock says or a hand edits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from orch_project import git, make_project


def _orchestrate(project, *args: str, cwd: Path | None = None, shell_tail: str = "") -> subprocess.CompletedProcess:
    """``orchestrate ARGS`` as a user runs it, in a shell (``shell_tail``: e.g. ``| head -1``)."""
    project.forget_modules()
    cmd = " ".join([sys.executable, "-m", "kdtree.orchestrator", *args])
    script = f"{cmd} {shell_tail}; echo \"rc=${{PIPESTATUS[0]}}\" >&2"
    return subprocess.run(["bash", "-c", script], cwd=cwd or project.root, capture_output=True, text=True,
                          timeout=120)


def _rc(out: subprocess.CompletedProcess) -> int:
    return int(out.stderr.strip().rsplit("rc=", 1)[1])


def _record(project, phase: str, index: int = -1) -> tuple[Path, dict]:
    path = project.records(phase)[index]
    return path, json.loads(path.read_text())


@pytest.mark.slow
def test_a_chatty_gate_into_a_closed_pipe_is_still_a_pass_and_its_output_is_in_the_log(project):
    project.knobs(p1={"speed": "print"})
    out = _orchestrate(project, "run", "p1", "--device", "cpu", shell_tail="| head -1")
    assert _rc(out) == 0, out.stderr
    assert "Traceback" not in out.stderr
    assert "gate line" not in out.stdout
    _, rec = _record(project, "p1")
    assert rec["state"] == "passed"
    assert [r["outcome"] for r in rec["results"]] == ["passed", "passed"]
    log = project.root / rec["log"]
    assert rec["log"] == f"plans/results/p1/{rec['run_id']}.log"
    text = log.read_text()
    assert "gate line 2999" in text and "to stderr" in text
    assert "fd-level line" in text and "child line" in text
    assert "===== gate speed" in text


def test_the_gates_output_never_reaches_the_commands_stdout(project):
    project.knobs(p1={"speed": "print"})
    res = project.cli("run", "p1", "--device", "cpu")
    assert "gate line" not in res.output
    _, rec = _record(project, "p1")
    assert f"gate output in {rec['log']}" in res.stdout
    assert "gate line 0" in (project.root / rec["log"]).read_text()


def test_a_run_that_prints_nothing_names_no_log(project):
    project.cli("run", "p1", "--device", "cpu")
    _, rec = _record(project, "p1")
    assert rec["log"] is None
    assert not list((project.root / "plans/results/p1").glob("*.log"))


def test_numpy_bytes_and_objects_in_details_are_recorded_with_a_warning(project):
    project.knobs(p1={"speed": "numpy"})
    res = project.cli("run", "p1", "--device", "cpu")
    assert "Traceback" not in res.output
    assert "warning: gate 'speed' returned values JSON cannot hold" in res.stderr
    assert "speed.details.blob (bytes)" in res.stderr and "speed.details.obj (object)" in res.stderr
    _, rec = _record(project, "p1")
    details = rec["results"][0]["details"]
    assert details["count"] == 7 and details["rows"] == [0, 1, 2] and details["mean"] == 0.5
    assert details["blob"].startswith("b'") and details["obj"].startswith("<object object")
    assert project.phase("p1")["state"] == "passed"


def test_a_record_that_cannot_be_built_after_the_gates_is_rescued(project, tmp_path, monkeypatch):
    from kdtree.orchestrator import runner

    monkeypatch.setenv("ORCHESTRATE_RESCUE_DIR", str(tmp_path / "rescue"))
    monkeypatch.setattr(runner, "evaluate_targets", lambda *a: (_ for _ in ()).throw(ValueError("boom")))
    res = project.cli("run", "p1", "--device", "cpu", expect=4)
    assert "no record could be made" in res.stderr and "ValueError: boom" in res.stderr
    (saved,) = (tmp_path / "rescue" / "p1").glob("*.json")
    data = json.loads(saved.read_text())
    assert [r["outcome"] for r in data["results"]] == ["passed", "passed"]
    assert str(saved) in res.stderr
    assert project.records("p1") == []


def _shift(path: Path, rec: dict, days: float, drop_seq: bool = False) -> None:
    for key in ("started_at", "ended_at"):
        when = datetime.fromisoformat(rec[key].replace("Z", "+00:00"))
        rec[key] = (when + timedelta(days=days)).isoformat()
    if drop_seq:
        rec.pop("seq", None)
        rec["schema_version"] = 2
    path.write_text(json.dumps(rec, indent=2))


@pytest.mark.parametrize("drop_seq", [False, True], ids=["with-seq", "legacy-record"])
def test_a_record_from_a_clock_a_day_ahead_does_not_outrank_later_runs(project, drop_seq):
    project.cli("run", "p1", "--device", "cpu")
    path, rec = _record(project, "p1")
    _shift(path, rec, days=1, drop_seq=drop_seq)
    project.commit_all("a record from a host whose clock ran ahead")
    project.write("src/p1/code.py", "x = 2\n")
    project.knobs(p1={"exact": "fail"})
    res = project.cli("run", "p1", "--device", "cpu", expect=1)
    assert "starts in the future" in res.stderr and "sequence number" in res.stderr
    st = project.phase("p1")
    assert st["state"] == "failed"  # the newer run decides, not the one dated tomorrow
    assert st["last_run"]["run_id"] != rec["run_id"]
    project.knobs()
    project.cli("run", "p1", "--device", "cpu")
    assert project.phase("p1")["state"] == "passed"


def test_sequence_numbers_grow_across_phases(project):
    project.cli("run", "p1", "--device", "cpu")
    project.cli("run", "p2", "--device", "cpu")
    project.cli("run", "p1", "--device", "cpu")
    seqs = [json.loads(p.read_text())["seq"] for ph in ("p1", "p2") for p in project.records(ph)]
    assert sorted(seqs) == [1, 2, 3]


def test_a_hand_edited_pass_whose_figure_misses_is_damaged(project):
    project.knobs(p1={"exact": "fail"})
    project.cli("run", "p1", "--device", "cpu", expect=1)
    path, rec = _record(project, "p1")
    rec["state"] = "passed"
    rec["results"][1]["outcome"] = "passed"
    path.write_text(json.dumps(rec, indent=2))
    before = path.read_bytes()
    res = project.cli("status", expect=2)
    assert f"run record {path} is damaged" in res.stderr
    assert "recorded as passed but its figure mismatches 2 == 0 (miss) misses its threshold" in res.stderr
    res = project.cli("checkpoint", "--commit", expect=2)
    assert "is damaged" in res.stderr
    assert path.read_bytes() == before


def test_a_hand_edited_threshold_is_damaged(project):
    project.knobs(p1={"exact": "fail"})
    project.cli("run", "p1", "--device", "cpu", expect=1)
    path, rec = _record(project, "p1")
    rec["state"] = "passed"
    rec["results"][1]["outcome"] = "passed"
    rec["results"][1]["figures"][0]["threshold"] = 2
    path.write_text(json.dumps(rec, indent=2))
    res = project.cli("status", expect=2)
    assert "against == 2 but the spec it ran under says == 0" in res.stderr


def test_a_check_that_claims_a_pass_beside_a_missed_figure_is_recorded_failed(tmp_path):
    proj = make_project(tmp_path / "repo", extra_gate=(
        'MetricGateSpec(name="liar", thresholds=[Threshold(figure="errors", op="==", value=0)]),'),
        extra_checks='"liar": lambda spec, ctx: GateResult(gate="liar", kind="metric", outcome=Outcome.PASSED, '
                     'figures=[Figure(name="errors", value=3, threshold=0, op="==", key=True), '
                     'Figure(name="other", value=1, threshold=0, op=">=")])')
    try:
        proj.cli("run", "p1", "--device", "cpu", expect=1)
        _, rec = _record(proj, "p1")
        liar = rec["results"][2]
        assert liar["outcome"] == "failed" and "errors 3 == 0 (miss)" in liar["summary"]
        assert proj.phase("p1")["state"] == "failed"
    finally:
        proj.forget_modules()


def _tool_project(tmp_path):
    return make_project(tmp_path / "repo", extra_gate=(
        'MetricGateSpec(name="gpu", requires=["exe:orchtool-gpu"], '
        'thresholds=[Threshold(figure="speedup", op=">=", value=3.0, unit="x")]),'),
        extra_checks='"gpu": check_speed')


def test_a_newer_run_that_failed_a_gate_and_skipped_another_decides(tmp_path, monkeypatch):
    proj = _tool_project(tmp_path)
    try:
        tools = tmp_path / "bin"
        tools.mkdir()
        (tools / "orchtool-gpu").write_text("#!/bin/sh\n")
        (tools / "orchtool-gpu").chmod(0o755)
        monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
        proj.cli("run", "p1", "--device", "cpu")  # the machine with the tool: every gate ran
        monkeypatch.setenv("PATH", os.environ["PATH"].split(os.pathsep, 1)[1])
        proj.knobs(p1={"exact": "fail"})
        proj.cli("run", "p1", "--device", "cpu", expect=1)  # no tool: gpu skipped, exact failed
        st = proj.phase("p1")
        assert st["state"] == "failed"
        failing = proj.records("p1")[-1].stem
        assert st["last_run"]["run_id"] == failing
        shown = proj.cli("status").stdout
        assert "failed" in shown.split("\n", 3)[1]
        # a later run that skipped the gate but passed the rest does not hide the failure either
        proj.knobs()
        proj.cli("run", "p1", "--device", "cpu", expect=3)
        assert proj.phase("p1")["state"] == "failed"
    finally:
        proj.forget_modules()


def test_a_record_from_a_newer_orchestrate_names_the_upgrade_and_spares_other_phases(project):
    project.cli("run", "p1", "--device", "cpu")
    project.cli("run", "p2", "--device", "cpu")
    path, rec = _record(project, "p2")
    rec["schema_version"] = 99
    rec["new_field"] = {"from": "the future"}
    path.write_text(json.dumps(rec, indent=2))
    res = project.cli("status")
    assert "written by a newer orchestrate (schema 99" in res.stdout and "upgrade" in res.stdout
    st = project.status()
    p1, p2 = st["phases"]
    assert p1["state"] == "passed" and p2["state"] == "error" and "schema 99" in p2["unreadable"]
    project.cli("run", "p1", "--device", "cpu")  # the other phase still runs and is recorded
    assert len(project.records("p1")) == 2
    res = project.cli("history", "p2", expect=2)
    assert "written by a newer orchestrate" in res.stderr


def test_a_gate_runs_in_the_project_root_whatever_folder_the_command_was_typed_in(project):
    project.knobs(p1={"speed": "cwd"})
    out = _orchestrate(project, "run", "p1", "--device", "cpu", cwd=project.root / "src" / "p1")
    assert _rc(out) == 0, out.stdout + out.stderr
    _, rec = _record(project, "p1")
    assert rec["state"] == "passed"


def test_a_gate_changing_the_environment_does_not_reach_the_orchestrators_git(project):
    before = dict(os.environ)
    project.knobs(p1={"speed": "env"})
    project.cli("run", "p1", "--device", "cpu")
    assert dict(os.environ) == before
    _, rec = _record(project, "p1")
    assert rec["state"] == "passed" and not rec["inputs_changed_during_run"]
    assert rec["git"]["sha"] == git(project.root, "rev-parse", "HEAD").strip()


def test_a_gate_past_its_time_limit_is_a_timeout_never_a_pass(project):
    project.knobs(p1={"speed": "sleep"})
    res = project.cli("run", "p1", "--device", "cpu", "--gate-timeout", "0.5", expect=1)
    assert "timeout" in res.stdout
    _, rec = _record(project, "p1")
    assert rec["results"][0]["outcome"] == "timeout" and rec["state"] == "error"
    assert "time limit of 0.5 s" in rec["results"][0]["summary"]
    assert project.phase("p1")["state"] == "error"


def test_the_plans_default_gate_timeout_applies(project):
    text = (project.root / "pyproject.toml").read_text()
    project.write("pyproject.toml", text + "gate_timeout_s = 0.5\n")
    project.commit_all("a default time limit")
    project.knobs(p1={"exact": "sleep"})
    project.cli("run", "p1", "--device", "cpu", expect=1)
    _, rec = _record(project, "p1")
    assert [r["outcome"] for r in rec["results"]] == ["passed", "timeout"]


@pytest.mark.slow
def test_a_gate_that_runs_orchestrate_is_refused_not_deadlocked(project):
    project.knobs(p1={"speed": "nested"})
    out = _orchestrate(project, "--repo", str(project.root), "run", "p1", "--device", "cpu",
                       "--gate-timeout", "100")
    assert _rc(out) == 0, out.stdout + out.stderr
    _, rec = _record(project, "p1")
    log = (project.root / rec["log"]).read_text()
    assert "nested exit 2" in log and "an ancestor of this process" in log


def _immutable(path: Path) -> bool:
    return subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0


def test_an_immutable_plan_is_a_message_from_plan_and_checkpoint(project):
    project.cli("run", "p1", "--device", "cpu")
    plan = project.plan_path
    project.cli("plan")
    project.write("src/p1/code.py", "x = 5\n")
    project.commit_all("new code")
    project.cli("run", "p1", "--device", "cpu")
    plan.write_text(plan.read_text().replace("| p1 |", "| p1 (edited) |"))  # out of date
    if not _immutable(plan):
        pytest.skip("chattr +i is not available here (needs root and a file system that has it)")
    try:
        before = plan.read_bytes()
        changelog = (project.root / "CHANGELOG.md").read_bytes()
        res = project.cli("plan", expect=2)
        assert "cannot be written" in res.stderr and "chattr -i" in res.stderr
        assert "Traceback" not in res.output
        res = project.cli("checkpoint", "--commit", expect=2)
        assert "cannot be written" in res.stderr and "Nothing was written" in res.stderr
        assert plan.read_bytes() == before
        assert (project.root / "CHANGELOG.md").read_bytes() == changelog
    finally:
        subprocess.run(["chattr", "-i", str(plan)], check=True)


def test_a_bom_right_before_the_first_marker_is_kept_and_read(project):
    text = project.plan_path.read_text()
    blocks = text[text.index("<!-- orchestrate:begin status"):]
    project.plan_path.write_bytes("\ufeff".encode() + blocks.encode())
    project.cli("run", "p1", "--device", "cpu")
    data = project.plan_path.read_bytes()
    assert data.startswith("\ufeff<!-- orchestrate:begin status -->".encode())
    assert b"stale content" not in data
    project.cli("plan", "--check")


def test_the_commit_subject_names_the_phase_once_and_every_phase_it_holds(tmp_path):
    proj = make_project(tmp_path / "repo")
    try:
        path = proj.root / proj.pkg / "p2.py"
        path.write_text(path.read_text().replace('title="beta"', 'title="p2"'))
        proj.commit_all("p2's title is its id")
        proj.cli("run", "p1", "--device", "cpu")
        proj.cli("run", "p2", "--device", "cpu")
        proj.cli("checkpoint", "--commit")
        subject = git(proj.root, "log", "-1", "--format=%s").strip()
        assert subject == "checkpoint: p2 passed (2/2 gates); with p1 passed"
        body = git(proj.root, "log", "-1", "--format=%b")
        assert "Also in this commit: p1 run" in body
    finally:
        proj.forget_modules()
