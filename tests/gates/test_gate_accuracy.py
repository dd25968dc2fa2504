"""The accuracy gate passes a correct candidate and fails each kind of broken one."""

from __future__ import annotations

import pytest
import torch

import gate_toy_ops as toy_ops
from kdtree.gates.accuracy import AccuracyCase, check_accuracy
from kdtree.gates.base import GateContext, Outcome, run_check
from kdtree.gates.spec import AccuracyGateSpec

SPEC = AccuracyGateSpec(name="toy-accuracy", trials=3, max_rel_l2=1e-4, max_abs=1e-4, max_lse_abs=1e-4)


def run(candidate, spec=SPEC, ctx=None, cases=None):
    return check_accuracy(spec, cases or toy_ops.cases(), candidate, toy_ops.oracle, ctx or GateContext())


def fig(result, name):
    return next(f for f in result.figures if f.name == name)


def test_correct_candidate_passes_with_figures_and_seeds():
    r = run(toy_ops.candidate)
    assert r.outcome is Outcome.PASSED, r.summary
    assert fig(r, "worst_rel_l2").key and fig(r, "worst_rel_l2").value < 1e-5
    assert fig(r, "trials").value == 3 * 3
    assert len(r.details["seeds"]) == 9
    assert len({s["seed"] for s in r.details["seeds"]}) == 9  # fresh per trial
    assert [row["case"] for row in r.details["cases"]] == [c.name for c in toy_ops.cases()]


def test_seeds_are_the_ones_the_inputs_were_drawn_from():
    drawn = []

    def make_inputs(seed, device):
        drawn.append(seed)
        return toy_ops.make_inputs(seed, device)

    case = AccuracyCase("one", make_inputs, toy_ops.make_outputs)
    r = run(toy_ops.candidate, cases=[case])
    assert [s["seed"] for s in r.details["seeds"]] == drawn


def test_scale_factor_fails():
    def scaled(inputs, outputs):
        toy_ops.candidate(inputs, outputs)
        outputs["out"].mul_(1.02)

    r = run(scaled)
    assert r.outcome is Outcome.FAILED
    assert not fig(r, "worst_rel_l2").ok
    assert "rel-L2" in r.summary and "seed" in r.summary


