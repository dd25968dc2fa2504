"""Someone else's project: `orchestrate init` to `checkpoint --commit`, with torch unimportable.

Every command runs as a user runs it: a subprocess in the project's folder (or a subfolder of a
monorepo), ``python -m kdtree.orchestrator``, with a meta-path blocker that makes torch and
triton unimportable (the orchestrator core must not need them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BLOCKER = '''
import sys

class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "triton"):
            raise ModuleNotFoundError(f"No module named {name!r} (made unimportable by the test)")
        return None

sys.meta_path.insert(0, _NoTorch())
'''

pytestmark = pytest.mark.slow  # a dozen subprocesses, each importing the orchestrator


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def _repo(path: Path) -> Path:
    path.mkdir(parents=True)
    _git(path, "init", "-q", "-b", "main")
    _git(path, "config", "user.email", "user@example.com")
    _git(path, "config", "user.name", "A User")
    _git(path, "config", "commit.gpgsign", "false")
    return path


@pytest.fixture
def no_torch_env(tmp_path) -> dict:
    site = tmp_path / "no-torch"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": str(site), "ORCHESTRATE_RESCUE_DIR": str(tmp_path / "rescue")}
    return env


def orchestrate(cwd: Path, env: dict, *args: str, expect: int = 0) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "kdtree.orchestrator", *args], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == expect, f"orchestrate {' '.join(args)}: {out.returncode}\n{out.stdout}\n{out.stderr}"
    assert "Traceback" not in out.stderr, out.stderr
    return out


def test_a_foreign_project_from_init_to_checkpoint_commit_without_torch(tmp_path, no_torch_env):
    env = no_torch_env
    blocked = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True)
    assert blocked.returncode != 0 and "made unimportable" in blocked.stderr
    proj = _repo(tmp_path / "shop")
    (proj / "pyproject.toml").write_text('[project]\nname = "shop"\n')
    orchestrate(proj, env, "status", expect=2)  # no plan yet: refused, naming init
    out = orchestrate(proj, env, "init", "--id", "shop-plan", "--title", "The shop's plan")
    assert "wrote plans/shop-plan.md" in out.stdout and "wrote phases/example.py" in out.stdout
    assert "[tool.orchestrate]" in (proj / "pyproject.toml").read_text()
    assert 'name = "shop"' in (proj / "pyproject.toml").read_text()  # the user's table is kept
    orchestrate(proj, env, "init", expect=2)  # never twice
    _git(proj, "add", "-A")
    _git(proj, "commit", "-q", "-m", "a plan")

    out = orchestrate(proj, env, "run")  # --device auto: a CPU-only plan never asks for CUDA
    assert "example: passed (1/1 gates passed)" in out.stdout
    status = json.loads(orchestrate(proj, env, "status", "--json").stdout)
    (phase,) = status["phases"]
    assert phase["state"] == "passed" and phase["passed_and_fresh"]
    versions = phase["last_run"]["versions"]
    assert versions["python"] and versions["torch"] is None and versions["nvcc"] is None
    assert versions["triton"] is None and versions["packages"] == {}
    text = orchestrate(proj, env, "status").stdout
    assert "out_of_order 0 == 0" in text and "target" in text and "not met" in text
    history = orchestrate(proj, env, "history", "example").stdout
    assert "passed" in history and "items_per_s" in history
    orchestrate(proj, env, "plan", "--check")
    plan = (proj / "plans" / "shop-plan.md").read_text()
    assert "run records under `plans/results/`" in plan and "**passed**" in plan
    out = orchestrate(proj, env, "checkpoint", "--commit")
    assert "committed" in out.stdout
    assert _git(proj, "status", "--porcelain") == ""
    subject = _git(proj, "log", "-1", "--format=%s").strip()
    assert subject == "checkpoint: example sorting passed (1/1 gates)"
    orchestrate(proj, env, "plan", "--check")
    seeds = json.loads(orchestrate(proj, env, "history", "example", "--json").stdout)[0]
    run_id = seeds["run_id"]
    out = orchestrate(proj, env, "replay", "example", "sort", "--run", run_id)
    assert "example/sort: passed (replay, not recorded)" in out.stdout


def test_a_cpu_only_plan_never_imports_torch_even_where_torch_is_installed(tmp_path):
    proj = _repo(tmp_path / "p")
    env = {**os.environ, "ORCHESTRATE_RESCUE_DIR": str(tmp_path / "rescue")}
    orchestrate(proj, env, "init")
    probe = ("import sys; from kdtree.orchestrator.cli import main\n"
             "try:\n    main(['run', '--device', 'auto'])\nexcept SystemExit as e:\n    code = e.code\n"
             "print('TORCH', 'torch' in sys.modules); sys.exit(code)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=proj, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "TORCH False" in out.stdout


def test_a_subproject_of_a_monorepo_uses_its_own_plan(tmp_path, no_torch_env):
    env = no_torch_env
    mono = _repo(tmp_path / "mono")
    (mono / "pyproject.toml").write_text('[tool.orchestrate]\nid = "outer"\nmarkdown = "outer.md"\n'
                                         'phases = ["outer_phases.nowhere"]\n')
    sub = mono / "services" / "api"
    sub.mkdir(parents=True)
    (sub / "pyproject.toml").write_text('[project]\nname = "api"\n')
    orchestrate(sub, env, "init", "--id", "api-plan", "--package", "api_phases")
    _git(mono, "add", "-A")
    _git(mono, "commit", "-q", "-m", "mono")
    deeper = sub / "api_phases"
    status = json.loads(orchestrate(deeper, env, "status", "--json").stdout)
    assert status["plan"] == "api-plan" and status["repo"] == str(sub.resolve())
    orchestrate(deeper, env, "run", "example")
    assert list((sub / "plans" / "results" / "example").glob("*.json"))
    elsewhere = tmp_path
    status = json.loads(orchestrate(elsewhere, env, "--repo", str(sub), "status", "--json").stdout)
    assert status["phases"][0]["state"] == "passed"
    rec = json.loads(next((sub / "plans" / "results" / "example").glob("*.json")).read_text())
    assert rec["git"]["sha"] == _git(mono, "rev-parse", "HEAD").strip()  # the subtree's inputs match HEAD
    out = orchestrate(deeper, env, "checkpoint", "--commit")
    files = _git(mono, "show", "--name-only", "--format=", "HEAD").split()
    assert files and all(f.startswith("services/api/") for f in files), out.stdout
    assert _git(mono, "status", "--porcelain") == ""
    orchestrate(sub, env, "plan", "--check")


@pytest.mark.parametrize("body, words", [
    ("requires=['pytest']", "unknown requirement 'pytest'"),
    ("requires=['sm>=9.0']", "write a compute capability as sm>=80"),
])
def test_an_unknown_requirement_is_refused_at_load_with_file_and_line(tmp_path, no_torch_env, body, words):
    proj = _repo(tmp_path / "p")
    orchestrate(proj, no_torch_env, "init")
    module = proj / "phases" / "example.py"
    text = module.read_text()
    text = text.replace("requires=[],  # e.g.", f"{body},  # e.g.")
    module.write_text(text)
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if "MetricGateSpec(" in ln)
    out = orchestrate(proj, no_torch_env, "status", expect=2)
    assert words in out.stderr and "exe:NAME" in out.stderr
    assert f"bad SPEC ({module}:{line})" in out.stderr


@pytest.mark.parametrize("source, kind", [
    ("def broken(:\n", "SyntaxError"),
    ("import os\nVALUE = 1 / 0\n", "ZeroDivisionError"),
    ("import not_a_module_anywhere\n", "ModuleNotFoundError"),
])
def test_a_phase_module_that_fails_to_import_is_refused_with_file_and_line(tmp_path, no_torch_env,
                                                                            source, kind):
    proj = _repo(tmp_path / "p")
    orchestrate(proj, no_torch_env, "init")
    module = proj / "phases" / "example.py"
    module.write_text(source + module.read_text())
    out = orchestrate(proj, no_torch_env, "run", expect=2)
    line = source.count("\n")
    assert f"{module}:{line}: {kind}" in out.stderr
    assert "phase module phases.example cannot be imported" in out.stderr
