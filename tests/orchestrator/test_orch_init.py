"""`orchestrate init` edits pyproject.toml as TOML, keeps its formatting, and says what is next."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kdtree.orchestrator.cli import cli

BEFORE = '[project]\nname = "shop"  # keep this comment\n\n[tool.black]\nline-length = 100\n'


def _init(folder: Path, *args: str, expect: int = 0):
    res = CliRunner().invoke(cli, ["--repo", str(folder), "init", *args], catch_exceptions=False)
    assert res.exit_code == expect, res.output
    return res


def _folder(tmp_path: Path, pyproject: bytes | None) -> Path:
    folder = tmp_path / "shop"
    folder.mkdir()
    if pyproject is not None:
        (folder / "pyproject.toml").write_bytes(pyproject)
    return folder


def _load(folder: Path) -> dict:
    import tomllib  # noqa: PLC0415

    return tomllib.loads((folder / "pyproject.toml").read_text())


def test_init_keeps_the_files_formatting_and_adds_a_loadable_table(tmp_path):
    folder = _folder(tmp_path, BEFORE.encode())
    _init(folder, "--id", "shop")
    text = (folder / "pyproject.toml").read_text()
    assert text.startswith(BEFORE)
    table = _load(folder)["tool"]["orchestrate"]
    assert table["id"] == "shop" and table["phases"] == ["phases.example"]
    assert _load(folder)["tool"]["black"] == {"line-length": 100}


def test_init_keeps_crlf_line_endings(tmp_path):
    folder = _folder(tmp_path, BEFORE.replace("\n", "\r\n").encode())
    (folder / ".gitignore").write_bytes(b"dist/\r\n")
    _init(folder)
    data = (folder / "pyproject.toml").read_bytes()
    assert data.count(b"\n") == data.count(b"\r\n") and data.startswith(BEFORE.replace("\n", "\r\n").encode())
    assert _load(folder)["tool"]["orchestrate"]["markdown"] == "plans/shop.md"
    ignore = (folder / ".gitignore").read_bytes()
    assert ignore.startswith(b"dist/\r\n") and b".venv/\r\n" in ignore and b"\n" not in ignore.replace(b"\r\n", b"")


@pytest.mark.parametrize("pyproject, said", [
    ('tool = { orchestrate = { id = "x" } }\n', "already has tool.orchestrate"),
    ('[tool.orchestrate.extra]\nkey = 1\n', "already has tool.orchestrate"),
    ('tool = { black = { line-length = 100 } }\n', "inline table"),
    ('[project\nname = "broken"\n', "is not valid TOML"),
], ids=["inline-orchestrate", "orchestrate-subtable", "inline-tool", "invalid-toml"])
def test_init_refuses_what_it_would_break_and_writes_nothing(tmp_path, pyproject, said):
    folder = _folder(tmp_path, pyproject.encode())
    res = _init(folder, expect=2)
    assert said in res.stderr and "is ready" not in res.output
    assert (folder / "pyproject.toml").read_text() == pyproject
    assert sorted(p.name for p in folder.iterdir()) == ["pyproject.toml"]


def test_init_ignores_virtual_environments_once(tmp_path):
    folder = _folder(tmp_path, None)
    (folder / ".gitignore").write_text("dist/\n.venv\n")
    res = _init(folder)
    assert "wrote .gitignore" in res.stdout
    assert (folder / ".gitignore").read_text() == (
        "dist/\n.venv\n# virtual environments and caches (orchestrate init)\nvenv/\n__pycache__/\n")


def test_outside_git_init_says_what_works_and_run_then_works(tmp_path):
    folder = _folder(tmp_path, None)
    res = _init(folder)
    assert "not in a git repository" in res.stdout and "git init" in res.stdout
    out = subprocess.run([sys.executable, "-m", "kdtree.orchestrator", "run"], cwd=folder,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "example: passed" in out.stdout
