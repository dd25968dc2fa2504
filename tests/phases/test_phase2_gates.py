"""Phase 2's gates bound to this project: they pass on the real thing and fail, for the stated
reason, on broken candidates. On the CPU the GPU pieces are swapped for CPU ones with the same
interface (the torch backend for the kernel backend, the oracle for the CUDA op, the fp64
layout oracle for SGLang's Triton kernel, small contexts); the GPU run uses the defaults.
"""

from __future__ import annotations

import pytest
import torch

from kdtree.engine.decode.backends import TorchBackend, dense_attention, register_backend
from kdtree.gates.base import GateContext, Outcome, run_check
from kdtree.gates.spec import Threshold
from kdtree.bench.sglang_batches import sglang_layout_reference
from kdtree.kernels.reference import tree_verify_mla_reference
from kdtree.phases import phase2
from kdtree.phases.phase2 import checks as phase2_checks

CTX = GateContext(device="cpu")


def _spec(name, **update):
    return phase2.SPEC.gate(name).model_copy(update={"requires": [], **update})


class LeakyMaskBackend(TorchBackend):
    """Verify sees every tree node (siblings and descendants too): a wrong answer that stays finite."""

    name = "leaky"

    def forward_verify(self, q, kv_cache, meta, sm_scale):
        meta.tree_mask = meta.tree_mask | 0x7FFFFFFF
        return dense_attention(q, kv_cache, meta, sm_scale)


register_backend("test-leaky", LeakyMaskBackend)


class ZeroVerifyBackend(TorchBackend):
    """Verify returns -100x the attention (finite, far off): greedy tokens change whatever the margins."""

    name = "zero-verify"

    def forward_verify(self, q, kv_cache, meta, sm_scale):
        return -100.0 * dense_attention(q, kv_cache, meta, sm_scale)


register_backend("test-zero-verify", ZeroVerifyBackend)


def test_spec_names_gates_and_targets():
    names = [g.name for g in phase2.SPEC.gates]
    assert names == ["token_exact", "sglang_parity", "verify_speedup", "decode_speedup"]
    assert set(phase2.CHECKS) == set(names)
    assert {t["gate"] for t in phase2.TARGETS.values()} <= set(names)
    assert phase2.TARGETS["decode_speedup_32k"]["value"] == 3.0


# -- token_exact ---------------------------------------------------------------------------------
def _token_exact(backend, long_prompts=1):
    spec = _spec("token_exact", min_prompts=4, max_new_tokens=5)
    return run_check(spec, lambda s, c: phase2_checks.check_token_exact(
        s, c, backend=backend, device="cpu", long_len=160, long_prompts=long_prompts,
        drafters=(("ddtree", 16), ("ngram", 8))), CTX)


@pytest.mark.slow
def test_token_exact_passes_the_torch_backend():
    result = _token_exact("torch")
    assert result.outcome is Outcome.PASSED, result.summary
    assert {f.name for f in result.figures} >= {"exact_fraction", "longest_prompt"}


@pytest.mark.slow
def test_token_exact_fails_a_backend_with_a_leaky_mask():
    result = _token_exact("test-leaky")
    assert result.outcome is Outcome.FAILED
    assert "diverge" in result.summary, result.summary


@pytest.mark.slow
def test_token_exact_fails_without_a_long_prompt():
    result = _token_exact("torch", long_prompts=0)
    assert result.outcome is Outcome.FAILED
    assert "the longest prompt has" in result.summary, result.summary


# -- sglang_parity -------------------------------------------------------------------------------
CPU_PARITY = [c for c in phase2_checks.PARITY_CASES if "L32k" not in c[0] and c[1] <= 16]


def _parity(op):
    spec = _spec("sglang_parity", trials=1)
    return run_check(spec, lambda s, c: phase2_checks.check_sglang_parity(
        s, c, reference=sglang_layout_reference, candidate_op=op, device="cpu", cases=CPU_PARITY), CTX)


@pytest.mark.slow
def test_sglang_parity_passes_the_backend_path():
    result = _parity(tree_verify_mla_reference)
    assert result.outcome is Outcome.PASSED, result.summary


