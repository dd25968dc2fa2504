"""Skip reasons for the ``cuda`` requirement name what actually put the run on the cpu."""

from __future__ import annotations

import sys

import pytest

from kdtree.gates.base import GateContext, Outcome, missing_requirement, run_check
from kdtree.gates.spec import MetricGateSpec, Threshold

EXPLICIT = "the run was asked for --device cpu"
AUTO = "no CUDA GPU is visible (--device auto chose cpu; torch.cuda.is_available() is False)"


@pytest.mark.parametrize("ctx", [GateContext(device="cpu", requested_device="cpu"),
                                 GateContext(device="cpu")],  # callers that predate the field
                         ids=["asked-cpu", "no-requested-device"])
def test_cuda_on_an_explicit_cpu_run_says_cpu_was_asked_for(ctx):
    assert missing_requirement(["cuda"], ctx) == EXPLICIT


def test_cuda_on_auto_resolved_to_cpu_says_no_gpu_is_visible():
    pytest.importorskip("torch")
    reason = missing_requirement(["cuda"], GateContext(device="cpu", requested_device="auto"))
    assert reason == AUTO
    assert "asked for" not in reason


def test_cuda_on_auto_without_torch_says_torch_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    reason = missing_requirement(["cuda"], GateContext(device="cpu", requested_device="auto"))
    assert reason == "no CUDA GPU is visible (--device auto chose cpu; torch is not installed)"


def test_run_check_skips_with_the_auto_reason():
    pytest.importorskip("torch")
    spec = MetricGateSpec(name="gpu", requires=["cuda"],
                          thresholds=[Threshold(figure="f", op=">=", value=1)])
    called = []
    result = run_check(spec, lambda s, c: called.append(1),
                       GateContext(device="cpu", requested_device="auto"))
    assert result.outcome is Outcome.SKIPPED and not called
    assert result.reason == AUTO and result.summary == f"skipped: {AUTO}"
