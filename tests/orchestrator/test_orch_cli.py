"""The CLI as a user meets it: repo discovery, `status` output, no torch, `python -m`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from kdtree.orchestrator.cli import cli

_NO_HEAVY = """
import sys
sys.argv = ["orchestrate", "status"]
from kdtree.orchestrator.cli import main
try:
    main()
except SystemExit as e:
    code = e.code
heavy = sorted(m for m in ("torch", "triton", "git", "jinja2") if m in sys.modules)
print("HEAVY:", ",".join(heavy))
sys.exit(code)
"""


def _status_in_subprocess(cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _NO_HEAVY], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def test_status_imports_neither_torch_nor_triton(project):
    project.cli("run", "p1", "--device", "cpu")
    out = _status_in_subprocess(project.root)
    assert out.returncode == 0, out.stderr
    assert "HEAVY: \n" in out.stdout, out.stdout
    assert "speedup 4.2x >= 3x" in out.stdout


def test_status_of_the_project_plan_imports_no_torch(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    out = _status_in_subprocess(tmp_path)  # no [tool.orchestrate]: kdtree-engine's own plan
    assert out.returncode == 0, out.stderr
    assert "HEAVY: \n" in out.stdout, out.stdout
    for words in ("phase1 kernel", "phase2 backend", "phase3 graph capture", "phase4 defrag"):
        assert words in out.stdout
    assert out.stdout.index("phase1") < out.stdout.index("phase2") < out.stdout.index("phase3") \
        < out.stdout.index("phase4")


def test_status_shows_state_run_sha_device_and_key_figures(project):
    project.cli("run", "p1", "--device", "cpu")
    text = project.cli("status").stdout
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=project.root, capture_output=True,
                         text=True).stdout[:10]
    line = next(ln for ln in text.splitlines() if ln.startswith("p1 alpha"))
    assert "passed" in line and sha in line and "cpu" in line and "UTC" in line
    assert "speedup 4.2x >= 3x" in text and "mismatches 0 == 0" in text
    assert "p2 beta  pending" in text


def test_commands_find_the_repo_from_a_subdirectory(project, monkeypatch):
    monkeypatch.chdir(project.root / "src" / "p1")
    project.forget_modules()
    res = CliRunner().invoke(cli, ["status", "--json"])
    assert res.exit_code == 0, res.output
    assert '"plan": "test-plan"' in res.stdout


def test_outside_any_repo_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(cli, ["status"])
    assert res.exit_code == 2
    assert "not inside a git repository" in res.stderr and "--repo PATH" in res.stderr


def test_python_dash_m_works(project):
    out = subprocess.run([sys.executable, "-m", "kdtree.orchestrator", "--repo", str(project.root),
                          "status", "--json"], capture_output=True, text=True, timeout=60,
                         env={**os.environ})
    assert out.returncode == 0, out.stderr
    assert '"id": "p1"' in out.stdout
