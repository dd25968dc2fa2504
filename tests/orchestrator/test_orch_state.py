"""Phase states: passed, failed, error, incomplete, stale (inputs / spec), pending; partial runs."""

from __future__ import annotations

import pytest

from orch_project import make_project


def test_pending_before_any_run(project):
    p1 = project.phase("p1")
    assert p1["state"] == "pending" and p1["last_run"] is None
    assert p1["gates"] == ["speed", "exact"]


def test_passed_then_stale_after_editing_an_input(project):
    project.cli("run", "p1", "--device", "cpu")
    assert project.phase("p1")["state"] == "passed"
    project.write("src/p1/code.py", "x = 2\n")
    p1 = project.phase("p1")
    assert p1["state"] == "stale" and not p1["passed_and_fresh"]
    assert any("input files changed" in r for r in p1["stale_reasons"])
    res = project.cli("run", "p2", "--device", "cpu", expect=2)
    assert "blocked by p1, which is stale" in res.stderr and "input files changed" in res.stderr


def test_a_stale_reason_names_the_input_files_changed_since_the_runs_commit(project):
    project.cli("run", "p1", "--device", "cpu")
    project.write("src/p1/code.py", "x = 2\n")  # edited
    project.write("src/p1/new.py", "z = 3\n")  # added, untracked
    project.write("src/p2/code.py", "y = 3\n")  # another phase's input: not named for p1
    (project.root / "src/p1/code.py").rename(project.root / "src/p1/moved.py")  # removed + added
    reason = next(r for r in project.phase("p1")["stale_reasons"] if "input files changed" in r)
    assert reason.endswith("src/p1/code.py, src/p1/moved.py, src/p1/new.py"), reason
    assert "since commit " in reason
    res = project.cli("run", "p2", "--device", "cpu", expect=2)
    assert "src/p1/new.py" in res.stderr  # the refusal says what changed


def test_new_input_file_makes_it_stale_but_an_ignored_one_does_not(project):
    project.cli("run", "p1", "--device", "cpu")
    project.write("src/p1/cache/build.bin", "ignored by .gitignore")
    assert project.phase("p1")["state"] == "passed"
    project.write("src/p1/new.py", "z = 3\n")
    assert project.phase("p1")["state"] == "stale"


def test_reverting_the_input_makes_it_fresh_again(project):
    project.cli("run", "p1", "--device", "cpu")
    project.write("src/p1/code.py", "x = 2\n")
    assert project.phase("p1")["state"] == "stale"
    project.write("src/p1/code.py", "x = 1\n")
    assert project.phase("p1")["state"] == "passed"


def test_stale_after_editing_a_spec_threshold(project):
    project.cli("run", "p1", "--device", "cpu")
    path = project.root / project.pkg / "p1.py"
    path.write_text(path.read_text().replace("value=3.0", "value=3.5"))
    p1 = project.phase("p1")
    assert p1["state"] == "stale"
    assert p1["stale_reasons"] and all("spec changed" in r for r in p1["stale_reasons"])
    project.cli("run", "p1", "--device", "cpu")
    p1 = project.phase("p1")
    assert p1["state"] == "passed"
    assert "speedup 4.2x >= 3.5x" in [g["key_figure"] for g in p1["last_run"]["gates"]]


@pytest.mark.parametrize("knob, state, outcome", [
    ("fail", "failed", "failed"),
    ("raise", "error", "error"),
])
def test_failed_and_error_states(project, knob, state, outcome):
    project.knobs(p1={"speed": knob})
    project.cli("run", "p1", "--device", "cpu", expect=1)
    p1 = project.phase("p1")
    assert p1["state"] == state
    speed = p1["last_run"]["gates"][0]
    assert speed["outcome"] == outcome
    if knob == "raise":
        assert "boom in speed" in speed["summary"]


def test_not_implemented_gate_fails_the_phase(tmp_path):
    extra = 'MetricGateSpec(name="later", thresholds=[Threshold(figure="f", op=">=", value=1)]),'
    proj = make_project(tmp_path / "r", extra_gate=extra)  # "later" has no entry in CHECKS
    proj.cli("run", "p1", "--device", "cpu", expect=1)
    p1 = proj.phase("p1")
    assert p1["state"] == "failed"
    assert p1["last_run"]["gates"][2]["outcome"] == "not-implemented"
    proj.forget_modules()


def test_skipped_gate_makes_the_phase_incomplete_never_passed(tmp_path):
    extra = ('MetricGateSpec(name="gpu", requires=["exe:no-such-tool-xyz"], '
             'thresholds=[Threshold(figure="f", op=">=", value=1)]),')
    proj = make_project(tmp_path / "r", extra_gate=extra, extra_checks='"gpu": check_speed')
    res = proj.cli("run", "p1", "--device", "cpu", expect=3)
    assert "p1: incomplete" in res.stdout
    assert proj.phase("p1")["state"] == "incomplete"
    res = proj.cli("run", "p2", "--device", "cpu", expect=2)
    assert "which is incomplete" in res.stderr
    proj.forget_modules()


def test_partial_run_is_recorded_but_does_not_decide_the_state(project):
    project.knobs(p1={"exact": "fail"})
    project.cli("run", "p1", "--device", "cpu", expect=1)
    project.knobs()
    res = project.cli("run", "p1", "--gate", "exact", "--device", "cpu", expect=0)
    assert "partial run" in res.stdout
    p1 = project.phase("p1")
    assert p1["state"] == "failed"  # from the latest full run
    assert p1["newer_partial_run"]["gates_selected"] == ["exact"]
    assert p1["newer_partial_run"]["partial"] is True
    text = project.cli("status").stdout
    assert "newer partial run" in text and "latest full run" in text


def test_partial_run_alone_leaves_phase_pending(project):
    project.cli("run", "p1", "--gate", "speed", "--device", "cpu")
    assert project.phase("p1")["state"] == "pending"
    project.cli("run", "p2", "--device", "cpu", expect=2)


@pytest.mark.parametrize("device_args, reason", [
    ((), "no CUDA GPU is visible (--device auto chose cpu; torch.cuda.is_available() is False)"),
    (("--device", "auto"),
     "no CUDA GPU is visible (--device auto chose cpu; torch.cuda.is_available() is False)"),
    (("--device", "cpu"), "the run was asked for --device cpu"),
])
def test_cuda_gate_skip_reason_tells_auto_from_an_explicit_cpu(tmp_path, monkeypatch, device_args, reason):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a machine with no GPU
    extra = ('MetricGateSpec(name="gpu", requires=["cuda"], '
             'thresholds=[Threshold(figure="f", op=">=", value=1)]),')
    proj = make_project(tmp_path / "r", extra_gate=extra, extra_checks='"gpu": check_speed')
    proj.cli("run", "p1", *device_args, expect=3)
    gpu = proj.phase("p1")["last_run"]["gates"][2]
    assert gpu["outcome"] == "skipped"
    assert gpu["reason"] == reason
    proj.forget_modules()