@pytest.mark.slow
def test_sglang_parity_fails_a_leaky_mask():
    def leaky(q, kv, qo, kvp, idx, mask, scale, *, out=None, lse=None):
        # every node sees its whole tree (siblings, descendants): a leak that stays inside the tree,
        # since bits past a tree are refused by the contract itself
        sizes = torch.repeat_interleave(qo[1:] - qo[:-1], qo[1:] - qo[:-1]).to(torch.int64)
        bit = torch.arange(mask.shape[1] * 32, device=mask.device)
        words = (bit[None, :] < sizes[:, None]).to(torch.int64).view(mask.shape[0], mask.shape[1], 32)
        whole_tree = (words << torch.arange(32, device=mask.device)).sum(-1)
        whole_tree = torch.where(whole_tree >= 2**31, whole_tree - 2**32, whole_tree).to(mask.dtype)
        return tree_verify_mla_reference(q, kv, qo, kvp, idx, mask | whole_tree, scale, out=out, lse=lse)

    result = _parity(leaky)
    assert result.outcome is Outcome.FAILED
    assert "rel" in result.summary.lower() or "max" in result.summary.lower(), result.summary


@pytest.mark.slow
def test_sglang_parity_fails_a_kernel_that_leaves_rows_unwritten():
    def lazy(q, kv, qo, kvp, idx, mask, scale, *, out=None, lse=None):
        full = tree_verify_mla_reference(q, kv, qo, kvp, idx, mask, scale)
        out[1:] = full[1:]
        return out

    result = _parity(lazy)
    assert result.outcome is Outcome.FAILED
    assert "unwritten" in result.summary, result.summary


def test_sglang_parity_is_skipped_not_passed_without_sglang():
    result = run_check(_spec("sglang_parity", trials=1),
                       lambda s, c: phase2_checks.check_sglang_parity(s, c, device="cpu"), CTX)
    assert result.outcome is Outcome.SKIPPED and "cannot be imported" in result.reason


# -- verify_speedup ------------------------------------------------------------------------------
def _verify_speed(backends, sm120=None, **thresholds):
    spec = _spec("verify_speedup", warmup=1, repeats=3, **thresholds)
    return run_check(spec, lambda s, c: phase2_checks.check_verify_speedup(
        s, c, preset_name="tiny", contexts=(64, 200), batch=2, budget=8, device="cpu", backends=backends,
        with_converter=False, sm120=sm120), CTX)


@pytest.mark.slow
def test_verify_speedup_measures_the_step_and_its_breakdown():
    result = _verify_speed(("torch", "reference"), min_median_speedup=1e-3, min_each_speedup=1e-3)
    assert result.outcome is Outcome.PASSED, result.summary
    parts = result.details["step_breakdown_ms"]["64"]["torch"]
    assert parts["step_ms"] > 0 and 0 < parts["attention_share"] <= 1.5
    assert {"speedup_64", "speedup_200", "attention_share_torch_200"} <= {f.name for f in result.figures}


@pytest.mark.slow
def test_verify_speedup_reports_the_sm120_path_beside_the_default():
    # on the CPU the engine's torch backend stands in for the forced sm_120 path
    result = _verify_speed(("torch", "reference"), sm120="torch", min_median_speedup=1e-3, min_each_speedup=1e-3)
    assert result.outcome is Outcome.PASSED, result.summary
    figs = {f.name: f for f in result.figures}
    assert figs["sm120_path_speedup_64"].value > 0 and figs["sm120_path_speedup_200"].value > 0
    assert figs["sm120_path_median_speedup"].threshold is None  # reported, the default is held
    assert figs["sm120_path_disagreeing_configs"].value == 0
    assert "sm120_path" in result.details["configs"][0]["others"]


@pytest.mark.slow
def test_verify_speedup_fails_a_broken_sm120_path():
    result = _verify_speed(("torch", "reference"), sm120="test-leaky", min_median_speedup=1e-3, min_each_speedup=1e-3)
    assert result.outcome is Outcome.FAILED
    figs = {f.name: f.value for f in result.figures}
    assert figs["sm120_path_disagreeing_configs"] == 2 and figs["disagreeing_configs"] == 0


def test_the_sm120_backend_runs_the_forced_path():
    from kdtree.engine.decode.backends import get_backend

    backend = get_backend(phase2_checks.sm120_backend())
    assert backend._where == ("kdtree.bench.forced", "sm120_path")


@pytest.mark.slow
def test_verify_speedup_fails_a_candidate_that_disagrees():
    result = _verify_speed(("test-leaky", "reference"), min_median_speedup=1e-3, min_each_speedup=1e-3)
    assert result.outcome is Outcome.FAILED
    assert "disagree" in result.summary, result.summary


