"""Phase 4's gates bound to this project: they pass on the real defrag and fail, for the stated
reason, on broken relocations (one that drops a row, one that forgets to update the map, one that
copies past its budget, one that does nothing). GPU gates skip on CPU with the reason."""

from __future__ import annotations

import pytest

from kdtree.engine.kv.relocation import Relocator
from kdtree.gates.base import GateContext, Outcome, run_check
from kdtree.orchestrator.plan import resolve_check
from kdtree.phases import phase4
from kdtree.phases.phase4 import checks as phase4_checks

SMALL_SCALE = dict(num_slots=1 << 14, live_requests=12, steps=30, prompt_len=(64, 512), new_tokens=(16, 192))
SMALL_ALLOC_COST = dict(num_slots=1 << 15, live_requests=8, steps=20, prompt_len=(2048, 2048), new_tokens=(16, 128))
SMALL_INTEGRITY = dict(num_slots=4096, live_requests=6, steps=20, prompt_len=(16, 192), new_tokens=(8, 64))


SMALL = {"integrity": dict(SMALL_INTEGRITY, trials=2), "copy_budget": SMALL_SCALE,
         "contiguity": {"churn": SMALL_SCALE, "alloc_cost": SMALL_ALLOC_COST}}


def _small(spec):
    """The gate's spec with the small workload above as its quick one."""
    if spec.name not in SMALL:
        return spec
    return spec.model_copy(update={"workload": {**spec.workload, "quick": SMALL[spec.name]}})


def _ctx():
    return GateContext(device="cpu", quick=True)


def _run(name, **kw):
    spec = _small(phase4.SPEC.gate(name))
    return run_check(spec, lambda s, c: resolve_check(phase4.CHECKS[name])(s, c, **kw), _ctx())


def _figure(result, name):
    return next(f.value for f in result.figures if f.name == name)


class DropsARow(Relocator):
    """Copies every row of a round but the last."""

    def copy_rows(self, src, dst):
        super().copy_rows(src[:-1], dst[:-1])


class ForgetsTheMap(Relocator):
    """Copies the rows and moves the allocation, but leaves every map pointing at the old slots."""

    def step(self, budget_bytes):
        sets = self.pool.sequence_sets()
        for seqs in sets:
            seqs.rewrite = lambda *a, **k: None
        try:
            return super().step(budget_bytes)
        finally:
            for seqs in sets:
                del seqs.rewrite


class OverBudget(Relocator):
    """Plans as if the budget were ten times larger."""

    def budget_rows(self, budget_bytes):
        return 10 * super().budget_rows(budget_bytes)


class DoesNothing(Relocator):
    def step(self, budget_bytes):
        return super().step(0)


def test_spec_lists_the_issue_gates_and_every_gate_has_a_check():
    names = [g.name for g in phase4.SPEC.gates]
    assert names == ["integrity", "token_exact", "copy_budget", "contiguity", "no_slowdown", "benefit"]
    assert set(phase4.CHECKS) == set(names)
    for gate, targets in phase4.TARGETS.items():
        assert gate in names and targets


@pytest.mark.slow
def test_integrity_passes_on_the_real_relocation():
    r = _run("integrity", trials=1)
    assert r.outcome is Outcome.PASSED, r.summary
    assert _figure(r, "rows_relocated") > 0 and _figure(r, "rounds_checked") == SMALL_INTEGRITY["steps"]


@pytest.mark.slow
def test_integrity_fails_when_a_row_is_dropped():
    r = _run("integrity", relocator_cls=DropsARow, trials=1)
    assert r.outcome is Outcome.FAILED
    assert _figure(r, "kv_bytes_changed") > 0
    assert "kv_bytes_changed" in r.summary


@pytest.mark.slow
def test_integrity_fails_when_the_map_is_not_updated():
    r = _run("integrity", relocator_cls=ForgetsTheMap, trials=1)
    assert r.outcome is Outcome.FAILED
    assert _figure(r, "kv_slots_lost") > 0  # the maps point at slots the allocator freed
    assert "kv_slots_lost" in r.summary


def test_copy_budget_passes_and_fails_when_the_budget_is_exceeded():
    good = _run("copy_budget")
    assert good.outcome is Outcome.PASSED, good.summary
    assert _figure(good, "max_step_copy_over_budget") <= 1.0
    bad = _run("copy_budget", relocator_cls=OverBudget)
    assert bad.outcome is Outcome.FAILED
    assert _figure(bad, "max_step_copy_over_budget") > 1.0
    assert "max_step_copy_over_budget" in bad.summary


