"""docs/orchestrator-guide.md runs as written: its files are written, its commands pass, in order.

A fenced block whose first line is ``# file: PATH`` is written to PATH; each ``$ `` line of a
``console`` block is run with bash in the project folder and must exit 0. torch is unimportable.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from test_orch_foreign import BLOCKER, _repo

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "orchestrator-guide.md"
_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)


def guide_steps() -> list[tuple[str, str, str]]:
    """("file", path, text) and ("run", command, "") in the guide's order."""
    steps = []
    for lang, body in _BLOCK.findall(GUIDE.read_text(encoding="utf-8")):
        first, _, rest = body.partition("\n")
        if first.startswith("# file: "):
            steps.append(("file", first[len("# file: "):].strip(), rest))
        elif lang == "console":
            steps += [("run", line[2:], "") for line in body.splitlines() if line.startswith("$ ")]
    return steps


def test_the_guide_has_files_and_commands():
    kinds = [k for k, _, _ in guide_steps()]
    assert kinds.count("file") >= 3 and kinds.count("run") >= 8


@pytest.mark.slow
def test_the_guide_runs_as_written(tmp_path):
    site = tmp_path / "no-torch"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": str(site), "ORCHESTRATE_RESCUE_DIR": str(tmp_path / "rescue"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proj = _repo(tmp_path / "shop")
    (proj / "pyproject.toml").write_text('[project]\nname = "shop"\n')
    for kind, what, text in guide_steps():
        if kind == "file":
            (proj / what).parent.mkdir(parents=True, exist_ok=True)
            (proj / what).write_text(text, encoding="utf-8")
            continue
        out = subprocess.run(["bash", "-c", what], cwd=proj, env=env, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, f"$ {what}\n{out.stdout}\n{out.stderr}"
        assert "Traceback" not in out.stderr
    log = subprocess.run(["git", "log", "-1", "--format=%B"], cwd=proj, capture_output=True, text=True).stdout
    assert log.startswith("checkpoint: parse parsing passed (3/3 gates)") and "First numbers." in log
    assert "suite: passed" in log
    assert subprocess.run(["git", "status", "--porcelain"], cwd=proj, capture_output=True,
                          text=True).stdout == ""
