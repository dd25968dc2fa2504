"""A checkpoint commit is one unit: it holds every record it cites, or nothing is committed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from orch_project import git


def _index(project) -> bytes:
    return (project.root / ".git" / "index").read_bytes()


def _head(project) -> str:
    return git(project.root, "rev-parse", "HEAD").strip()


@pytest.mark.slow
def test_ctrl_c_to_orchestrate_alone_during_a_slow_hook_commits_nothing(project, tmp_path):
    mark = tmp_path / "hook-started"
    hook = project.root / ".git" / "hooks" / "pre-commit"
    hook.write_text(f"#!/bin/sh\ntouch {mark}\nsleep 5\n")
    hook.chmod(0o755)
    project.cli("run", "p1", "--device", "cpu")
    head, index = _head(project), _index(project)
    project.forget_modules()
    proc = subprocess.Popen([sys.executable, "-m", "kdtree.orchestrator", "--repo", str(project.root),
                             "checkpoint", "--commit"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while not mark.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGINT)  # the orchestrate process alone, not git or its hook
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "git and its hooks were stopped, nothing was committed" in err
    assert "Traceback" not in err
    time.sleep(6)  # the hook would have finished by now, had it been left running
    assert _head(project) == head
    assert _index(project) == index
    assert len(project.records("p1")) == 1  # the run's record is still there
    assert not (project.root / ".git" / "index.lock").exists()


def test_a_gitignored_results_folder_is_refused_with_the_fix(project):
    project.write(".gitignore", (project.root / ".gitignore").read_text() + "plans/results/\n")
    project.commit_all("ignore the results")
    project.cli("run", "p1", "--device", "cpu")
    head, index, plan = _head(project), _index(project), project.plan_path.read_bytes()
    res = project.cli("checkpoint", "--commit", expect=2)
    (rec,) = project.records("p1")
    assert f"plans/results/p1/{rec.name} (ignored by the rule 'plans/results/' in .gitignore line 5)" in res.stderr
    assert "cannot commit" in res.stderr and "Remove the ignore rule" in res.stderr
    assert _head(project) == head and _index(project) == index
    assert project.plan_path.read_bytes() == plan  # refused before anything was written
    assert rec.exists()


@pytest.mark.parametrize("where", ["inside", "outside"])
def test_a_symlinked_results_folder_is_refused_with_the_fix(project, tmp_path, where):
    target = (project.root / "elsewhere") if where == "inside" else (tmp_path / "results-elsewhere")
    target.mkdir()
    (project.root / "plans" / "results").symlink_to(target)
    if where == "inside":
        project.commit_all("results live elsewhere")
    project.cli("run", "p1", "--device", "cpu")
    head, index = _head(project), _index(project)
    res = project.cli("checkpoint", "--commit", expect=2)
    assert "plans/results is a symbolic link" in res.stderr and "Make plans/results a real folder" in res.stderr
    assert _head(project) == head and _index(project) == index
    assert len(list(target.glob("p1/*.json"))) == 1


def test_include_records_adds_other_phases_records_and_nothing_else(project):
    project.cli("run", "p1", "--device", "cpu")
    project.cli("run", "p1", "--device", "cpu")  # the first p1 run is now cited by nothing
    project.cli("run", "p2", "--device", "cpu")
    project.write("scratch.txt", "notes\n")
    older = project.records("p1")[0]
    res = project.cli("checkpoint", "--phase", "p2", "--commit")
    assert f"not committed (untracked): plans/results/p1/{older.name}, scratch.txt" in res.stdout
    assert "pass --include-records to add the run records among them" in res.stdout
    project.cli("run", "p2", "--device", "cpu")
    project.cli("checkpoint", "--phase", "p2", "--commit", "--include-records")
    committed = set(git(project.root, "show", "--name-only", "--format=", "HEAD").split())
    assert f"plans/results/p1/{older.name}" in committed and "scratch.txt" not in committed
    assert git(project.root, "status", "--porcelain", "--untracked-files=all").split() == ["??", "scratch.txt"]
