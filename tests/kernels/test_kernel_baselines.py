"""What the accuracy suite does not reach in the two baselines: naive's chunked path, and the
Triton baseline's behaviour without triton or without a GPU."""

from __future__ import annotations

import sys

import pytest
import torch

from kdtree.kernels import naive, triton_baseline
from kernel_cases import CASES, build, dense_truth


def test_naive_in_chunks_of_tree_nodes(monkeypatch):
    case = next(c for c in CASES if c.name == "mixed-B4-H3")
    inp = build(case, torch.float32, seed=5)
    truth, truth_lse = dense_truth(inp)
    monkeypatch.setattr(naive, "_MAX_SCORE_ELEMENTS", 3 * 100 * 7)  # a few nodes per chunk
    lse = torch.full(inp.q.shape[:2], float("nan"))
    out = naive.tree_verify_mla_naive(*inp.args(), lse=lse)
    assert float((out.double() - truth).norm() / truth.norm()) < 1e-5
    assert float((lse.double() - truth_lse).abs().max()) < 1e-4


def test_triton_missing_is_reported_on_call_only(monkeypatch):
    inp = build(CASES[0], torch.bfloat16, seed=1)
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` now raises ImportError
    monkeypatch.setitem(sys.modules, "triton.language", None)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(triton_baseline, "_kernels", {})
    with pytest.raises(ImportError, match="needs triton"):
        triton_baseline.tree_verify_mla_triton(*inp.args())


def test_triton_on_cpu_without_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    inp = build(CASES[0], torch.bfloat16, seed=1)
    with pytest.raises(ValueError, match=r"^q:.*TRITON_INTERPRET"):
        triton_baseline.tree_verify_mla_triton(*inp.args())


def test_triton_rejects_fp32():
    inp = build(CASES[0], torch.float32, seed=1)
    with pytest.raises(ValueError, match=r"^q: dtype"):
        triton_baseline.tree_verify_mla_triton(*inp.args())
