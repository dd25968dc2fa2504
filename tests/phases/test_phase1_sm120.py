"""Phase 1's speed gate times two dispatches: this device's and the sm_120 path (issue 30), and
reports the default against FlashMLA's dense decode where it loads.

CPU: the gate run end to end with the op contract's CPU oracle standing in for every timed callable
(kernel, sm_120 path, Triton baseline, FlashInfer peers), a fake mma.sync ceiling and fake
shared-memory records: both dispatches' figures are recorded and every target on them is evaluated
(met or not met, never "not measured"); a broken sm_120 path, or one over sm_120's shared memory,
fails the gate. GPU (skipped on CPU): the real sm_120 path agrees with the default dispatch.
"""

from __future__ import annotations


import pytest
import torch

from kdtree.bench import flashinfer_peer, flashmla_peer
from kdtree.bench import timing as tools_timing
from kdtree.gates.base import GateContext, GateResult, Outcome, run_check
from kdtree.kernels.launch_plan import choose_variant, variant_name
from kdtree.kernels.naive import tree_verify_mla_naive
from kdtree.orchestrator.targets import evaluate_target
from kdtree.phases import phase1
from kdtree.phases.phase1 import checks as phase1_checks, sm120 as phase1_sm120

CEILING_ROWS = [{"device": "fake", "sm": 90, "sms": 132},
                {"warps_per_sm": 8, "ldsm_bytes_per_mma": 0, "mma": True, "tflops": 500.0},
                {"warps_per_sm": 16, "ldsm_bytes_per_mma": 0, "mma": True, "tflops": 560.0},
                {"warps_per_sm": 8, "ldsm_bytes_per_mma": 256, "mma": True, "tflops": 467.0},
                {"warps_per_sm": 8, "ldsm_bytes_per_mma": -1, "mma": False, "tflops": 0.0}]
SMEM_OK = {"base16": 60000, "base32": 90000, "ws": 99000, "wgmma": 231200}
CONFIGS = [(2, 4, 1, 120), (3, 20, 2, 60)]  # (H, T, B, L): base16 and ws on the sm_120 path


def _oracle(*args, out=None, lse=None):  # every timed callable's CPU stand-in (plain torch: fast enough)
    got = tree_verify_mla_naive(*args)
    return got if out is None else out.copy_(got)


# The timed callables declare what a call "costs"; the gate's timer returns it (perf_counter on a
# shared CPU would make the ratios noise). Costs in seconds: the default dispatch 1 ms, the sm_120
# path 1.5 ms, Triton 20 ms, FA2 as built for Hopper 1.2 ms, FA2 with sm_120's shared memory 3 ms, FA3 0.9 ms,
# FlashMLA's dense decode 1.1 ms.
COSTS = {"default": 1e-3, "sm120": 1.5e-3, "triton": 20e-3, "fa2": 1.2e-3, "fa2_smem": 3e-3, "fa3": 0.9e-3,
         "flashmla": 1.1e-3}
_last = {"cost": None}


def _costed(fn, label):
    def call(*args, **kwargs):
        _last["cost"] = COSTS[label]
        return fn(*args, **kwargs)
    return call


def declared_cost_timer(fn):
    _last["cost"] = None
    fn()
    assert _last["cost"] is not None, "a timed call declared no cost"
    return _last["cost"]


class FakePeer:
    """FlashInfer's MLA stand-in: the oracle on the causal chain (what the peers compute)."""

    built: list = []

    def __init__(self, backend, device="cuda", smem_per_sm=None):
        self.backend, self.smem_per_sm = backend, smem_per_sm
        FakePeer.built.append((backend, smem_per_sm))

    def bind(self, q, kv, qo, kvp, kvi, scale):
        chain = flashinfer_peer.chain_mask(qo)
        label = "fa2_smem" if self.smem_per_sm else self.backend
        return _costed(lambda: _oracle(q, kv, qo, kvp, kvi, chain, scale), label)


class _Pool:
    def __init__(self, gb):
        from kdtree.bench.cases import make_pool

        self.tensor = make_pool(4096, "cpu", 7)