@pytest.mark.slow
def test_verify_speedup_fails_a_candidate_that_is_not_faster():
    result = _verify_speed(("reference", "torch"), min_median_speedup=1e6, min_each_speedup=1e6)
    assert result.outcome is Outcome.FAILED
    assert any(f.name == "median_speedup" and f.ok is False for f in result.figures)


# -- decode_speedup ------------------------------------------------------------------------------
class Sm120StandIn(TorchBackend):
    """The sm_120 path's place in the CPU runs: the torch path under another name."""

    name = "test-sm120"


register_backend("test-sm120", Sm120StandIn)


def _decode(backends, bound=1e-3, sm120=None, rounds=2, breakdown=False, min_rounds=2, ctx=CTX):
    spec = _spec("decode_speedup", thresholds=[
        Threshold(figure="decode_speedup_48", op=">=", value=bound, unit="x"),
        Threshold(figure="same_tokens", op="==", value=1.0),
        Threshold(figure="rounds_per_arm", op=">=", value=min_rounds)])
    return run_check(spec, lambda s, c: phase2_checks.check_decode_speedup(
        s, c, preset_name="tiny", runs=((48, 2),), new_tokens=4, device="cpu", backends=backends,
        drafter="ddtree", budget=8, sm120=sm120, rounds=rounds, modes=("eager",), breakdown=breakdown), ctx)


def test_decode_gate_holds_enough_data_and_the_issue_targets():
    gate = phase2.SPEC.gate("decode_speedup")
    held = {t.figure: (t.op, t.value) for t in gate.thresholds}
    assert held["rounds_per_arm"] == (">=", 5) and held["new_tokens_per_request"] == (">=", 64)
    assert held["decode_speedup_32k"] == (">=", 1.5) and held["decode_speedup_128k"] == (">=", 1.5)
    targets = {t.figure: (t.op, t.value) for t in gate.targets}
    assert targets["decode_speedup_32k"] == (">=", 3.0) and targets["decode_speedup_128k"] == (">=", 5.0)
    assert targets["sm120_path_decode_speedup_32k"] == (">=", 2.5)
    assert targets["decode_spread_max"] == ("<", 1.15)
    assert phase2_checks.DECODE_NEW_TOKENS >= 64 and phase2_checks.DECODE_ROUNDS >= 5


@pytest.mark.slow
def test_decode_speedup_reports_the_sm120_path_and_keeps_every_round(tmp_path):
    result = _decode(("torch", "reference"), sm120="test-sm120", breakdown=True,
                     ctx=GateContext(device="cpu", artifacts_dir=tmp_path))
    assert result.outcome is Outcome.PASSED, result.summary
    assert result.details["decode"]["contexts"][0]["same_tokens"]
    figs = {f.name: f for f in result.figures}
    assert figs["sm120_path_decode_speedup_48"].value > 0 and figs["sm120_path_decode_speedup_48"].threshold is None
    assert figs["sm120_path_same_tokens_48"].value == 1.0
    record = result.details["decode"]
    arms = record["contexts"][0]["arms"]
    assert set(arms) == {"torch-eager", "reference-eager", "test-sm120-eager"}  # the stand-in ran, not the GPU path
    assert all(len(arm["rounds"]) == 2 for arm in arms.values())
    assert figs["decode_spread_48"].value >= 1.0 and figs["rounds_per_arm"].value == 2
    parts = arms["torch-eager"]["breakdown"]
    assert {"attention_gpu_ms", "rest_gpu_ms", "drafting_gpu_ms", "conversion_gpu_ms", "host_exposed_ms"} <= set(parts)
    assert figs["accepted_per_step_torch_48"].value >= 1.0
    assert "torch-eager" in result.details["table"]
    plot = tmp_path / result.details["plot"]  # the PNG lands in the phase's results folder
    assert plot.name.startswith("decode-") and plot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


@pytest.mark.slow
def test_decode_speedup_fails_when_tokens_differ():
    result = _decode(("test-zero-verify", "torch"))  # a leaky mask may leave greedy tokens unchanged
    assert result.outcome is Outcome.FAILED
    assert "same_tokens" in result.summary, result.summary


@pytest.mark.slow
def test_decode_speedup_fails_a_slow_candidate():
    result = _decode(("reference", "torch"), bound=1e6)
    assert result.outcome is Outcome.FAILED
    assert "decode_speedup_48" in result.summary, result.summary


@pytest.mark.slow
def test_decode_speedup_fails_with_too_few_rounds():
    result = _decode(("torch", "reference"), rounds=1, min_rounds=2)
    assert result.outcome is Outcome.FAILED
    assert "rounds_per_arm" in result.summary, result.summary
