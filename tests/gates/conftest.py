"""Fixtures for the gate tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the toy op helpers next to the tests

from kdtree.gates.base import GateContext  # noqa: E402


@pytest.fixture
def ctx(tmp_path) -> GateContext:
    return GateContext(device="cpu", repo_root=tmp_path, quick=True)
