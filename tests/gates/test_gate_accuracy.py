"""The accuracy gate passes a correct candidate and fails each kind of broken one."""

from __future__ import annotations

import pytest
import torch

import gate_toy_ops as toy_ops
from kdtree.gates.accuracy import AccuracyCase, check_accuracy
from kdtree.gates.base import GateContext, Outcome, run_check
from kdtree.gates.spec import AccuracyGateSpec

SPEC = AccuracyGateSpec(name="toy-accuracy", trials=3, max_rel_l2=1e-4, max_abs=1e-4, max_lse_abs=1e-4)


def allocating(fn):
    """A candidate written for buffers, made to honour out=None trials: it allocates what it is
    handed None for, writes, and returns those."""
    def candidate(inputs, outputs):
        made = {k: v for k, v in toy_ops.make_outputs(inputs).items() if outputs.get(k, 0) is None}
        bufs = {**{k: v for k, v in outputs.items() if v is not None}, **made}
        fn(inputs, bufs)
        return made
    return candidate


def run(candidate, spec=SPEC, ctx=None, cases=None):
    return check_accuracy(spec, cases or toy_ops.cases(), allocating(candidate), toy_ops.oracle, ctx or GateContext())


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


# -- nothing tells a candidate it is inside the gate (issue 12, item 1) ---------------------------
_OLD_FIXED_FP32_POISON = 0x7FB0DEAD  # the one pattern every buffer was filled with before


def _sloppy(inputs, outputs):
    toy_ops.candidate(inputs, outputs)
    outputs["out"].mul_(1.01)


def test_a_candidate_exact_only_on_the_old_fixed_poison_fails_in_every_kind_of_trial():
    def knows_the_pattern(inputs, outputs):
        out = outputs["out"]
        if bool((out.view(torch.int32) == _OLD_FIXED_FP32_POISON).all()):
            toy_ops.candidate(inputs, outputs)  # "I am being tested": exact
        else:
            _sloppy(inputs, outputs)

    r = run(knows_the_pattern)
    assert r.outcome is Outcome.FAILED
    assert not fig(r, "worst_rel_l2").ok and "rel-L2" in r.summary
    failed_modes = {f["buffers"] for f in r.details["failures"]}
    assert failed_modes == {"poisoned", "stale", "none"}  # the fresh payload never matches it


def test_a_candidate_exact_only_when_its_buffer_is_all_nan_fails_on_stale_and_none_trials():
    def knows_nan(inputs, outputs):
        if bool(torch.isnan(outputs["out"]).all()):
            toy_ops.candidate(inputs, outputs)
        else:
            _sloppy(inputs, outputs)

    r = run(knows_nan)
    assert r.outcome is Outcome.FAILED and "rel-L2" in r.summary
    failed_modes = {f["buffers"] for f in r.details["failures"]}
    assert failed_modes and failed_modes <= {"stale", "none"}
    failed_seeds = {f["seed"] for f in r.details["failures"]}
    assert all(any(f["seed"] == seed and "rel-L2" in f["problem"] for f in r.details["failures"])
               for seed in failed_seeds)


def test_every_case_gets_a_poisoned_trial_and_modes_are_recorded_with_the_seeds():
    r = run(toy_ops.candidate)
    assert r.outcome is Outcome.PASSED, r.summary
    by_case = {}
    for s in r.details["seeds"]:
        by_case.setdefault(s["case"], []).append(s["buffers"])
    assert all("poisoned" in modes for modes in by_case.values())
    assert all(sorted(modes) == ["none", "poisoned", "stale"] for modes in by_case.values())  # 3 trials


def test_trials_run_in_a_random_order():
    firsts = {run(toy_ops.candidate).details["order"][0] for _ in range(10)}
    assert len(firsts) > 1


def test_an_out_none_trial_needs_the_output_returned():
    def writes_only_buffers(inputs, outputs):  # ignores out=None and returns nothing
        if outputs.get("out") is not None:
            toy_ops.candidate(inputs, outputs)
        elif outputs.get("lse") is not None:
            toy_ops.candidate(inputs, {"lse": outputs["lse"]})

    r = check_accuracy(SPEC, toy_ops.cases(), writes_only_buffers, toy_ops.oracle, GateContext())
    assert r.outcome is Outcome.FAILED
    assert {f["buffers"] for f in r.details["failures"]} == {"none"}
    assert "returned no 'out'" in r.summary


