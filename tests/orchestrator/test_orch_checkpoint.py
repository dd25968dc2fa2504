"""Checkpoints: plan + CHANGELOG + a commit with gate lines and trailers; and every refusal."""

from __future__ import annotations

import json
import subprocess

from orch_project import CHANGELOG, git


def _trailers(project) -> dict[str, str]:
    msg = git(project.root, "log", "-1", "--format=%B")
    out = subprocess.run(["git", "interpret-trailers", "--parse"], input=msg, capture_output=True,
                         text=True, check=True).stdout
    return dict(line.split(": ", 1) for line in out.strip().splitlines())


def test_checkpoint_commit_contents_message_and_trailers(project):
    project.write("src/p1/code.py", "x = 10\n")  # uncommitted work the gates run on
    project.cli("run", "p1", "--device", "cpu")
    res = project.cli("checkpoint", "--commit", "-m", "First kernel numbers.")
    sha = git(project.root, "rev-parse", "HEAD").strip()
    assert f"committed {sha[:12]}" in res.stdout
    subject, _, body = git(project.root, "log", "-1", "--format=%B").partition("\n")
    assert subject == "checkpoint: p1 alpha passed (2/2 gates)"
    assert "First kernel numbers." in body
    assert "speed: passed, speedup 4.2x >= 3x" in body
    assert "exact: passed, mismatches 0 == 0" in body
    rec = json.loads(project.records("p1")[0].read_text())
    assert _trailers(project) == {"Run": rec["run_id"], "Phase": "p1",
                                  "Gates": "speed=passed, exact=passed", "Device": rec["device"]["name"]}
    committed = git(project.root, "show", "--name-only", "--format=", "HEAD").split()
    assert set(committed) == {"src/p1/code.py", "plans/plan.md", "CHANGELOG.md",
                              f"plans/results/p1/{rec['run_id']}.json"}
    for path in committed:
        assert path in res.stdout  # it says what it committed
    assert git(project.root, "status", "--porcelain") == ""
    assert ".lock" not in " ".join(committed)


def test_changelog_gets_one_line_per_newly_passed_phase_and_keeps_the_rest(project):
    project.cli("run", "p1", "--device", "cpu")
    res = project.cli("checkpoint")
    text = (project.root / "CHANGELOG.md").read_text()
    rec = json.loads(project.records("p1")[0].read_text())
    line = next(ln for ln in text.splitlines() if ln.startswith("- p1 alpha passed"))
    assert "speed speedup 4.2x >= 3x" in line and rec["run_id"] in line
    assert text.replace(line + "\n", "") == CHANGELOG
    unreleased = text.index("## [Unreleased]")
    assert unreleased < text.index(line) < text.index("## [0.1.0]")
    assert text.index("- Something a person wrote.") < text.index(line)
    assert "changelog: - p1 alpha passed" in res.stdout
    project.cli("checkpoint")  # nothing newly passed: no second line
    assert (project.root / "CHANGELOG.md").read_text() == text


def test_failed_phase_checkpoints_without_a_changelog_line(project):
    project.knobs(p1={"speed": "fail"})
    project.cli("run", "p1", "--device", "cpu", expect=1)
    project.cli("checkpoint", "--commit")
    assert git(project.root, "log", "-1", "--format=%s").strip() == "checkpoint: p1 alpha failed (1/2 gates passed)"
    assert (project.root / "CHANGELOG.md").read_text() == CHANGELOG
    assert _trailers(project)["Gates"] == "speed=failed, exact=passed"


def test_run_with_commit_makes_the_checkpoint(project):
    res = project.cli("run", "p1", "--device", "cpu", "--commit")
    assert "committed" in res.stdout
    assert git(project.root, "log", "-1", "--format=%s").startswith("checkpoint: p1 alpha passed")


def test_refuses_a_stale_run(project):
    project.cli("run", "p1", "--device", "cpu")
    project.write("src/p1/code.py", "x = 99\n")
    head = git(project.root, "rev-parse", "HEAD")
    res = project.cli("checkpoint", "--commit", expect=2)
    assert "is stale against the working tree" in res.stderr and "orchestrate run p1" in res.stderr
    assert git(project.root, "rev-parse", "HEAD") == head


def test_refuses_without_a_run(project):
    res = project.cli("checkpoint", expect=2)
    assert "no phase has a full run" in res.stderr
    res = project.cli("checkpoint", "--phase", "p2", expect=2)
    assert "p2 has no full run" in res.stderr
    res = project.cli("checkpoint", "--phase", "zz", expect=2)
    assert "unknown phase 'zz'" in res.stderr