@pytest.fixture
def cpu_gate(monkeypatch):
    """phase1_checks's speed gate with every GPU-only piece replaced by a CPU stand-in."""
    from kdtree.kernels import triton_baseline

    monkeypatch.setattr(tools_timing, "measure_ceilings", lambda: (4e12, 1e12))  # every config tensor-core bound
    monkeypatch.setattr(phase1_checks, "_Pool", _Pool)
    monkeypatch.setattr(phase1_checks, "_gpu_timer", lambda: declared_cost_timer)
    monkeypatch.setattr(triton_baseline, "tree_verify_mla_triton", _costed(_oracle, "triton"))
    monkeypatch.setattr(flashinfer_peer, "unavailable_reason", lambda backend, device=None, smem_per_sm=None: None)
    monkeypatch.setattr(flashinfer_peer, "FlashInferMLA", FakePeer)
    monkeypatch.setattr(flashinfer_peer, "version", lambda: "0.7.2.post1")
    FakePeer.built = []
    spec = phase1.SPEC.gate("speedup").model_copy(
        update={"requires": [], "warmup": 1, "repeats": 3, "trials": 2,
                "workload": {"quick": {"configs": CONFIGS, "pool_gb": 2.0}}})
    calls = {"sm120": 0}

    def sm120_ok(*args, out=None, lse=None):
        calls["sm120"] += 1
        return _oracle(*args, out=out, lse=lse)

    def costed_sm120(fn):
        return _costed(fn, "sm120")

    def run(sm120_fn=sm120_ok, smem=SMEM_OK, ceiling=lambda: CEILING_ROWS):
        check = lambda s, c: phase1_checks._speed(s, c, "triton", candidate_fn=_costed(_oracle, "default"),
                                                sm120_fn=costed_sm120(sm120_fn),
                                                mma_ceiling=ceiling, smem_of=lambda device: smem)
        return run_check(spec, check, GateContext(device="cpu", quick=True))

    run.calls = calls
    run.spec = spec
    return run


@pytest.fixture
def flashmla_gate(cpu_gate, monkeypatch, fake_flash_mla):
    """cpu_gate with FlashMLA loaded: the ``fake_flash_mla`` stand-in (right, or 1.5x the right
    output with ``wrong=True``), its calls costed at 1.1 ms."""

    class Costed(flashmla_peer.FlashMLADecode):
        def bind(self, *args):
            return _costed(super().bind(*args), "flashmla")

    def run(wrong=False):
        module = fake_flash_mla(wrong=wrong)
        monkeypatch.setattr(flashmla_peer, "unavailable_reason", lambda device=None: None)
        monkeypatch.setattr(flashmla_peer, "FlashMLADecode", Costed)
        result = cpu_gate()
        run.calls = module.calls
        return result

    run.spec = cpu_gate.spec
    return run


def _figures(result: GateResult) -> dict:
    return {f.name: f.value for f in result.figures}


def test_sm120_variant_is_what_compute_capability_12_dispatches():
    # 64+ rows per request: wgmma on 9.0, ws on 12.0; up to 16: base16 on both
    assert variant_name(choose_variant(64, (9, 0))) == "wgmma"
    assert phase1_sm120.sm120_variant(64, 1, 1) == "ws"
    assert phase1_sm120.sm120_variant(8, 16, 1) == "ws"  # 128 rows per request
    assert phase1_sm120.sm120_variant(16, 1, 1) == "base16"
    assert phase1_sm120.sm120_variant(16, 2, 2) == "base16"  # 16 rows per request


