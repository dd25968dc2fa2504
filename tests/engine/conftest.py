"""Fixtures for the engine tests: the tiny model and prompt sets of different lengths."""

from __future__ import annotations

import pytest

from kdtree.engine import build_model, preset


@pytest.fixture(scope="session")
def tiny_model():
    return build_model(preset("tiny"), seed=0)
