"""Fixtures for the orchestrator tests: a throwaway repository with a tiny plan (see orch_project)."""

from __future__ import annotations

import pytest

from orch_project import Project, make_project


@pytest.fixture
def project(tmp_path) -> Project:
    proj = make_project(tmp_path / "repo")
    yield proj
    proj.forget_modules()
