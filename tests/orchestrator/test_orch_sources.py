"""A run tests the repository it records: its packages and phase modules must come from it."""

from __future__ import annotations

import subprocess

import pytest

from kdtree.orchestrator.errors import Refusal
from kdtree.orchestrator.plan import load_plan, read_plan_spec
from kdtree.orchestrator.runner import run_phase
from kdtree.orchestrator.sources import declared_packages, folder_of, foreign_sources

PROJECT_PLAN = read_plan_spec(__import__("pathlib").Path(__file__).resolve().parents[2])  # this repository's own plan

_GATES_OF_ITS_OWN = """
[tool.setuptools]
packages = ["kdtree.gates"]

[tool.setuptools.package-dir]
"kdtree.gates" = "gates"
"""


def test_a_package_served_from_another_checkout_is_refused_before_any_gate(project):
    """Like an editable install of clone A running in clone B: B's kdtree.gates is not imported."""
    py = project.root / "pyproject.toml"
    py.write_text(py.read_text() + _GATES_OF_ITS_OWN)
    project.write("gates/__init__.py", "raise SystemExit('this copy must never run')\n")
    project.write("gates/base.py", "")
    import kdtree.gates  # noqa: PLC0415 - the environment's copy (this checkout)

    res = project.cli("run", "p1", "--device", "cpu", expect=2)
    assert "kdtree.gates would be imported from" in res.stderr
    assert kdtree.gates.__path__[0] in res.stderr  # where it would come from
    assert str(project.root / "gates") in res.stderr  # where it should come from
    assert f"pip install -e {project.root}" in res.stderr  # the fix
    assert project.records("p1") == []


def test_packages_the_repository_serves_itself_pass(project):
    py = project.root / "pyproject.toml"
    py.write_text(py.read_text() + f'\n[tool.setuptools]\npackages = ["{project.pkg}"]\n')
    project.cli("run", "p1", "--device", "cpu")
    assert len(project.records("p1")) == 1


def test_a_declared_package_the_environment_cannot_import_is_refused(project):
    py = project.root / "pyproject.toml"
    py.write_text(py.read_text() + '\n[tool.setuptools.package-dir]\n"kdtree.nowhere" = "nowhere"\n')
    res = project.cli("run", "p1", "--device", "cpu", expect=2)
    assert "kdtree.nowhere" in res.stderr and "cannot be imported in this environment" in res.stderr
    assert project.records("p1") == []


def test_phase_modules_from_outside_the_repository_are_refused(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    plan = load_plan(tmp_path, True, PROJECT_PLAN)  # kdtree-engine's phases, from this checkout
    with pytest.raises(Refusal, match="phase module kdtree.phases.phase1 was imported from"):
        run_phase(plan, "phase1", device="cpu")
    assert not (tmp_path / "plans" / "results" / "phase1").exists()


def test_this_checkout_serves_its_own_packages():
    import kdtree  # noqa: PLC0415

    from pathlib import Path  # noqa: PLC0415

    root = Path(kdtree.__file__).resolve().parent.parent
    assert "kdtree.kernels" in declared_packages(root)
    modules = [m for m in PROJECT_PLAN.phases]
    assert foreign_sources(root, modules) == []


def test_folder_of_follows_package_dir():
    mapping = {"kdtree": "kdtree", "kdtree.kernels": "kernels", "": "src"}
    assert str(folder_of("kdtree.kernels", mapping)) == "kernels"
    assert str(folder_of("kdtree.kernels.csrc", mapping)) == "kernels/csrc"
    assert str(folder_of("other", mapping)) == "src/other"


def test_repo_option_must_name_a_repository_root(project):
    res = project.cli("--repo", str(project.root / "src"), "status", expect=2)
    assert f"{project.root / 'src'} has no [tool.orchestrate]" in res.stderr
    assert "is not a repository root" in res.stderr and "orchestrate init" in res.stderr
    assert f"--repo {project.root}" in res.stderr


def test_repo_option_accepts_a_tree_outside_any_repository(tmp_path):
    from kdtree.orchestrator.repo import resolve_root  # noqa: PLC0415

    root = resolve_root(str(tmp_path))
    assert root.path == tmp_path.resolve() and root.is_git is False


def test_status_warns_and_checkpoint_refuses_while_sources_are_foreign(project):
    project.cli("run", "p1", "--device", "cpu")
    py = project.root / "pyproject.toml"
    py.write_text(py.read_text() + _GATES_OF_ITS_OWN)
    project.write("gates/__init__.py", "")
    project.commit_all("own gates")
    res = project.cli("status")
    assert "warning: kdtree.gates would be imported from" in res.stderr
    res = project.cli("checkpoint", expect=2)
    assert "kdtree.gates would be imported from" in res.stderr
