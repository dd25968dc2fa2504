"""A throwaway git repository with a tiny two-phase plan, and a CLI driver for it.

The test phases' checks read ``knobs.json`` in the repo on every call, so a test changes what a
gate measures (or makes it raise / send SIGINT) without re-importing anything.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

from click.testing import CliRunner

from kdtree.orchestrator.cli import cli

PHASE_TEMPLATE = '''
import json, os, signal
from kdtree.gates.base import Figure, GateResult, Outcome, verdict
from kdtree.gates.spec import MetricGateSpec, PhaseSpec, Target, Threshold

SPEC = PhaseSpec(
    id="{pid}", title="{title}", objective="test phase {pid}",
    inputs=["src/{pid}/**"],
    gates=[
        MetricGateSpec(name="speed", thresholds=[Threshold(figure="speedup", op=">=", value=3.0, unit="x")],
                       targets=[{targets}]),
        MetricGateSpec(name="exact", thresholds=[Threshold(figure="mismatches", op="==", value=0)]),
        {extra}
    ],
)


def _knob(ctx, gate):
    knobs = json.loads((ctx.repo_root / "knobs.json").read_text())
    return knobs.get("{pid}", {{}}).get(gate, "pass")


def _metric(spec, ctx, good, bad):
    knob = _knob(ctx, spec.name)
    if knob == "raise":
        raise RuntimeError("boom in " + spec.name)
    if knob == "sigint":
        os.kill(os.getpid(), signal.SIGINT)
        import time; time.sleep(5)
    if knob == "exit":
        raise SystemExit(3)
    if knob == "edit":  # an input edited while the gates run (the user reverts it later)
        (ctx.repo_root / "src/{pid}/code.py").write_text("x = 99\\n")
    if knob == "lazy":  # a lazily imported input edited, executed and reverted mid-run
        import importlib.util, time
        path = ctx.repo_root / "src/{pid}/lazy.py"
        original = path.read_text()
        time.sleep(0.05)
        path.write_text("VALUE = 'edited'\\n")
        mod_spec = importlib.util.spec_from_file_location("lazy_{pid}", path)
        mod = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(mod)
        assert mod.VALUE == "edited"
        path.write_text(original)
    if knob == "block-results":  # the results folder stops taking files after the gates
        import shutil, stat
        folder = ctx.repo_root / "plans/results/{pid}"
        if os.geteuid() == 0:  # root writes through permissions: a file where the folder was
            shutil.rmtree(folder)
            folder.write_text("not a folder any more")
        else:
            folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    if knob == "fsize":  # the disk takes no more than 512 bytes per file from here on
        import resource
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (512, 512))
    if knob == "break-plan":  # the plan's markers are damaged while the gates run
        plan = ctx.repo_root / "plans/plan.md"
        plan.write_text(plan.read_text().replace("<!-- orchestrate:end status -->", ""))
    if knob == "print":  # a chatty gate (pytest -v): Python, fd and child-process output
        import sys, subprocess, time
        time.sleep(0.3)
        for i in range(3000):
            print("gate line", i)
        print("to stderr", file=sys.stderr)
        os.write(1, b"fd-level line\\n")
        subprocess.run(["echo", "child line"], check=True)
    if knob == "sleep":  # hangs until the orchestrator stops it
        import time
        time.sleep(60)
    if knob == "cwd":  # reads a file by a path relative to the project root
        open("src/{pid}/code.py").read()
    if knob == "env":  # changes the environment the orchestrator's own git calls would see
        os.environ["GIT_DIR"] = "/nonexistent"
        os.environ["GIT_INDEX_FILE"] = "/nonexistent/index"
        os.environ["PATH"] = "/nonexistent"
    if knob == "nested":  # a gate that runs orchestrate itself
        import subprocess, sys
        out = subprocess.run([sys.executable, "-m", "kdtree.orchestrator", "--repo", str(ctx.repo_root),
                              "plan"], capture_output=True, text=True, timeout=60)
        print("nested exit", out.returncode, out.stderr)
        if out.returncode != 2 or "ancestor" not in out.stderr:
            raise RuntimeError("nested orchestrate was not refused: " + out.stderr)
    th = spec.thresholds[0]
    value = bad if knob == "fail" else good
    details = {{}}
    if knob == "numpy":
        import numpy as np
        details = {{"count": np.int64(7), "rows": np.arange(3), "mean": np.float32(0.5),
                   "blob": b"\\x00raw", "obj": object()}}
    if knob == "plot":
        value, details = good, {{"plots": ["plans/results/{pid}/speed.png"]}}
    return verdict(spec.name, spec.kind, [Figure(name=th.figure, value=value, unit=th.unit,
                                                  threshold=th.value, op=th.op, key=True)], **details)


def check_speed(spec, ctx):
    return _metric(spec, ctx, 4.2, 1.5)


def check_exact(spec, ctx):
    return _metric(spec, ctx, 0, 2)


CHECKS = {{"speed": check_speed, "exact": check_exact, {extra_checks}}}
'''

PLAN_MD = """# Test plan