def test_contiguity_fails_when_relocation_does_nothing():
    r = _run("contiguity", relocator_cls=DoesNothing)
    assert r.outcome is Outcome.FAILED
    assert _figure(r, "run_reduction_tier01") < 10
    assert _figure(r, "runs_per_request_tier01") == _figure(r, "runs_per_request_tier0")


def test_contiguity_records_every_mode_and_the_sglang_model_cost():
    r = _run("contiguity")
    assert r.outcome in (Outcome.PASSED, Outcome.FAILED)  # the small workload may fall short of 10x
    for name in ("unsorted", "sglang_sorted", "tier0", "tier01"):
        assert _figure(r, f"runs_per_request_{name}") >= 1
    assert _figure(r, "runs_per_request_tier01") < _figure(r, "runs_per_request_unsorted")
    assert _figure(r, "alloc_us_per_step_sglang_model") > 0
    for name in ("unsorted", "tier01", "sglang_model"):  # the target's B=8 allocator cost, by scheme
        assert _figure(r, f"allocator_us_per_step_b8_{name}") > 0
    floor = _figure(r, "verify_step_ms_hbm_floor")
    assert 0.9 < floor < 1.0  # dsv3-tp8, B=8, L=32k: 4.0 GB / 4.3 TB/s
    assert _figure(r, "alloc_cost_fraction_of_hbm_floor") == pytest.approx(
        _figure(r, "allocator_us_per_step_b8_tier01") / 1e3 / floor)


@pytest.mark.slow
def test_token_exact_passes_with_defrag_and_fails_when_a_row_is_dropped():
    for _ in range(4):  # as below: a draw that relocates nothing fails for that reason alone
        good = _run("token_exact", requests=4, trials=1)
        if _figure(good, "rows_relocated") > 0:
            break
        assert good.outcome is Outcome.FAILED and "rows_relocated 0 >= 1" in good.summary
    assert good.outcome is Outcome.PASSED, good.summary
    assert _figure(good, "rows_relocated") > 0 and _figure(good, "exact_fraction") == 1.0
    for _ in range(4):  # a draw whose workload never fragments relocates nothing (rare): draw again
        bad = _run("token_exact", relocator_cls=ForgetsTheMap, requests=4, trials=1)
        assert bad.outcome in (Outcome.FAILED, Outcome.ERROR), bad.summary
        if bad.outcome is Outcome.ERROR or _figure(bad, "rows_relocated") > 0:
            break
        assert "rows_relocated 0 >= 1" in bad.summary  # the vacuous draw fails too, for that reason
    if bad.outcome is Outcome.FAILED:
        assert _figure(bad, "exact_fraction") < 1.0, bad.summary
        assert bad.details["divergences"]


def test_benefit_records_the_cpu_fallback_and_every_figure():
    lc = dict(num_slots=1 << 13, live_requests=4, prompt_len=(1024, 1024), new_tokens=(32, 128), steps=20)
    r = _run("benefit", long_context=lc, repeats=2)
    assert r.outcome in (Outcome.PASSED, Outcome.FAILED), r.summary
    assert _figure(r, "measured_on_gpu") == 0 and "CPU" in r.details["fallback"]
    assert _figure(r, "metadata_runs_bytes_defragmented") < _figure(r, "metadata_indices_bytes")
    assert _figure(r, "runs_per_request_defragmented") < _figure(r, "runs_per_request_fragmented")
    # (a) SGLang's PD hand-off: one transfer per run per layer, so defrag cuts the transfers
    assert _figure(r, "pd_transfers_per_layer_defragmented") < _figure(r, "pd_transfers_per_layer_fragmented")
    assert _figure(r, "pd_handoff_speedup") > 0 and "group_concurrent_contiguous" in r.details["pd_handoff"]
    assert r.figures[0].name == "pd_handoff_speedup" and "pd_handoff_speedup" in r.details["gated_figure"]
    for method in ("best_of", "per_run_copies", "gather"):  # the offload round trip: recorded
        assert _figure(r, f"round_trip_speedup_{method}") > 0
    # (b) the gather's staging: one request's rows, per layer and for 61 layers
    tokens = r.details["request_tokens"]
    assert _figure(r, "gather_staging_MB_per_layer") == pytest.approx(tokens * 1152 / 1e6)
    assert _figure(r, "gather_staging_GB_61_layers") == pytest.approx(61 * tokens * 1152 / 1e9)
    assert _figure(r, "interference_measured") == 0 and "not measured" in r.details["fallback"]
    assert _figure(r, "indices_upload_us") > 0