@pytest.mark.slow
def test_the_gate_records_both_dispatches_and_evaluates_every_target(cpu_gate):
    result = cpu_gate()
    assert result.outcome is Outcome.PASSED, result.summary
    figs = _figures(result)
    assert cpu_gate.calls["sm120"] > 0  # the sm_120 path was timed, not assumed
    for name in ("median_speedup", "fa2_median_speedup", "fa3_median_speedup", "fa3_min_speedup_tc",
                 "sm120_path_median_speedup", "sm120_path_min_speedup", "sm120_path_fa2_median_speedup",
                 "sm120_path_fa2_sm120smem_median_speedup", "sm120_path_median_mma_ceiling",
                 "sm120_path_median_roofline"):
        assert figs.get(name) is not None and figs[name] > 0, name
    assert figs["sm120_path_disagreeing_configs"] == 0 and figs["sm120_path_stale_configs"] == 0
    assert figs["sm120_path_smem_bytes"] == 99000  # ws, the largest variant it launched
    assert result.details["sm120_path"]["variants"] == {"H2 T4 B1 L0k": "base16", "H3 T20 B2 L0k": "ws"}
    assert ("fa2", 102400) in FakePeer.built and ("fa2", None) in FakePeer.built  # both FA2 builds, one run
    assert figs["median_speedup"] == pytest.approx(20.0) and figs["sm120_path_median_speedup"] == pytest.approx(20 / 1.5)
    assert figs["sm120_path_fa2_median_speedup"] == pytest.approx(0.8)
    assert figs["sm120_path_fa2_sm120smem_median_speedup"] == pytest.approx(2.0)
    assert figs["fa2_median_speedup"] == pytest.approx(1.2) and figs["fa3_median_speedup"] == pytest.approx(0.9)
    status = {}
    for t in cpu_gate.spec.targets:  # every target, both dispatches': evaluated, none "not measured"
        status[(t.figure, t.value)] = evaluate_target("speedup", t, result).status
        if t.figure.startswith("flashmla"):  # this gate has no FlashMLA on the path (flashmla_gate has)
            assert status[(t.figure, t.value)] == "not measured"
            continue
        assert status[(t.figure, t.value)] in ("met", "not met"), t.figure
    assert status[("sm120_path_fa2_sm120smem_median_speedup", 2.0)] == "met"
    assert status[("sm120_path_median_speedup", 12.0)] == "met"
    assert status[("fa3_median_speedup", 1.15)] == "not met" and status[("fa2_median_speedup", 1.25)] == "not met"
    # the sm_120 path's ceiling fraction: floor at the fastest register-operand mma.sync rate (560 TFLOP/s)
    fractions = result.details["sm120_path"]["mma_ceiling"]["fraction_by_config"]
    assert result.details["sm120_path"]["mma_ceiling"]["mma_sync_flops_per_s"] == 560e12
    assert sorted(fractions) == ["H2 T4 B1 L0k", "H3 T20 B2 L0k"]


def test_the_speed_targets_are_issue_35s():
    targets = {t.figure: (t.op, t.value) for t in phase1.SPEC.gate("speedup").targets}
    assert targets["sm120_path_fa2_sm120smem_median_speedup"] == (">=", 2.0)
    assert targets["sm120_path_median_speedup"] == (">=", 12.0)
    assert targets["fa3_min_speedup_tc"] == (">=", 1.0) and targets["fa3_median_speedup"] == (">=", 1.15)
    assert targets["flashmla_median_speedup"] == (">=", 0.9)
    assert (">=", 0.35) in [(t.op, t.value) for t in phase1.SPEC.gate("speedup").targets
                            if t.figure == "min_roofline"]
    assert (">=", 0.75) in [(t.op, t.value) for t in phase1.SPEC.gate("speedup").targets
                            if t.figure == "median_roofline"]
    assert targets["fa2_min_speedup"] == (">=", 1.0) and targets["fa2_median_speedup"] == (">=", 1.25)


def test_a_broken_sm120_path_fails_the_gate_while_the_default_passes(cpu_gate):
    def dropped_prefix(q, kv, qo, kvp, kvi, mask, scale, out=None, lse=None):
        got = _oracle(q, kv, qo, kvp, kvi, mask, scale) * 1.5  # wrong answer
        return got if out is None else out.copy_(got)

    result = cpu_gate(sm120_fn=dropped_prefix)
    figs = _figures(result)
    assert result.outcome is Outcome.FAILED
    assert figs["sm120_path_disagreeing_configs"] == len(CONFIGS)
    assert figs["disagreeing_configs"] == 0 and figs["median_speedup"] is not None
    assert figs["sm120_path_median_speedup"] is None  # its time never counts


@pytest.mark.slow
def test_an_sm120_path_over_sm120_shared_memory_fails_the_gate(cpu_gate):
    result = cpu_gate(smem={**SMEM_OK, "ws": 101377})
    assert result.outcome is Outcome.FAILED
    assert "not sm_120's" in result.summary and _figures(result)["sm120_path_smem_bytes"] == 101377


