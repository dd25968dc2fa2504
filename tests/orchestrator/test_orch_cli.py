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
heavy = sorted(m for m in ("torch", "triton", "jinja2") if m in sys.modules)
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


def test_a_repository_without_a_plan_configuration_is_refused_naming_init(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    out = _status_in_subprocess(tmp_path)
    assert out.returncode == 2
    assert "has no [tool.orchestrate] table" in out.stderr and "`orchestrate init`" in out.stderr
    assert "Traceback" not in out.stderr
    assert "phase1" not in out.stdout  # never another project's plan


def test_status_of_this_repositorys_plan_imports_no_torch():
    out = _status_in_subprocess(Path(__file__).resolve().parents[2])  # its pyproject names the plan
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


def test_help_lists_the_exit_codes():
    res = CliRunner().invoke(cli, ["--help"])
    assert res.exit_code == 0
    text = res.stdout
    assert "Exit codes:" in text
    for code, words in (("0", "passed"), ("1", "did not pass"), ("2", "refused"),
                        ("3", "incomplete"), ("130", "interrupted"), ("141", "pipe was closed")):
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(code + " "))
        assert words in line, line


def test_ctrl_c_before_the_first_gate_exits_130_and_records_nothing(project, monkeypatch):
    from kdtree.orchestrator import device as device_facts  # noqa: PLC0415

    def interrupted(request, wants_cuda=True):
        raise KeyboardInterrupt

    monkeypatch.setattr(device_facts, "resolve_device", interrupted)  # e.g. while torch imports
    res = project.cli("run", "p1", expect=130)
    assert "Aborted!" not in res.output
    assert "run of p1 interrupted before its first gate; nothing was recorded" in res.stderr
    assert project.records("p1") == []
    assert not (project.root / "plans" / "results" / ".lock").exists()


def test_ctrl_c_in_any_command_exits_130(project, monkeypatch):
    from kdtree.orchestrator import state  # noqa: PLC0415

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(state, "plan_status", interrupted)
    res = project.cli("status", expect=130)
    assert "Aborted!" not in res.output and "interrupted (Ctrl-C)" in res.stderr


def _with_closed_stdout(project, *args) -> subprocess.CompletedProcess:
    """Run orchestrate with its stdout a pipe whose reader is gone (`orchestrate ... | head`)."""
    proc = subprocess.Popen([sys.executable, "-m", "kdtree.orchestrator", "--repo", str(project.root), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "", err)


def test_a_closed_pipe_gives_no_traceback_and_the_run_is_still_recorded(project):
    out = _with_closed_stdout(project, "run", "p1", "--device", "cpu")
    assert "Traceback" not in out.stderr and "BrokenPipeError" not in out.stderr, out.stderr
    assert out.returncode == 0
    assert len(project.records("p1")) == 1
    assert "| p1 | alpha | **passed** |" in project.plan_path.read_text()
    for args in (("status",), ("status", "--json"), ("history", "p1"), ("plan", "--check")):
        out = _with_closed_stdout(project, *args)
        assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr, (args, out.stderr)
        assert out.returncode in (0, 141), (args, out.returncode)


def test_a_missing_plan_markdown_is_refused_before_any_gate(project):
    py = project.root / "pyproject.toml"
    py.write_text(py.read_text().replace('markdown = "plans/plan.md"', 'markdown = "plans/missing.md"'))
    res = project.cli("run", "p1", "--device", "cpu", expect=2)
    assert "the plan markdown plans/missing.md (`markdown` in [tool.orchestrate] of pyproject.toml) " \
           "does not exist" in res.stderr
    assert "No gate was run" in res.stderr
    assert project.records("p1") == []
