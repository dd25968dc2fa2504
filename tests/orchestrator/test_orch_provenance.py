"""A record names what actually ran: its inputs hash always, a commit only when its tree holds them."""

from __future__ import annotations

import json
import shutil

from kdtree.orchestrator.inputs import InputsIndex
from kdtree.orchestrator.provenance import commit_inputs_hash, find_commit
from orch_project import Project, git


def _head(project) -> str:
    return git(project.root, "rev-parse", "HEAD").strip()


def _record(project) -> dict:
    return json.loads(project.records("p1")[-1].read_text())


def test_a_clean_tree_names_head(project):
    project.cli("run", "p1", "--device", "cpu")
    g = _record(project)["git"]
    assert (g["sha"], g["head"], g["sha_source"]) == (_head(project), _head(project), "head")


def test_changed_inputs_make_the_commit_unknown_not_head_plus_dirty(project):
    project.write("src/p1/code.py", "x = 10\n")
    project.cli("run", "p1", "--device", "cpu")
    g = _record(project)["git"]
    assert g["sha"] is None and g["head"] == _head(project) and g["dirty"] is True
    assert "unknown" in project.cli("status").stdout.splitlines()[1]


def test_changes_outside_the_inputs_still_name_head(project):
    project.write("notes.txt", "not an input\n")
    project.cli("run", "p1", "--device", "cpu")
    g = _record(project)["git"]
    assert g["sha"] == _head(project) and g["dirty"] is True


def test_commit_inputs_hash_matches_the_working_tree_hash(project):
    globs = ["src/p1/**"]
    assert commit_inputs_hash(project.root, "HEAD", globs) == \
        InputsIndex(project.root, True).hash_of(globs)[0]
    assert find_commit(project.root, globs, "0" * 16) is None


def test_a_lagging_git_copy_records_unknown_and_checkpoint_fills_the_commit(project, tmp_path):
    """The GPU host's .git is an older commit than the files it was sent (issue 11, item 7)."""
    gpu = tmp_path / "gpu-copy"
    git(tmp_path, "clone", "-q", str(project.root), str(gpu))  # .git at the initial commit
    stale_head = _head(project)
    project.write("src/p1/code.py", "x = 11\n")
    project.commit_all("new kernel")
    new_head = _head(project)
    for rel in ("src/p1/code.py", "knobs.json"):  # the files arrive, the .git does not
        shutil.copy(project.root / rel, gpu / rel)
    remote = Project(gpu, project.pkg)
    remote.cli("run", "p1", "--device", "cpu")
    g = _record(remote)["git"]
    assert g["sha"] is None and g["head"] == stale_head  # not "stale_head+dirty"

    (copied,) = remote.records("p1")
    dest = project.root / "plans" / "results" / "p1" / copied.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(copied, dest)
    res = project.cli("checkpoint", "--commit")
    assert f"filled in commit {new_head[:12]}" in res.stdout
    g = _record(project)["git"]
    assert (g["sha"], g["sha_source"]) == (new_head, "checkpoint")
    assert f"commit `{new_head[:10]}`" in project.plan_path.read_text()
    assert git(project.root, "show", f"HEAD:plans/results/p1/{copied.name}").count(new_head) == 1


def test_checkpoint_leaves_unknown_when_no_commit_holds_the_inputs(project):
    project.write("src/p1/code.py", "x = 12\n")  # never committed before the run
    project.cli("run", "p1", "--device", "cpu")
    res = project.cli("checkpoint")
    assert "filled in commit" not in res.stdout
    assert _record(project)["git"]["sha"] is None
