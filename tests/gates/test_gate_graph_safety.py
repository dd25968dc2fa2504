"""CUDA-graph safety gate: the verdict logic on CPU, and capture/replay (`kdtree.bench.graph_replay`)
against broken callables on GPU."""

from __future__ import annotations

import math

import pytest
import torch

from kdtree.bench.graph_replay import GraphCase, copy_into_static, graph_protocol, looks_like_sync, measure_graph_cases
from kdtree.gates.base import GateContext, Outcome
from kdtree.gates.graph_safety import CaseReport, summarize
from kdtree.gates.spec import GraphSafetyGateSpec
from kdtree.gates.stats import Spread


def check_graph_safety(spec, cases, fn, ctx):
    """What phase 3 does: measure every case with the spec's protocol, then judge."""
    reports, details = measure_graph_cases([(case, fn) for case in cases], ctx, **graph_protocol(spec))
    return summarize(spec, reports, **details)

SPEC = GraphSafetyGateSpec(name="toy-graph", replays=4, max_rel_l2=0.0)


def fig(result, name):
    return next(f for f in result.figures if f.name == name)


# --- CPU: the verdict and the helpers --------------------------------------------------------

def test_summarize_clean_reports_pass():
    reports = [CaseReport(name="a", replays=4), CaseReport(name="b", replays=4, worst_rel_l2=0.0)]
    r = summarize(SPEC, reports)
    assert r.outcome is Outcome.PASSED and fig(r, "replays_compared").value == 8


def test_summarize_capture_failure_sync_and_allocations_fail():
    reports = [CaseReport(name="a", capture_error="RuntimeError: called a synchronizing CUDA operation",
                          host_sync=True, worst_rel_l2=math.nan),
               CaseReport(name="b", allocations=3, replays=4)]
    r = summarize(SPEC, reports)
    assert r.outcome is Outcome.FAILED
    assert fig(r, "capture_failures").value == 1 and fig(r, "allocations_in_capture").value == 3
    assert fig(r, "replays_compared").value == 4 and not fig(r, "replays_compared").ok
    assert "host sync during capture" in r.summary and "3 allocations" in r.summary


def test_summarize_replay_allocations_fail_and_pool_allocations_are_recorded():
    r = summarize(SPEC, [CaseReport(name="step", replays=4, pool_allocations=40),
                         CaseReport(name="launch", replays=4, replay_allocations=2)])
    assert r.outcome is Outcome.FAILED
    assert fig(r, "allocations_in_replay").value == 2 and not fig(r, "allocations_in_replay").ok
    assert fig(r, "pool_allocations_in_capture").value == 40 and fig(r, "pool_allocations_in_capture").ok is None
    assert "launch: 2 allocations during 4 replays" in r.summary
    clean = summarize(SPEC, [CaseReport(name="step", replays=4, pool_allocations=40)])
    assert clean.outcome is Outcome.PASSED and fig(clean, "allocations_in_capture").value == 0


def test_summarize_replay_mismatch_fails():
    r = summarize(SPEC, [CaseReport(name="a", replays=4, worst_rel_l2=0.3, problems=["seed 1: mismatch"])])
    assert r.outcome is Outcome.FAILED and "mismatch" in r.summary


def test_summarize_replay_speedup_figure():
    spec = SPEC.model_copy(update={"min_replay_speedup": 1.5})
    rep = CaseReport(name="a", replays=4, replay_s=Spread(1.0, 1.0, 1.0, 3), eager_s=Spread(2.0, 2.0, 2.0, 3))
    assert summarize(spec, [rep]).outcome is Outcome.PASSED
    rep.eager_s = Spread(1.2, 1.2, 1.2, 3)
    r = summarize(spec, [rep])
    assert r.outcome is Outcome.FAILED and fig(r, "replay_speedup").value == pytest.approx(1.2)


def test_summarize_nothing_is_an_error():
    assert summarize(SPEC, []).outcome is Outcome.ERROR


def test_copy_into_static_checks_shapes_and_constants():
    static = {"a": torch.zeros(3), "scale": 0.5}
    copy_into_static(static, {"a": torch.ones(3), "scale": 0.5})
    assert static["a"].sum() == 3
    with pytest.raises(ValueError, match="shape"):
        copy_into_static(static, {"a": torch.ones(4), "scale": 0.5})
    with pytest.raises(ValueError, match="cannot see"):
        copy_into_static(static, {"a": torch.ones(3), "scale": 0.7})