@pytest.mark.slow
def test_an_sm120_path_that_caches_on_pointers_is_stale(cpu_gate):
    memo = {}

    def cached(q, *rest, out=None, lse=None):
        key = q.data_ptr()
        if key not in memo:
            memo[key] = _oracle(q, *rest)
        return memo[key]

    result = cpu_gate(sm120_fn=cached)
    assert result.outcome is Outcome.FAILED and _figures(result)["sm120_path_stale_configs"] >= 1


@pytest.mark.slow
def test_an_unmeasurable_mma_ceiling_leaves_its_figures_unmeasured_with_the_reason(cpu_gate):
    def no_gpu():
        raise RuntimeError("no CUDA GPU")

    result = cpu_gate(ceiling=no_gpu)
    assert result.outcome is Outcome.PASSED
    assert _figures(result)["sm120_path_median_mma_ceiling"] is None
    assert "no CUDA GPU" in result.details["sm120_path"]["mma_ceiling"]


def test_mma_sync_peak_needs_a_register_operand_rate():
    assert phase1_sm120.mma_sync_peak_flops(CEILING_ROWS) == 560e12
    with pytest.raises(ValueError, match="registers"):
        phase1_sm120.mma_sync_peak_flops(CEILING_ROWS[:1] + CEILING_ROWS[3:])


def test_hold_smem_fails_a_variant_the_extension_does_not_record():
    result = GateResult(gate="speedup", kind="speedup", outcome=Outcome.PASSED, summary="s")
    phase1_sm120.hold_smem(result, {"a": "ws"}, {"base16": 1})
    assert result.outcome is Outcome.FAILED and "records no shared memory" in result.summary


@pytest.mark.gpu
def test_the_sm120_path_matches_the_default_dispatch_on_the_gpu():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU on this machine (torch.cuda.is_available() is False)")
    from kdtree.bench.cases import case_args, make_case
    from kdtree.kernels import tree_verify_mla

    for H, reqs in [(16, [(64, 3000)]), (2, [(4, 500), (3, 9)])]:
        case = make_case(H, reqs, "random", 5, device="cuda")
        got, want = phase1_sm120.sm120_path(*case_args(case)), tree_verify_mla(*case_args(case))
        assert float((got.double() - want.double()).norm() / want.double().norm()) < 1e-2
    smem = phase1_checks._device_smem("cuda")
    assert smem["ws"] <= phase1_sm120.SM120_MAX_SHARED_BYTES and smem["base16"] <= phase1_sm120.SM120_MAX_SHARED_BYTES


def test_flashmla_is_timed_against_the_default_dispatch_and_reported(flashmla_gate):
    result = flashmla_gate()
    assert result.outcome is Outcome.PASSED, result.summary
    figs = _figures(result)
    assert flashmla_gate.calls > 0
    assert figs["flashmla_median_speedup"] == pytest.approx(1.1)
    assert figs["flashmla_min_speedup"] == pytest.approx(1.1)
    assert figs["flashmla_min_speedup_tc"] == pytest.approx(1.1)  # every config tensor-core bound here
    details = result.details["flashmla"]
    assert details["page_size"] == 64 and details["outcome"] == "passed"
    errors = details["oracle_rel_l2"]  # every input set's output held to the fp64 oracle on the chain
    assert sorted(errors) == ["H2 T4 B1 L0k", "H3 T20 B2 L0k"]
    assert all(e is not None and e < 1e-2 for errs in errors.values() for e in errs)
    assert all(len(errs) == flashmla_gate.spec.trials for errs in errors.values())
    target = next(t for t in flashmla_gate.spec.targets if t.figure == "flashmla_median_speedup")
    assert (target.op, target.value) == (">=", 0.9)  # issue 35's target, evaluated on the figure above
    assert evaluate_target("speedup", target, result).status == "met"


def test_a_wrong_flashmla_output_never_counts_and_never_fails_the_gate(flashmla_gate):
    result = flashmla_gate(wrong=True)
    assert result.outcome is Outcome.PASSED, result.summary
    figs = _figures(result)
    assert figs["flashmla_median_speedup"] is None and figs["flashmla_min_speedup_tc"] is None
    assert figs["median_speedup"] == pytest.approx(20.0)  # the gate's own figures untouched
    details = result.details["flashmla"]
    assert all(e is not None and e > 0.3 for errs in details["oracle_rel_l2"].values() for e in errs)
    assert {r["status"] for r in details["configs"]} == {"disagree"}
