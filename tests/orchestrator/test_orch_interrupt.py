"""An interrupted or crashing run leaves the previous record and the plan exactly as they were."""

from __future__ import annotations

import os
import signal

import pytest


def _snapshot(project):
    recs = {p.name: p.read_bytes() for p in project.records("p1")}
    return recs, project.plan_path.read_bytes()


def _leftovers(project):
    results = project.root / "plans" / "results"
    return sorted(str(p.relative_to(project.root)) for p in results.rglob("*")
                  if p.name.endswith(".tmp") or p.name == ".lock")


@pytest.mark.parametrize("knob", ["sigint"])
def test_sigint_in_a_gate_records_nothing(project, knob):
    # A process started in the background by a non-interactive shell inherits SIGINT ignored, and
    # Python then keeps it ignored; Ctrl-C at a terminal reaches the default handler.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _interrupted_run_records_nothing(project, knob)
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupted_run_records_nothing(project, knob):
    project.cli("run", "p1", "--device", "cpu")
    before = _snapshot(project)
    project.knobs(p1={"exact": knob})
    res = project.cli("run", "p1", "--device", "cpu", expect=130)
    assert "interrupted during gate 'exact'" in res.stderr
    assert "nothing was recorded" in res.stderr
    assert _snapshot(project) == before
    assert _leftovers(project) == []  # the lock was released
    assert project.phase("p1")["state"] == "passed"


def test_sys_exit_in_a_check_is_an_error_of_that_gate_not_ctrl_c(project):
    project.cli("run", "p1", "--device", "cpu")
    project.knobs(p1={"exact": "exit"})
    res = project.cli("run", "p1", "--device", "cpu", expect=1)
    assert "interrupted" not in res.output
    assert "the check called sys.exit(3)" in res.stdout
    assert len(project.records("p1")) == 2
    assert project.phase("p1")["state"] == "error"


def test_exception_in_a_gate_is_an_error_record_and_keeps_the_previous_one(project):
    project.cli("run", "p1", "--device", "cpu")
    (first,) = project.records("p1")
    first_bytes = first.read_bytes()
    project.knobs(p1={"speed": "raise"})
    project.cli("run", "p1", "--device", "cpu", expect=1)
    recs = project.records("p1")
    assert len(recs) == 2 and recs[0].read_bytes() == first_bytes
    assert project.phase("p1")["state"] == "error"


def test_a_crash_while_writing_the_record_leaves_no_half_file(project, monkeypatch):
    project.cli("run", "p1", "--device", "cpu")
    before = _snapshot(project)
    real_replace = os.replace

    def failing_replace(src, dst):
        if str(dst).endswith(".json"):
            raise OSError("disk full")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    res = project.cli("run", "p1", "--device", "cpu", expect=4)  # the record could not be written
    monkeypatch.setattr(os, "replace", real_replace)
    assert "disk full" in res.stderr and "could not be written" in res.stderr
    assert '"phase": "p1"' in res.stderr  # no folder took it: the record is in the message
    assert "Traceback" not in res.output
    assert _snapshot(project) == before
    assert _leftovers(project) == []