def test_pairwise_runs_break_where_either_side_breaks():
    from kdtree.bench.defrag_measure import pairwise_runs

    assert pairwise_runs([5, 6, 7, 9, 10], [0, 1, 2, 3, 4]) == [(5, 0, 3), (9, 3, 2)]
    assert pairwise_runs([5, 6, 7], [0, 2, 3]) == [(5, 0, 1), (6, 2, 2)]  # the destination breaks
    assert pairwise_runs([], []) == []
    with pytest.raises(ValueError, match="destinations"):
        pairwise_runs([1, 2], [0])


def test_benefit_fails_when_the_defragmenter_does_not_defragment():
    # the broken candidate: the "defragmented" layout is the unsorted allocator's, so the PD
    # hand-off issues as many transfers either way and cannot be 2x faster
    lc = dict(num_slots=1 << 13, live_requests=4, prompt_len=(1024, 1024), new_tokens=(32, 128), steps=20)
    # 9 repeats: a median of 3 wall-clock copies was moved 40x by the scheduler on a loaded 2-core machine
    r = _run("benefit", long_context=lc, repeats=9, defrag_mode="unsorted")
    assert r.outcome is Outcome.FAILED, r.summary
    assert "pd_handoff_speedup" in r.summary and r.details["defrag_mode"] == "unsorted"
    assert _figure(r, "pd_transfers_per_layer_defragmented") == _figure(r, "pd_transfers_per_layer_fragmented")


@pytest.mark.gpu
def test_benefit_on_the_gpu_measures_interference():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    lc = dict(num_slots=1 << 17, live_requests=8, prompt_len=(4096, 4096), new_tokens=(64, 256), steps=30)
    r = run_check(phase4.SPEC.gate("benefit"),
                  lambda s, c: phase4_checks.check_benefit(s, c, long_context=lc, repeats=3),
                  GateContext(device="cuda"))
    assert r.outcome in (Outcome.PASSED, Outcome.FAILED), r.summary + (r.traceback or "")
    assert _figure(r, "interference_measured") == 1
    for method in ("gather", "runs"):
        for name in ("fragmented", "defragmented"):
            assert _figure(r, f"main_stream_slowdown_{method}_{name}") > 0.5


def test_no_slowdown_skips_on_cpu_with_the_reason():
    r = run_check(phase4.SPEC.gate("no_slowdown"), resolve_check(phase4.CHECKS["no_slowdown"]),
                  GateContext(device="cpu", requested_device="cpu"))
    assert r.outcome is Outcome.SKIPPED and "--device cpu" in r.reason


def test_no_slowdown_logic_on_cpu_with_the_torch_kernel():
    from kdtree.kernels.naive import tree_verify_mla_naive

    # requests longer than 6 steps can emit (16 tokens each at most), so some are live at the end
    lc = dict(num_slots=1 << 12, live_requests=2, prompt_len=(128, 128), new_tokens=(100, 200), steps=6,
              step_num_slots=1 << 12)
    spec = phase4.SPEC.gate("no_slowdown").model_copy(update={"requires": []})
    r = run_check(spec, lambda s, c: phase4_checks.check_no_slowdown(
        s, c, kernel_fn=tree_verify_mla_naive, layers=2, long_context=lc, repeats=3), _ctx())
    assert r.outcome in (Outcome.PASSED, Outcome.FAILED), r.summary + (r.traceback or "")
    assert _figure(r, "kernel_outputs_max_abs_diff") == 0  # same KV, same order: identical output
    assert _figure(r, "runs_per_request_defragmented") <= _figure(r, "runs_per_request_fragmented")
    assert _figure(r, "runs_kernel_measured") == 0  # the runs path is the CUDA kernel's


@pytest.mark.gpu
def test_no_slowdown_on_the_gpu():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    lc = dict(num_slots=1 << 18, live_requests=8, prompt_len=(8192, 8192), new_tokens=(64, 512), steps=30,
              step_num_slots=1 << 17)
    spec = phase4.SPEC.gate("no_slowdown")
    r = run_check(spec, lambda s, c: phase4_checks.check_no_slowdown(s, c, layers=8, long_context=lc, repeats=10),
                  GateContext(device="cuda"))
    assert r.outcome in (Outcome.PASSED, Outcome.FAILED), r.summary + (r.traceback or "")
    assert _figure(r, "kernel_outputs_max_abs_diff") <= 1e-2  # same KV in token order: same output
    assert _figure(r, "runs_per_request_defragmented") < _figure(r, "runs_per_request_fragmented")
    assert _figure(r, "runs_kernel_measured") == 1
    assert _figure(r, "runs_kernel_outputs_identical") == 1  # runs and kv_indices: the same bits
    for name in ("fragmented", "defragmented"):
        assert _figure(r, f"runs_kernel_ms_{name}") > 0
