"""Targets attached to the phases' gates, and phase 1's FA2 comparison where FlashInfer is absent."""

import pytest

from kdtree.gates.base import GateContext, GateResult, Outcome
from kdtree.gates.spec import Target
from kdtree.phases import phase1_kernel, phase2_backend, phase4_defrag, with_targets


def test_every_phase_target_names_a_gate_and_a_figure():
    for module in (phase2_backend, phase4_defrag):
        gates = {g.name: g for g in module.SPEC.gates}
        named = {t.figure for g in gates.values() for t in g.targets}
        assert named, f"{module.SPEC.id} has no targets"
    fa2 = {t.figure for t in phase1_kernel.SPEC.gate("speedup").targets}
    assert {"fa2_min_speedup", "fa2_median_speedup"} <= fa2


def test_with_targets_refuses_a_gate_the_spec_lacks():
    with pytest.raises(ValueError, match="lacks"):
        with_targets(phase4_defrag.SPEC, {"no_such_gate": [Target(figure="x", op=">=", value=1)]})


def test_with_targets_keeps_thresholds_and_adds_targets():
    spec = with_targets(phase4_defrag.SPEC, {"copy_budget": [Target(figure="y", op="<=", value=2)]})
    before, after = phase4_defrag.SPEC.gate("copy_budget"), spec.gate("copy_budget")
    assert after.thresholds == before.thresholds
    assert [t.figure for t in after.targets] == [t.figure for t in before.targets] + ["y"]


def test_fa2_comparison_says_why_it_measured_nothing_without_flashinfer(monkeypatch):
    from kdtree.kernels import flashinfer_peer
    from kdtree.phases.phase1_peers import add_fa2_figures

    monkeypatch.setattr(flashinfer_peer, "unavailable_reason", lambda backend, device=None: "no flashinfer")
    result = GateResult(gate="speedup", kind="speedup", outcome=Outcome.FAILED)
    add_fa2_figures(result, phase1_kernel.SPEC.gate("speedup"), [], GateContext(device="cpu"),
                    op=None, timer=None, floor_s=None)
    assert result.details["fa2"].startswith("not measured") and "no flashinfer" in result.details["fa2"]
    assert not [f for f in result.figures if f.name.startswith("fa2_")]  # nothing invented
