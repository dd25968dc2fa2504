"""Run records on disk, the run lock (live holder refused, dead holder taken over), input globs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from pathlib import Path
from pydantic import ValidationError

from kdtree.orchestrator.inputs import glob_regex, match_inputs
from kdtree.orchestrator.lock import RunLock
from kdtree.orchestrator.specs import RunRecord


def test_record_has_everything_design_5_lists(project):
    project.cli("run", "p1", "--device", "cpu")
    (path,) = project.records("p1")
    rec = json.loads(path.read_text())
    assert path.stem == rec["run_id"]
    for key in ("spec_hash", "spec", "inputs_hash", "git", "device", "versions", "started_at",
                "ended_at", "forced", "partial", "results"):
        assert key in rec
    assert rec["git"]["sha"] == subprocess.run(["git", "rev-parse", "HEAD"], cwd=project.root,
                                               capture_output=True, text=True).stdout.strip()
    assert rec["git"]["dirty"] is False  # the held run lock does not count as a change
    assert rec["git"]["branch"] == "main"
    assert rec["versions"]["python"]
    assert rec["spec"]["gates"][0]["thresholds"][0]["value"] == 3.0
    fig = rec["results"][0]["figures"][0]
    assert (fig["value"], fig["op"], fig["threshold"]) == (4.2, ">=", 3.0)
    assert RunRecord.model_validate(rec).state.value == "passed"


def test_record_model_forbids_unknown_fields(project):
    project.cli("run", "p1", "--device", "cpu")
    rec = json.loads(project.records("p1")[0].read_text())
    rec["surprise"] = 1
    with pytest.raises(ValidationError, match="surprise"):
        RunRecord.model_validate(rec)


def test_damaged_record_is_reported_with_its_path(project):
    project.cli("run", "p1", "--device", "cpu")
    (path,) = project.records("p1")
    path.write_text("{ not json")
    res = project.cli("status", expect=2)
    assert path.name in res.stderr and "damaged" in res.stderr


def test_history_lists_runs_with_figures(project):
    project.cli("run", "p1", "--device", "cpu")
    project.knobs(p1={"speed": "fail"})
    project.cli("run", "p1", "--device", "cpu", expect=1)
    runs = json.loads(project.cli("history", "p1", "--json").stdout)
    assert [r["state"] for r in runs] == ["passed", "failed"]
    text = project.cli("history", "p1").stdout
    assert "speedup 4.2x >= 3x" in text and "speedup 1.5x >= 3x (miss)" in text
    assert text.index("4.2x") < text.index("1.5x")


_HOLDER = """
import sys, time
from pathlib import Path
from kdtree.orchestrator.lock import RunLock
with RunLock(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def _hold(project, seconds: float) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(project.lock_file()), str(seconds)],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_no_wait_refuses_at_once_naming_the_holder(project):
    holder = _hold(project, 30)
    try:
        res = project.cli("run", "p1", "--device", "cpu", "--no-wait", expect=2)
        assert f"pid {holder.pid}" in res.stderr and "holds the run lock" in res.stderr
        assert "orchestrate" in res.stderr  # the holder's command
        assert project.records("p1") == []
        res = project.cli("checkpoint", "--wait", "0.3", expect=2)
        assert f"pid {holder.pid}" in res.stderr and "after waiting" in res.stderr
        res = project.cli("plan", "--no-wait", expect=2)
        assert f"pid {holder.pid}" in res.stderr and "holds the run lock" in res.stderr
        res = project.cli("plan", "--wait", "0.3", expect=2)
        assert "after waiting" in res.stderr
    finally:
        holder.kill()
        holder.wait()


def test_a_second_run_waits_for_the_holder_and_says_who_it_is(project):
    holder = _hold(project, 1.5)
    try:
        res = project.cli("run", "p1", "--device", "cpu", expect=0)
    finally:
        holder.kill()
        holder.wait()
    assert f"waiting for the run lock" in res.stderr and f"pid {holder.pid}" in res.stderr
    assert len(project.records("p1")) == 1


def test_the_lock_never_shows_in_git_status(project):
    project.cli("run", "p1", "--device", "cpu")
    status = git_status(project)
    assert ".lock" not in status and ".holder" not in status


def git_status(project) -> str:
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=project.root,
                          capture_output=True, text=True, check=True).stdout


def test_a_stale_lock_from_a_dead_process_is_taken_over(project):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    holder_file = Path(str(project.lock_file()) + ".holder")
    holder_file.parent.mkdir(parents=True, exist_ok=True)
    import socket
    holder_file.write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "since": "earlier"}))
    res = project.cli("run", "p1", "--device", "cpu", expect=0)
    assert "taking over a stale lock" in res.stderr and f"pid {dead.pid}" in res.stderr
    assert len(project.records("p1")) == 1
    assert not holder_file.exists()


def test_lock_is_exclusive_within_a_process(tmp_path):
    with RunLock(tmp_path / ".lock"):
        with pytest.raises(Exception, match=f"pid {os.getpid()}"):
            RunLock(tmp_path / ".lock").acquire()
    with RunLock(tmp_path / ".lock"):
        pass


@pytest.mark.parametrize("pattern, path, hit", [
    ("kernels/**/*.py", "kernels/a.py", True),
    ("kernels/**/*.py", "kernels/x/y/a.py", True),
    ("kernels/**/*.py", "kernels/a.cu", False),
    ("kernels/**/*.py", "kernelsx/a.py", False),
    ("kernels/csrc/**", "kernels/csrc/x/k.cu", True),
    ("kernels/csrc/**", "kernels/other.cu", False),
    ("phases/phase1/spec.py", "phases/phase1/spec.py", True),
    ("phases/*.py", "phases/sub/a.py", False),
    ("src/?.txt", "src/a.txt", True),
])
def test_glob_semantics(pattern, path, hit):
    assert bool(glob_regex(pattern).match(path)) is hit


def test_match_inputs_is_the_union_of_globs():
    files = ["b/x.py", "a/y.py", "c/z.txt"]
    assert match_inputs(files, ["a/**", "b/*.py"]) == ["b/x.py", "a/y.py"]


def test_a_record_copied_into_another_phase_folder_is_an_error_naming_it(project):
    project.cli("run", "p1", "--device", "cpu")
    (path,) = project.records("p1")
    copy = project.root / "plans" / "results" / "p2" / path.name
    copy.parent.mkdir(parents=True)
    copy.write_bytes(path.read_bytes())
    res = project.cli("status", expect=2)
    assert str(copy) in res.stderr
    assert "is a run of 'p1' but lies in the folder of 'p2'" in res.stderr


def test_a_record_copied_under_another_run_id_does_not_count_twice(project):
    project.cli("run", "p1", "--device", "cpu")
    (path,) = project.records("p1")
    copy = path.with_name("20991231T000000000000Z-abcdef.json")
    copy.write_bytes(path.read_bytes())
    res = project.cli("history", "p1", expect=2)
    assert str(copy) in res.stderr and "its file is named" in res.stderr
    assert "rename it to" in res.stderr
