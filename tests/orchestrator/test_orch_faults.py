"""Faults a user meets, reproduced the way they meet them: nothing lost, no untruth, no traceback.

Each test asserts the message, the exit code and that no measurement was lost. Read-only folders
use chmod where that blocks writes; as root (which writes through permissions) another real
mechanism stands in: a path whose parent is a regular file, a folder replaced by a file, a file
size limit (RLIMIT_FSIZE, what a full disk looks like to a writer: every write past it fails).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from orch_project import git

ROOT = os.geteuid() == 0
SRC_ROOT = Path(__file__).resolve().parents[2]


def _index_bytes(project) -> bytes:
    return (project.root / ".git" / "index").read_bytes()


# --- item 2: provenance that a revert cannot fool ----------------------------------------------

def test_an_input_edited_during_the_run_and_reverted_after_never_decides(project):
    project.knobs(p1={"exact": "edit"})
    res = project.cli("run", "p1", "--device", "cpu", expect=0)
    assert "input files changed while its gates ran (src/p1/code.py)" in res.stderr
    git(project.root, "checkout", "--", "src/p1/code.py")  # the user reverts the edit
    (path,) = project.records("p1")
    rec = json.loads(path.read_text())
    assert rec["inputs_changed_during_run"] is True and rec["inputs_changed"] == ["src/p1/code.py"]
    assert rec["git"]["sha"] is None  # no commit holds what the gates ran
    p1 = project.phase("p1")
    assert p1["state"] == "pending"  # the only full run does not decide
    assert any("does not decide" in n and "changed while its gates ran" in n for n in p1["not_deciding"])
    assert "ignored:" in project.cli("status").stdout
    before = _index_bytes(project)
    res = project.cli("checkpoint", "--commit", "--phase", "p1", expect=2)
    assert "cannot be checkpointed" in res.stderr and "changed while its gates ran" in res.stderr
    assert _index_bytes(project) == before
    assert path.exists()  # the record is kept, for the record


def test_a_lazily_imported_input_edited_executed_and_reverted_mid_run_is_caught(project):
    project.write("src/p1/lazy.py", "VALUE = 'committed'\n")
    project.commit_all("lazy module")
    head = git(project.root, "rev-parse", "HEAD").strip()
    project.knobs(p1={"speed": "lazy"})
    project.cli("run", "p1", "--device", "cpu", expect=0)
    assert (project.root / "src/p1/lazy.py").read_text() == "VALUE = 'committed'\n"  # reverted
    rec = json.loads(project.records("p1")[0].read_text())
    assert rec["inputs_changed_during_run"] is True and "src/p1/lazy.py" in rec["inputs_changed"]
    assert rec["git"]["sha"] is None and rec["git"]["head"] == head  # HEAD is not claimed
    assert project.phase("p1")["state"] == "pending"
    project.cli("checkpoint", "--commit", expect=2)
    assert git(project.root, "rev-parse", "HEAD").strip() == head


# --- item 3: a measurement is never lost -------------------------------------------------------

def _use_results_dir(project, results_dir: str) -> None:
    py = project.root / "pyproject.toml"
    py.write_text(py.read_text() + f'results_dir = "{results_dir}"\n')


def test_an_unwritable_results_folder_is_refused_before_any_gate_parent_is_a_file(project):
    (project.root / "out").write_text("a file where a folder should be\n")
    _use_results_dir(project, "out/results")
    project.knobs(p1={"speed": "sigint"})  # a gate that ran would interrupt the run (exit 130)
    res = project.cli("run", "p1", "--device", "cpu", expect=2)
    assert "the results folder" in res.stderr and "cannot be written" in res.stderr
    assert "No gate was run" in res.stderr and "Traceback" not in res.output


@pytest.mark.skipif(ROOT, reason="root writes through chmod; the parent-is-a-file test covers root")
def test_a_read_only_results_folder_is_refused_before_any_gate_chmod(project):
    results = project.root / "plans" / "results"
    results.mkdir(parents=True)
    results.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        res = project.cli("run", "p1", "--device", "cpu", expect=2)
    finally:
        results.chmod(stat.S_IRWXU)
    assert "cannot be written (Permission denied)" in res.stderr


def test_a_plan_that_cannot_be_rewritten_is_refused_before_any_gate(project):
    plan = project.plan_path
    if ROOT:
        made = subprocess.run(["chattr", "+i", str(plan)], capture_output=True)
        if made.returncode != 0:
            pytest.skip("as root only an immutable file blocks writing the plan, and chattr +i is "
                        f"not allowed here: {made.stderr.decode().strip()}")
    else:
        plan.chmod(stat.S_IRUSR)
    try:
        res = project.cli("run", "p1", "--device", "cpu", expect=2)
    finally:
        if ROOT:
            subprocess.run(["chattr", "-i", str(plan)], check=True)
        else:
            plan.chmod(stat.S_IRUSR | stat.S_IWUSR)
    assert "the plan markdown" in res.stderr and "cannot be rewritten" in res.stderr
    assert project.records("p1") == []


def test_a_results_folder_lost_after_the_gates_rescues_the_record(project, tmp_path, monkeypatch):
    rescue = tmp_path / "rescue"
    monkeypatch.setenv("ORCHESTRATE_RESCUE_DIR", str(rescue))
    project.knobs(p1={"exact": "block-results"})
    res = project.cli("run", "p1", "--device", "cpu", expect=4)
    assert "Traceback" not in res.output
    (saved,) = list((rescue / "p1").glob("*.json"))
    assert f"The record is saved at {saved}" in res.stderr
    rec = json.loads(saved.read_text())
    assert rec["state"] == "passed" and [g["gate"] for g in rec["results"]] == ["speed", "exact"]
    home = project.root / "plans" / "results" / "p1"
    assert f"mkdir -p {home} && mv {saved} {home}/" in res.stderr
    # the user repairs the folder and follows the instruction: the run counts
    if home.is_file():
        home.unlink()
    else:
        home.chmod(stat.S_IRWXU)
    subprocess.run(f"mkdir -p {home} && mv {saved} {home}/", shell=True, check=True)
    project.knobs()
    assert project.phase("p1")["state"] == "passed"


def test_a_full_disk_after_the_gates_puts_the_record_in_the_message(project, tmp_path):
    """RLIMIT_FSIZE makes every file write past 512 bytes fail (EFBIG), the rescue folder's too."""
    project.knobs(p1={"exact": "fsize"})
    env = {**os.environ, "ORCHESTRATE_RESCUE_DIR": str(tmp_path / "rescue")}
    out = subprocess.run([sys.executable, "-m", "kdtree.orchestrator", "--repo", str(project.root),
                          "run", "p1", "--device", "cpu"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 4, out.stderr
    assert "File too large" in out.stderr and "Traceback" not in out.stderr
    assert "No fallback folder took it either" in out.stderr
    record = json.loads(out.stderr[out.stderr.index("{"):])
    assert record["phase"] == "p1" and record["state"] == "passed"
    assert project.records("p1") == []


def test_a_plan_that_cannot_be_rendered_after_a_run_is_a_warning(project):
    project.knobs(p1={"exact": "break-plan"})
    res = project.cli("run", "p1", "--device", "cpu", expect=0)  # passed: the run is recorded
    assert "was recorded, but the plan was not rendered" in res.stderr
    assert "`orchestrate plan`" in res.stderr
    assert len(project.records("p1")) == 1


# --- item 4: git failures are messages ---------------------------------------------------------

def _no_identity(project, monkeypatch, home: Path | None):
    for var in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "EMAIL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", "/dev/null")
    if home is None:
        monkeypatch.delenv("HOME", raising=False)
    else:
        monkeypatch.setenv("HOME", str(home))
    git(project.root, "config", "--unset", "user.name")
    git(project.root, "config", "--unset", "user.email")
    git(project.root, "config", "user.useConfigOnly", "true")  # no guessing from the host name


@pytest.mark.parametrize("home", ["empty", "unset"])
def test_checkpoint_without_a_git_identity_is_a_message_and_the_index_is_untouched(project, monkeypatch,
                                                                                  tmp_path, home):
    project.write("src/p1/code.py", "x = 5\n")
    git(project.root, "add", "src/p1/code.py")  # the user had staged this already
    project.cli("run", "p1", "--device", "cpu")
    before, head = _index_bytes(project), git(project.root, "rev-parse", "HEAD")
    (tmp_path / "home").mkdir()
    _no_identity(project, monkeypatch, tmp_path / "home" if home == "empty" else None)
    res = project.cli("checkpoint", "--commit", expect=2)
    assert "git does not know who you are" in res.stderr and "user.email" in res.stderr
    if home == "unset":
        assert "HOME is not set" in res.stderr
    assert "the index is as it was" in res.stderr and "Traceback" not in res.output
    assert _index_bytes(project) == before and git(project.root, "rev-parse", "HEAD") == head
    assert len(project.records("p1")) == 1


def test_a_failing_pre_commit_hook_is_a_message_and_the_index_is_untouched(project):
    hook = project.root / ".git" / "hooks" / "pre-commit"
    hook.parent.mkdir(exist_ok=True)
    hook.write_text("#!/bin/sh\necho 'lint: 3 problems in plans/plan.md' >&2\nexit 1\n")
    hook.chmod(0o755)
    project.cli("run", "p1", "--device", "cpu")
    before, head = _index_bytes(project), git(project.root, "rev-parse", "HEAD")
    res = project.cli("checkpoint", "--commit", expect=2)
    assert "the commit was refused" in res.stderr and "lint: 3 problems in plans/plan.md" in res.stderr
    assert _index_bytes(project) == before and git(project.root, "rev-parse", "HEAD") == head
    assert git(project.root, "diff", "--cached", "--name-only") == ""
    hook.unlink()  # fixed: the next checkpoint commits
    project.cli("checkpoint", "--commit")
    assert git(project.root, "rev-parse", "HEAD") != head


# --- item 6: plan files as people keep them ----------------------------------------------------

def test_markers_inside_fenced_code_are_text(project):
    text = project.plan_path.read_text()
    project.plan_path.write_text(text + "\n\nHow a block looks:\n\n```markdown\n"
                                 "<!-- orchestrate:begin results-p1 -->\n<!-- orchestrate:begin oops\n```\n")
    project.cli("run", "p1", "--device", "cpu")
    new = project.plan_path.read_text()
    assert new.endswith("```markdown\n<!-- orchestrate:begin results-p1 -->\n<!-- orchestrate:begin oops\n```\n")
    project.cli("plan", "--check")


def test_invalid_utf8_in_the_plan_names_the_byte_offset(project):
    data = project.plan_path.read_bytes()
    at = data.index(b"More prose")
    project.plan_path.write_bytes(data[:at] + b"\xff" + data[at:])
    res = project.cli("run", "p1", "--device", "cpu", expect=2)
    assert f"not valid UTF-8: byte 0xff at byte offset {at}" in res.stderr and "Traceback" not in res.output
    assert project.records("p1") == []
    res = project.cli("plan", "--check", expect=2)
    assert f"byte offset {at}" in res.stderr


def test_a_symlinked_plan_is_written_through_the_link(project):
    target = project.root / "docs" / "real-plan.md"
    target.parent.mkdir()
    shutil.move(project.plan_path, target)
    project.plan_path.symlink_to(os.path.relpath(target, project.plan_path.parent))
    project.cli("run", "p1", "--device", "cpu")
    assert project.plan_path.is_symlink()
    assert "speedup 4.2x" in target.read_text()


def test_a_plan_path_that_is_a_directory_says_so(project):
    project.plan_path.unlink()
    project.plan_path.mkdir()
    res = project.cli("run", "p1", "--device", "cpu", expect=2)
    assert "is a directory" in res.stderr and "does not exist" not in res.stderr
    assert "is a directory" in project.cli("plan", expect=2).stderr


def test_a_record_whose_state_contradicts_its_gates_is_damaged(project):
    project.knobs(p1={"speed": "fail"})
    project.cli("run", "p1", "--device", "cpu", expect=1)
    (path,) = project.records("p1")
    rec = json.loads(path.read_text())
    rec["state"] = "passed"  # edited by hand
    path.write_text(json.dumps(rec))
    res = project.cli("status", expect=2)
    assert f"run record {path} is damaged" in res.stderr
    assert "its state is 'passed' but its gates (speed=failed, exact=passed) amount to 'failed'" in res.stderr


def test_status_with_stdout_closed_is_no_traceback(project):
    project.cli("run", "p1", "--device", "cpu")
    out = subprocess.run(["bash", "-c", f"{sys.executable} -m kdtree.orchestrator --repo {project.root} "
                          "status >&-"], capture_output=True, text=True, timeout=60)
    assert "Traceback" not in out.stderr and out.returncode == 0, out.stderr


# --- item 7: checkpoint commits are self-consistent --------------------------------------------

def test_a_checkpoint_commits_every_record_its_plan_cites(project, tmp_path):
    project.cli("run", "p1", "--device", "cpu")
    project.cli("run", "p2", "--device", "cpu")
    project.cli("checkpoint", "--commit")  # reports p2, the phase run last
    committed = git(project.root, "show", "--name-only", "--format=", "HEAD").split()
    for phase in ("p1", "p2"):
        (rec,) = project.records(phase)
        assert f"plans/results/{phase}/{rec.name}" in committed
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(project.root), str(clone))
    shutil.copy(project.root / "knobs.json", clone / "knobs.json")
    project.forget_modules()
    from click.testing import CliRunner  # noqa: PLC0415

    from kdtree.orchestrator.cli import cli  # noqa: PLC0415

    check = CliRunner().invoke(cli, ["--repo", str(clone), "plan", "--check"])
    assert check.exit_code == 0, check.output
    status = json.loads(CliRunner().invoke(cli, ["--repo", str(clone), "status", "--json"]).stdout)
    assert [p["state"] for p in status["phases"]] == ["passed", "passed"]
    project.forget_modules()


def test_the_status_block_names_the_configured_results_folder(project):
    _use_results_dir(project, "out/runs")
    project.cli("run", "p1", "--device", "cpu")
    assert "run records under `out/runs/`" in project.plan_path.read_text()
    assert list((project.root / "out" / "runs" / "p1").glob("*.json"))