def test_a_result_written_to_a_new_tensor_instead_of_the_buffer_is_unwritten():
    def new_tensor(inputs, outputs):
        fresh = {k: torch.empty_like(v) for k, v in outputs.items() if v is not None}
        toy_ops.candidate(inputs, fresh)
        return {"out": fresh.get("out")}

    r = check_accuracy(SPEC, toy_ops.cases(), new_tensor, toy_ops.oracle, GateContext())
    assert r.outcome is Outcome.FAILED
    poisoned = [f for f in r.details["failures"] if f["buffers"] == "poisoned"]
    assert poisoned and all("unwritten" in f["problem"] for f in poisoned)


def test_accuracy_trials_below_two_are_refused_by_the_schema():
    with pytest.raises(ValueError, match="trials"):
        AccuracyGateSpec(name="x", trials=1)


# -- tolerances that scale with the output (issue 12, item 2) -------------------------------------
def _many_rows_case(rows=400):
    return [AccuracyCase("many-rows", lambda seed, device: toy_ops.make_inputs(seed, device, rows, 40, 16),
                         toy_ops.make_outputs, may_allocate=("out",))]


def _one_row_off(inputs, outputs):
    toy_ops.candidate(inputs, outputs)
    outputs["out"][17].mul_(1.05)  # one row of 400 wrong by 5 %


def test_an_error_in_one_row_is_diluted_in_rel_l2_but_caught_per_row():
    loose = SPEC.model_copy(update={"max_rel_l2": 1e-2, "max_abs_rel": 1.0, "max_abs": None, "max_lse_abs": 1e-2})
    r = run(_one_row_off, spec=loose, cases=_many_rows_case())
    assert r.outcome is Outcome.PASSED  # what the gate saw before: rel-L2 ~ 0.05 / sqrt(400)
    assert fig(r, "worst_rel_l2").value < 1e-2
    rows = loose.model_copy(update={"max_row_rel": 1e-2})
    r = run(_one_row_off, spec=rows, cases=_many_rows_case())
    assert r.outcome is Outcome.FAILED and not fig(r, "worst_row_rel").ok
    assert fig(r, "worst_row_rel").value == pytest.approx(0.05, rel=1e-3)
    assert "1 of 400 rows off by more than 0.01 of their scale" in r.summary and "at row (17,)" in r.summary


def test_the_row_scale_the_oracle_states_is_the_one_used():
    spec = SPEC.model_copy(update={"max_rel_l2": 1e-2, "max_abs_rel": 1.0, "max_abs": None, "max_row_rel": 1e-2})

    def wide(inputs, expected):  # a scale 10x the row norm: a 5 % row error is 0.5 % of it
        return {"out": 10 * expected["out"].norm(dim=-1)}

    r = check_accuracy(spec, _many_rows_case(), allocating(_one_row_off), toy_ops.oracle, GateContext(),
                       row_scale=wide)
    assert r.outcome is Outcome.PASSED, r.summary
    assert fig(r, "worst_row_rel").value == pytest.approx(0.005, rel=1e-3)


def test_max_abs_is_relative_to_the_outputs_own_scale():
    tiny = [AccuracyCase("tiny", lambda seed, device: {**toy_ops.make_inputs(seed, device),
                                                        "values": toy_ops.make_inputs(seed, device)["values"] * 1e-3},
                         toy_ops.make_outputs, may_allocate=("out",))]

    def off_by_a_little(inputs, outputs):  # 3e-4 absolute: nothing next to a 5e-2 bound, 10 % of the output
        toy_ops.candidate(inputs, outputs)
        outputs["out"][0, 0] += 3e-4

    spec = SPEC.model_copy(update={"max_rel_l2": 1.0, "max_abs": 5e-2, "max_abs_rel": 2e-2})
    r = run(off_by_a_little, spec=spec, cases=tiny)
    assert r.outcome is Outcome.FAILED and not fig(r, "worst_max_abs_rel").ok
    assert fig(r, "worst_max_abs").ok
    assert "of the output's max" in r.summary
