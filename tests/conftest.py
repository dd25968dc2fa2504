"""Shared pytest fixtures and the GPU skip marker."""

from __future__ import annotations

import pytest

from kdtree.checkout import unshadow

# `python -m pytest` from the repository root puts the root on sys.path, where our kernels/ folder
# would shadow PyPI's `kernels` that transformers >= 5.25 imports (the oracle tests need it).
unshadow()


def _cuda_reason():
    try:
        import torch
    except Exception:  # pragma: no cover - torch is a test dependency
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine (torch.cuda.is_available() is False)"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _cuda_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