def test_looks_like_sync():
    assert looks_like_sync("RuntimeError: called a synchronizing CUDA operation")
    assert looks_like_sync("CUDA error: operation not permitted when stream is capturing")
    assert not looks_like_sync("ValueError: bad shape")


# --- GPU: real capture and replay ------------------------------------------------------------

def _inputs(seed, device, n=1000):
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(n, generator=g), torch.randn(n, generator=g)
    k = int(torch.randint(1, n, (1,), generator=g))
    return {"a": a.to(device), "b": b.to(device), "k": torch.tensor(k)}  # "k" stays on the host


def _outputs(inputs):
    return {"y": torch.empty_like(inputs["a"])}


CASE = GraphCase("vec", _inputs, _outputs)
GPU_CTX = GateContext(device="cuda")


def good(inputs, outputs):
    torch.mul(inputs["a"], inputs["b"], out=outputs["y"])
    outputs["y"].add_(inputs["a"])


@pytest.mark.gpu
def test_gpu_good_callable_passes():
    spec = SPEC.model_copy(update={"min_replay_speedup": 1e-9, "repeats": 5})
    r = check_graph_safety(spec, [CASE], good, GPU_CTX)
    assert r.outcome is Outcome.PASSED, r.summary
    assert fig(r, "allocations_in_capture").value == 0 and fig(r, "replays_compared").value == 4
    assert r.details["cases"][0]["replay"]["median_ms"] > 0


@pytest.mark.gpu
def test_gpu_allocation_in_capture_fails():
    def allocating(inputs, outputs):
        outputs["y"].copy_(inputs["a"] * inputs["b"] + inputs["a"])  # temporaries

    r = check_graph_safety(SPEC, [CASE], allocating, GPU_CTX)
    assert r.outcome is Outcome.FAILED and fig(r, "allocations_in_capture").value > 0


@pytest.mark.gpu
def test_gpu_a_case_allowed_to_allocate_from_the_graph_pool_passes():
    def allocating(inputs, outputs):
        outputs["y"].copy_(inputs["a"] * inputs["b"] + inputs["a"])

    case = GraphCase("pool", _inputs, _outputs, allow_capture_allocations=True)
    r = check_graph_safety(SPEC, [case], allocating, GPU_CTX)
    assert r.outcome is Outcome.PASSED, r.summary
    assert fig(r, "pool_allocations_in_capture").value > 0 and fig(r, "allocations_in_replay").value == 0


@pytest.mark.gpu
def test_gpu_host_sync_in_capture_fails():
    def syncing(inputs, outputs):
        if float(inputs["a"].abs().max()) > 1e9:  # a device-to-host read
            outputs["y"].zero_()
        good(inputs, outputs)

    r = check_graph_safety(SPEC, [CASE], syncing, GPU_CTX)
    assert r.outcome is Outcome.FAILED
    assert fig(r, "capture_failures").value == 1 and fig(r, "host_syncs_in_capture").value == 1
    assert "host sync during capture" in r.summary
    # the device is still usable afterwards
    assert check_graph_safety(SPEC, [CASE], good, GPU_CTX).outcome is Outcome.PASSED


@pytest.mark.gpu
def test_gpu_host_value_baked_into_the_graph_fails():
    def baked(inputs, outputs):
        k = int(inputs["k"])  # a host tensor: read at capture time, frozen in the graph
        outputs["y"].zero_()
        torch.mul(inputs["a"][:k], inputs["b"][:k], out=outputs["y"][:k])

    r = check_graph_safety(SPEC, [CASE], baked, GPU_CTX)
    assert r.outcome is Outcome.FAILED and not fig(r, "worst_rel_l2").ok


@pytest.mark.gpu
def test_gpu_partial_write_is_caught_on_replay():
    def half(inputs, outputs):
        n = outputs["y"].shape[0] // 2
        torch.mul(inputs["a"][:n], inputs["b"][:n], out=outputs["y"][:n])

    r = check_graph_safety(SPEC, [CASE], half, GPU_CTX)
    assert r.outcome is Outcome.FAILED and "unwritten" in r.summary
