"""A phase's inputs never include the orchestrator's own outputs; a glob that matches nothing is said."""

from __future__ import annotations


def _inputs(project, globs: str) -> None:
    path = project.root / project.pkg / "p1.py"
    path.write_text(path.read_text().replace('inputs=["src/p1/**"]', f"inputs={globs}"))
    project.commit_all("p1's inputs")


def test_inputs_everything_is_not_made_stale_by_its_own_run_or_checkpoint(project):
    _inputs(project, '["**"]')
    project.knobs(p1={"speed": "print"})  # a gate log is written into the results folder too
    project.cli("run", "p1", "--device", "cpu")
    assert project.phase("p1")["state"] == "passed"
    project.cli("checkpoint", "--commit")
    st = project.phase("p1")
    assert st["state"] == "passed", st["stale_reasons"]
    project.cli("plan", "--check")
    project.write("src/p1/code.py", "x = 3\n")  # a real input still counts
    assert project.phase("p1")["state"] == "stale"


def test_an_inputs_glob_that_matches_no_file_is_a_warning(project):
    _inputs(project, '["src/p1/**", "srcc/p1/**"]')
    res = project.cli("status")
    assert "warning: phase p1: its inputs glob 'srcc/p1/**' matches no file" in res.stderr
    assert "'src/p1/**'" not in res.stderr