def test_early_return_leaves_rows_unwritten():
    def half(inputs, outputs):
        full = {k: torch.empty_like(v) for k, v in outputs.items()}
        toy_ops.candidate(inputs, full)
        n = max(1, outputs["out"].shape[0] // 2)
        outputs["out"][:n] = full["out"][:n]  # returns before the second half of the rows
        outputs["lse"].copy_(full["lse"])

    big = [c for c in toy_ops.cases() if c.params["rows"] > 1]
    r = run(half, cases=big)
    assert r.outcome is Outcome.FAILED
    assert fig(r, "unwritten_elements").value > 0
    assert "unwritten" in r.summary and "first at index (12, 0)" in r.summary
    assert fig(r, "worst_rel_l2").value is None  # not a number: never passes


def test_nan_output_fails_and_is_not_called_unwritten():
    def nan(inputs, outputs):
        toy_ops.candidate(inputs, outputs)
        outputs["out"][0, 0] = float("nan")

    r = run(nan)
    assert r.outcome is Outcome.FAILED
    assert fig(r, "non_finite_elements").value == 9  # one per trial
    assert fig(r, "unwritten_elements").value == 0
    assert "NaN/Inf" in r.summary and "(0, 0)" in r.summary


def test_ignoring_the_mask_fails():
    def unmasked(inputs, outputs):
        s = inputs["scores"].float()
        outputs["out"].copy_(torch.softmax(s, -1) @ inputs["values"])
        outputs["lse"].copy_(torch.logsumexp(s, -1))

    assert run(unmasked).outcome is Outcome.FAILED


def test_wrong_lse_fails_only_when_checked():
    def bad_lse(inputs, outputs):
        toy_ops.candidate(inputs, outputs)
        if "lse" in outputs:
            outputs["lse"].add_(0.1)

    r = run(bad_lse)
    assert r.outcome is Outcome.FAILED and not fig(r, "worst_lse_abs").ok
    unchecked = SPEC.model_copy(update={"check_lse": False})
    r = run(bad_lse, spec=unchecked)
    assert r.outcome is Outcome.PASSED
    assert all(f.name != "worst_lse_abs" for f in r.figures)


def test_lse_left_unwritten_fails():
    def no_lse(inputs, outputs):
        toy_ops.candidate(inputs, {"out": outputs["out"]})

    r = run(no_lse)
    assert r.outcome is Outcome.FAILED and "lse" in r.summary and "unwritten" in r.summary


def test_candidate_that_rewrites_its_inputs_cannot_move_the_reference():
    def vandal(inputs, outputs):
        inputs["values"].zero_()
        toy_ops.candidate(inputs, outputs)

    assert run(vandal).outcome is Outcome.FAILED


def test_stale_output_from_a_previous_call_is_caught():
    cache = {}

    def stale(inputs, outputs):  # computes once, then replays its first answer
        if "out" not in cache:
            toy_ops.candidate(inputs, outputs)
            cache.update({k: v.clone() for k, v in outputs.items()})
        for k in outputs:
            if outputs[k].shape == cache[k].shape:
                outputs[k].copy_(cache[k])

    assert run(stale, cases=toy_ops.cases()[:1]).outcome is Outcome.FAILED


def test_no_cases_is_an_error():
    r = check_accuracy(SPEC, [], toy_ops.candidate, toy_ops.oracle, GateContext())
    assert r.outcome is Outcome.ERROR and "measured nothing" in r.summary


def test_check_lse_without_an_lse_output_is_an_error_under_run_check():
    def outs(inputs):
        return {"out": toy_ops.make_outputs(inputs)["out"]}

    case = AccuracyCase("no-lse", toy_ops.make_inputs, outs)
    r = run_check(SPEC, lambda spec, ctx: check_accuracy(spec, [case], toy_ops.candidate, toy_ops.oracle, ctx),
                  GateContext())
    assert r.outcome is Outcome.ERROR and "lse" in r.summary and r.traceback


def test_exception_in_candidate_is_an_error_under_run_check():
    def boom(inputs, outputs):
        raise RuntimeError("kernel launch failed")

    r = run_check(SPEC, lambda spec, ctx: check_accuracy(spec, toy_ops.cases(), boom, toy_ops.oracle, ctx),
                  GateContext())
    assert r.outcome is Outcome.ERROR
    assert "kernel launch failed" in r.summary and "RuntimeError" in r.traceback


def test_a_failure_is_reproducible_from_its_seed():
    def scaled(inputs, outputs):
        toy_ops.candidate(inputs, outputs)
        outputs["out"].mul_(1.5)

    case = toy_ops.cases()[0]
    r = run(scaled, cases=[case])
    seed = r.details["failures"][0]["seed"]
    inputs = case.make_inputs(seed, "cpu")
    outputs = case.make_outputs(inputs)
    scaled(inputs, outputs)
    ref = toy_ops.oracle(inputs)["out"]
    rel = float((outputs["out"].double() - ref).norm() / ref.norm())
    assert rel == pytest.approx(0.5, rel=1e-3)
    assert r.details["cases"][0]["worst_rel_l2"] == pytest.approx(0.5, rel=1e-3)


@pytest.mark.gpu
def test_gpu_poisoned_outputs_on_cuda():
    def half(inputs, outputs):
        full = {k: torch.empty_like(v) for k, v in outputs.items()}
        toy_ops.candidate(inputs, full)
        outputs["out"][:3] = full["out"][:3]
        outputs["lse"].copy_(full["lse"])

    ctx = GateContext(device="cuda")
    assert run(toy_ops.candidate, ctx=ctx).outcome is Outcome.PASSED
    r = run(half, ctx=ctx, cases=toy_ops.cases()[:1])
    assert r.outcome is Outcome.FAILED and "first at index (3, 0)" in r.summary