def test_refuses_mid_merge_and_mid_rebase(project):
    project.cli("run", "p1", "--device", "cpu")
    gitdir = project.root / ".git"
    (gitdir / "MERGE_HEAD").write_text(git(project.root, "rev-parse", "HEAD"))
    res = project.cli("checkpoint", "--commit", expect=2)
    assert "middle of a merge" in res.stderr
    (gitdir / "MERGE_HEAD").unlink()
    (gitdir / "rebase-merge").mkdir()
    res = project.cli("checkpoint", "--commit", expect=2)
    assert "middle of a rebase" in res.stderr
    (gitdir / "rebase-merge").rmdir()
    project.cli("checkpoint", "--commit")


def test_refuses_outside_a_git_repository(project, tmp_path):
    bare = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(project.root), str(bare)], check=True)
    subprocess.run(["rm", "-rf", str(bare / ".git")], check=True)
    copy = type(project)(bare, project.pkg)
    copy.cli("run", "p1", "--device", "cpu")  # a copied tree (a GPU host) can still run
    rec = json.loads(copy.records("p1")[0].read_text())
    assert rec["git"] == {"sha": None, "dirty": None, "branch": None, "head": None, "sha_source": None}
    res = copy.cli("checkpoint", expect=2)
    assert "not a git repository" in res.stderr


def test_detached_head_is_allowed_and_said(project):
    git(project.root, "checkout", "-q", "--detach")
    project.cli("run", "p1", "--device", "cpu")
    res = project.cli("checkpoint", "--commit")
    assert "HEAD is detached" in res.stdout


def _committed(project) -> set[str]:
    return set(git(project.root, "show", "--name-only", "--format=", "HEAD").split())


def test_untracked_files_are_never_committed_silently(project):
    project.write("scratch.txt", "notes\n")
    project.write(".env.local", "TOKEN=do-not-commit\n")
    project.cli("run", "p1", "--device", "cpu")
    res = project.cli("checkpoint", "--commit")
    assert "scratch.txt" not in _committed(project) and ".env.local" not in _committed(project)
    assert "not committed (untracked): .env.local, scratch.txt\n  pass --include-untracked to add them" in res.stdout
    assert git(project.root, "status", "--porcelain", "--untracked-files=all").split() == \
        ["??", ".env.local", "??", "scratch.txt"]


def test_include_untracked_adds_the_listed_files(project):
    project.write("scratch.txt", "notes\n")
    project.cli("run", "p1", "--device", "cpu")
    project.cli("checkpoint", "--commit", "--include-untracked")
    assert "scratch.txt" in _committed(project)


def test_modified_tracked_files_outside_the_checkpoint_are_refused(project):
    project.write("README.md", "a tracked file\n")
    project.commit_all("readme")
    project.write("README.md", "edited, not part of the run\n")
    project.write("src/p1/code.py", "x = 5\n")  # an input: fine
    project.cli("run", "p1", "--device", "cpu")
    head = git(project.root, "rev-parse", "HEAD")
    plan_before = project.plan_path.read_bytes()
    res = project.cli("checkpoint", "--commit", expect=2)
    assert "tracked files outside this checkpoint are modified or staged: README.md" in res.stderr
    assert "commit or stash" in res.stderr
    assert git(project.root, "rev-parse", "HEAD") == head
    assert project.plan_path.read_bytes() == plan_before  # refused before writing anything
    git(project.root, "add", "README.md")  # staged counts too
    res = project.cli("checkpoint", "--commit", expect=2)
    assert "README.md" in res.stderr
    git(project.root, "stash", "push", "-q", "--", "README.md")
    project.cli("checkpoint", "--commit")
    assert _committed(project) >= {"src/p1/code.py", "plans/plan.md"} and "README.md" not in _committed(project)


def test_untracked_inputs_need_include_untracked(project):
    project.write("src/p1/new.py", "z = 3\n")  # hashed into the run's inputs
    project.cli("run", "p1", "--device", "cpu")
    res = project.cli("checkpoint", "--commit", expect=2)
    assert "untracked files are inputs of the run" in res.stderr and "src/p1/new.py" in res.stderr
    assert "--include-untracked" in res.stderr
    project.cli("checkpoint", "--commit", "--include-untracked")
    assert "src/p1/new.py" in _committed(project)


def test_a_deleted_input_is_committed_as_deleted(project):
    project.write("src/p1/old.py", "gone soon\n")
    project.commit_all("old")
    (project.root / "src/p1/old.py").unlink()
    project.cli("run", "p1", "--device", "cpu")
    res = project.cli("checkpoint", "--commit")
    assert "D\tsrc/p1/old.py" in res.stdout
