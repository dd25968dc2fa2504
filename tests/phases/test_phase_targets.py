"""Targets attached to the phases' gates, and phase 1's FA2 comparison where FlashInfer is absent."""

import pytest

from kdtree.gates.base import GateContext, GateResult, Outcome
from kdtree.gates.spec import Target
from kdtree.phases import phase1, phase2, phase4, with_targets


def test_every_phase_target_names_a_gate_and_a_figure():
    for module in (phase2, phase4):
        gates = {g.name: g for g in module.SPEC.gates}
        named = {t.figure for g in gates.values() for t in g.targets}
        assert named, f"{module.SPEC.id} has no targets"
    fa2 = {t.figure for t in phase1.SPEC.gate("speedup").targets}
    assert {"fa2_min_speedup", "fa2_median_speedup"} <= fa2


def test_with_targets_refuses_a_gate_the_spec_lacks():
    with pytest.raises(ValueError, match="lacks"):
        with_targets(phase4.SPEC, {"no_such_gate": [Target(figure="x", op=">=", value=1)]})


def test_with_targets_keeps_thresholds_and_adds_targets():
    spec = with_targets(phase4.SPEC, {"copy_budget": [Target(figure="y", op="<=", value=2)]})
    before, after = phase4.SPEC.gate("copy_budget"), spec.gate("copy_budget")
    assert after.thresholds == before.thresholds
    assert [t.figure for t in after.targets] == [t.figure for t in before.targets] + ["y"]


@pytest.mark.parametrize("backend", ["fa2", "fa3"])
def test_peer_comparison_says_why_it_measured_nothing_without_flashinfer(monkeypatch, backend):
    from kdtree.bench import flashinfer_peer
    from kdtree.phases.phase1.peers import add_peer_figures

    monkeypatch.setattr(flashinfer_peer, "unavailable_reason", lambda backend, device=None, smem_per_sm=None: "no flashinfer")
    result = GateResult(gate="speedup", kind="speedup", outcome=Outcome.FAILED)
    add_peer_figures(result, phase1.SPEC.gate("speedup"), [], GateContext(device="cpu"),
                     op=None, timer=None, floor_s=None, backend=backend)
    assert result.details[backend].startswith("not measured") and "no flashinfer" in result.details[backend]
    assert not [f for f in result.figures if f.name.startswith(backend)]  # nothing invented


def test_fa3_min_over_tensor_core_bound_configs_leaves_bandwidth_bound_ones_out(monkeypatch):
    from types import SimpleNamespace

    from kdtree.bench import flashinfer_peer
    from kdtree.gates import speedup as speedup_mod
    from kdtree.gates.base import Figure
    from kdtree.phases.phase1.peers import add_peer_figures

    monkeypatch.setattr(flashinfer_peer, "unavailable_reason", lambda backend, device=None, smem_per_sm=None: None)
    monkeypatch.setattr(flashinfer_peer, "FlashInferMLA", lambda backend, smem_per_sm=None: SimpleNamespace(bind=None))
    monkeypatch.setattr(flashinfer_peer, "version", lambda: "0.7.2")
    rows = [{"config": "small", "speedup": 0.6}, {"config": "big", "speedup": 0.9}, {"config": "bigger", "speedup": 1.2}]
    peer = GateResult(gate="speedup", kind="speedup", outcome=Outcome.PASSED, details={"configs": rows},
                      figures=[Figure(name="median_speedup", value=0.9), Figure(name="min_speedup", value=0.6)])
    from kdtree.phases.phase1 import peers as peers_mod

    monkeypatch.setattr(peers_mod, "measure_speedup", lambda *a, **k: "measured")
    monkeypatch.setattr(speedup_mod, "judge_speedup", lambda spec, measured, ctx=None: measured == "measured" and peer)
    configs = [SimpleNamespace(name=n, params={}, refresh=None, make_inputs=None) for n in ("small", "big", "bigger")]
    result = GateResult(gate="speedup", kind="speedup", outcome=Outcome.PASSED)
    add_peer_figures(result, phase1.SPEC.gate("speedup"), configs, GateContext(device="cpu"), op=None,
                     timer=None, floor_s=None, backend="fa3", tensor_bound=lambda c: c.name != "small")
    figs = {f.name: f.value for f in result.figures}
    assert figs == {"fa3_median_speedup": 0.9, "fa3_min_speedup": 0.6, "fa3_min_speedup_tc": 0.9}
    assert result.details["fa3"]["tensor_bound_configs"] == ["big", "bigger"]


def test_flashmla_comparison_says_why_it_measured_nothing_where_it_does_not_load(monkeypatch):
    from kdtree.bench import flashmla_peer
    from kdtree.phases.phase1.peers import add_flashmla_figures

    monkeypatch.setattr(flashmla_peer, "unavailable_reason",
                        lambda device=None: "import flash_mla failed: OSError: undefined symbol: x")
    result = GateResult(gate="speedup", kind="speedup", outcome=Outcome.PASSED)
    add_flashmla_figures(result, phase1.SPEC.gate("speedup"), [], GateContext(device="cpu"),
                         op=None, timer=None, floor_s=None)
    assert result.details["flashmla"].startswith("not measured: FlashMLA's dense decode not loaded here")
    assert "undefined symbol: x" in result.details["flashmla"]
    assert not [f for f in result.figures if f.name.startswith("flashmla")]
    assert result.outcome is Outcome.PASSED


def test_a_flashmla_that_loads_but_refuses_a_shape_leaves_its_figures_unmeasured(monkeypatch):
    from types import SimpleNamespace

    from kdtree.bench import flashmla_peer
    from kdtree.bench.cases import make_case
    from kdtree.bench.speed import SpeedConfig
    from kdtree.kernels.naive import tree_verify_mla_naive
    from kdtree.phases.phase1.peers import add_flashmla_figures

    def refuse(*args):
        raise RuntimeError("CUDA error: no kernel image is available for execution on the device")

    monkeypatch.setattr(flashmla_peer, "unavailable_reason", lambda device=None: None)
    monkeypatch.setattr(flashmla_peer, "FlashMLADecode", lambda: SimpleNamespace(bind=refuse))
    config = SpeedConfig(name="tiny", params={}, make_inputs=lambda seed, device: make_case(2, [(2, 8)], "random", seed,
                                                                                           device="cpu"))
    spec = phase1.SPEC.gate("speedup").model_copy(update={"requires": [], "warmup": 1, "repeats": 1, "trials": 2})
    result = GateResult(gate="speedup", kind="speedup", outcome=Outcome.PASSED)
    add_flashmla_figures(result, spec, [config], GateContext(device="cpu"),
                         op=lambda *a, out=None, lse=None: tree_verify_mla_naive(*a), timer=None, floor_s=None)
    details = result.details["flashmla"]
    assert "no kernel image" in details["refused"]["tiny"] and details["configs"][0]["status"] == "disagree"
    assert {f.name: f.value for f in result.figures if f.name.startswith("flashmla")} == {
        "flashmla_median_speedup": None, "flashmla_min_speedup": None, "flashmla_min_speedup_tc": None}
    assert result.outcome is Outcome.PASSED