Prose written by a person. Keep me *exactly*: trailing spaces   
and unicode — ✓.

<!-- orchestrate:begin status -->
stale content that will be replaced
<!-- orchestrate:end status -->

## Phase p1

More prose.

<!-- orchestrate:begin results-p1 -->
<!-- orchestrate:end results-p1 -->

<!-- orchestrate:begin results-p2 -->
<!-- orchestrate:end results-p2 -->

Closing words, no newline at the end."""

CHANGELOG = """# Changelog

Intro line.

## [Unreleased]

### Added
- Something a person wrote.

## [0.1.0] - 2026-01-01

### Added
- The first release.
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def init_repo(root: Path) -> None:
    """An empty git repository at `root` (made if missing) on branch main, with a test identity and
    no commit signing."""
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.email", "t@example.com")
    git(root, "config", "user.name", "Test")
    git(root, "config", "commit.gpgsign", "false")


class Project:
    """The temp repository and helpers to drive ``orchestrate`` in it."""

    def __init__(self, root: Path, pkg: str):
        self.root, self.pkg = root, pkg
        self.runner = CliRunner()

    # --- files -----------------------------------------------------------------------------
    def write(self, rel: str, text: str) -> Path:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return path

    def knobs(self, **per_phase: dict) -> None:
        self.write("knobs.json", json.dumps(per_phase))

    @property
    def plan_path(self) -> Path:
        return self.root / "plans" / "plan.md"

    def lock_file(self) -> Path:
        """Where ``orchestrate`` takes this project's run lock."""
        from kdtree.orchestrator.lock import lock_path  # noqa: PLC0415

        return lock_path(self.root, self.root / "plans" / "results", True)

    def records(self, phase: str) -> list[Path]:
        folder = self.root / "plans" / "results" / phase
        return sorted(folder.glob("*.json")) if folder.is_dir() else []

    def forget_modules(self) -> None:
        """Drop the test phase modules so the next command imports the edited files."""
        for name in [m for m in sys.modules if m == self.pkg or m.startswith(self.pkg + ".")]:
            del sys.modules[name]

    # --- commands --------------------------------------------------------------------------
    def cli(self, *args: str, expect: int | None = 0):
        self.forget_modules()
        result = self.runner.invoke(cli, ["--repo", str(self.root), *args], catch_exceptions=False)
        if expect is not None:
            assert result.exit_code == expect, (
                f"orchestrate {' '.join(args)} exited {result.exit_code}, expected {expect}:\n"
                f"{result.output}")
        return result

    def status(self) -> dict:
        return json.loads(self.cli("status", "--json").stdout)

    def phase(self, pid: str) -> dict:
        return next(p for p in self.status()["phases"] if p["id"] == pid)

    def commit_all(self, message: str = "work") -> None:
        git(self.root, "add", "-A")
        git(self.root, "commit", "-q", "-m", message)


def make_project(root: Path, extra_gate: str = "", extra_checks: str = "", targets: str = "") -> Project:
    pkg = "tp_" + uuid.uuid4().hex[:10]
    init_repo(root)
    proj = Project(root, pkg)
    proj.write("pyproject.toml", f"""[project]
name = "t"

[tool.orchestrate]
id = "test-plan"
title = "A test plan"
markdown = "plans/plan.md"
phases = ["{pkg}.p1", "{pkg}.p2"]
""")
    proj.write(f"{pkg}/__init__.py", "")
    proj.write(f"{pkg}/p1.py", PHASE_TEMPLATE.format(pid="p1", title="alpha", extra=extra_gate,
                                                     extra_checks=extra_checks, targets=targets))
    proj.write(f"{pkg}/p2.py", PHASE_TEMPLATE.format(pid="p2", title="beta", extra="", extra_checks="",
                                                     targets=""))
    proj.write("src/p1/code.py", "x = 1\n")
    proj.write("src/p2/code.py", "y = 2\n")
    proj.write(".gitignore", "*.tmp\n__pycache__/\nsrc/p1/cache/\nknobs.json\n")  # knobs: test machinery
    proj.write("plans/plan.md", PLAN_MD)
    proj.write("CHANGELOG.md", CHANGELOG)
    proj.knobs()
    proj.commit_all("initial")
    return proj


