"""Token-exact gate: exact streams pass; a divergence or too few prompts fails with the reason."""

from __future__ import annotations

import pytest
import torch

from kdtree.gates.base import GateContext, Outcome
from kdtree.gates.spec import TokenExactGateSpec
from kdtree.gates.token_exact import check_token_exact, first_divergence

SPEC = TokenExactGateSpec(name="toy-tokens", min_prompts=4)


def streams(n=4, length=10):
    return [(f"p{i}", list(range(i, i + length)), list(range(i, i + length))) for i in range(n)]


def fig(result, name):
    return next(f for f in result.figures if f.name == name)


def test_exact_streams_pass():
    r = check_token_exact(SPEC, streams(), GateContext())
    assert r.outcome is Outcome.PASSED
    assert fig(r, "exact_fraction").value == 1.0 and fig(r, "exact_fraction").key
    assert fig(r, "prompts").value == 4 and r.details["tokens_compared"] == 40


def test_a_divergent_stream_fails_naming_the_first_divergence():
    s = streams()
    cand = list(s[2][1])
    cand[6] = 999
    cand[8] = 777
    s[2] = ("p2", cand, s[2][2])
    r = check_token_exact(SPEC, s, GateContext())
    assert r.outcome is Outcome.FAILED
    assert fig(r, "exact_fraction").value == 0.75
    (d,) = r.details["divergences"]
    assert d == {"prompt": "p2", "run": "", "index": 6, "candidate": 999, "reference": 8,
                 "candidate_len": 10, "reference_len": 10}
    assert "prompt p2" in r.summary and "token 6" in r.summary and "999" in r.summary


def test_a_shorter_stream_diverges_where_it_ends():
    s = streams()
    s[0] = ("p0", s[0][1][:7], s[0][2])
    r = check_token_exact(SPEC, s, GateContext())
    (d,) = r.details["divergences"]
    assert d["index"] == 7 and d["candidate"] is None and d["reference"] == 7
    assert "lengths 7 vs 10" in r.summary


def test_too_few_prompts_fails_with_the_reason():
    r = check_token_exact(SPEC, streams(n=2), GateContext())
    assert r.outcome is Outcome.FAILED
    assert not fig(r, "prompts").ok
    assert "only 2 prompts" in r.summary and "at least 4" in r.summary


def test_no_prompts_never_passes():
    r = check_token_exact(SPEC, [], GateContext())
    assert r.outcome is Outcome.FAILED and fig(r, "exact_fraction").value is None


def test_tensors_are_accepted():
    s = [(i, torch.tensor(c), torch.tensor(r)) for i, c, r in streams()]
    assert check_token_exact(SPEC, s, GateContext()).outcome is Outcome.PASSED


def test_empty_reference_is_not_exact():
    s = streams()
    s[1] = ("p1", [], [])
    r = check_token_exact(SPEC, s, GateContext())
    assert r.outcome is Outcome.FAILED and r.details["empty_references"] == ["p1"]


def test_fraction_threshold_below_one_tolerates_some():
    s = streams()
    s[3] = ("p3", [0] * 10, s[3][2])
    spec = SPEC.model_copy(update={"min_exact_fraction": 0.75})
    r = check_token_exact(spec, s, GateContext())
    assert r.outcome is Outcome.PASSED and len(r.details["divergences"]) == 1


def test_duplicate_prompt_ids_raise():
    with pytest.raises(ValueError, match="twice"):
        check_token_exact(SPEC, streams() + [("p0", [1], [1])], GateContext())


def test_first_divergence_equal_is_none():
    assert first_divergence([1, 2], [1, 2]) is None
    assert first_divergence([1, 2, 3], [1, 2])["reference"] is None


# -- prompts, runs, op calls and acceptance (issue 12, item 3) -------------------------------------
from kdtree.gates.token_exact import RunStats, Stream  # noqa: E402


def two_runs(n=4, length=10):
    return [Stream(f"p{i}", run, list(range(i, i + length)), list(range(i, i + length)))
            for i in range(n) for run in ("ddtree", "ngram")]


def test_min_prompts_counts_prompts_not_streams_over_runs():
    r = check_token_exact(SPEC.model_copy(update={"min_prompts": 8}), two_runs(n=4), GateContext())
    assert r.outcome is Outcome.FAILED
    assert fig(r, "prompts").value == 4 and fig(r, "streams").value == 8
    assert "only 4 prompts compared, the spec needs at least 8" in r.summary


def test_a_prompt_is_exact_only_if_every_run_is():
    s = two_runs()
    s[3] = Stream("p1", "ngram", [0] * 10, s[3].reference)
    r = check_token_exact(SPEC, s, GateContext())
    assert r.outcome is Outcome.FAILED and fig(r, "exact_fraction").value == 0.75
    assert "prompt p1 (ngram): first divergence at token 0" in r.summary


def test_the_same_prompt_in_two_runs_is_not_a_duplicate_but_twice_in_one_run_is():
    assert check_token_exact(SPEC, two_runs(), GateContext()).outcome is Outcome.PASSED
    with pytest.raises(ValueError, match="twice in run 'ngram'"):
        check_token_exact(SPEC, two_runs() + [Stream("p0", "ngram", [1], [1])], GateContext())


OPS = SPEC.model_copy(update={"min_op_calls_per_step": 4, "max_accept_rel_diff": 0.02})


def test_op_calls_and_acceptance_pass_when_measured_and_fine():
    runs = [RunStats("ddtree", [4, 4, 8], 3.1, 3.1), RunStats("ngram", [4, 4], 2.0, 2.0)]
    r = check_token_exact(OPS, two_runs(), GateContext(), runs=runs)
    assert r.outcome is Outcome.PASSED, r.summary
    assert fig(r, "min_op_calls_per_step").value == 4 and fig(r, "worst_accept_rel_diff").value == 0


def test_a_candidate_that_never_calls_the_op_fails_though_its_tokens_are_exact():
    runs = [RunStats("ddtree", [0, 0, 0], 3.1, 3.1), RunStats("ngram", [4, 4], 2.0, 2.0)]
    r = check_token_exact(OPS, two_runs(), GateContext(), runs=runs)
    assert r.outcome is Outcome.FAILED and fig(r, "exact_fraction").value == 1.0
    assert not fig(r, "min_op_calls_per_step").ok
    assert "run 'ddtree' had a step with 0 op calls" in r.summary and "did not come from the op" in r.summary
    assert r.details["runs"][0]["steps_without_op_calls"] == 3


def test_a_lower_acceptance_than_the_reference_fails_though_tokens_are_exact():
    runs = [RunStats("ddtree", [4, 4], 2.2, 3.1), RunStats("ngram", [4, 4], 2.0, 2.0)]
    r = check_token_exact(OPS, two_runs(), GateContext(), runs=runs)
    assert r.outcome is Outcome.FAILED and not fig(r, "worst_accept_rel_diff").ok
    assert "run 'ddtree': 2.2 vs 3.1" in r.summary


def test_a_spec_asking_for_op_calls_without_counts_is_an_error():
    from kdtree.gates.base import run_check

    r = run_check(OPS, lambda s, ctx: check_token_exact(s, two_runs(), ctx), GateContext())
    assert r.outcome is Outcome.ERROR and "min_op_calls_per_step" in r.summary


def test_logits_that_came_close_to_flipping_a_token_fail():
    spec = SPEC.model_copy(update={"max_margin_fraction": 0.25})
    ok = check_token_exact(spec, two_runs(), GateContext(), runs=[RunStats("decoy", margin_fraction=0.01)])
    assert ok.outcome is Outcome.PASSED, ok.summary
    bad = check_token_exact(spec, two_runs(), GateContext(), runs=[RunStats("decoy", margin_fraction=0.7)])
    assert bad.outcome is Outcome.FAILED and not fig(bad, "worst_margin_fraction").ok
    assert "run 'decoy': 0.7 of the margin" in bad.summary


# -- screened decisions (issue 12, item 3: small scale errors) --------------------------------------
from kdtree.gates.spec import DecisionScreenSpec  # noqa: E402

SCREENED = SPEC.model_copy(update={"screen": DecisionScreenSpec(min_sensitive=3)})


def test_a_screened_run_with_enough_sensitive_decisions_passes():
    r = check_token_exact(SCREENED, two_runs(), GateContext(),
                          runs=[RunStats("scale-screen", sensitive={"+2%": 5, "-2%": 3})])
    assert r.outcome is Outcome.PASSED, r.summary
    assert fig(r, "min_sensitive_decisions").value == 3
    assert r.details["runs"][0]["sensitive"] == {"+2%": 5, "-2%": 3}


def test_a_screen_that_found_too_few_sensitive_decisions_fails_though_tokens_are_exact():
    r = check_token_exact(SCREENED, two_runs(), GateContext(),
                          runs=[RunStats("scale-screen", sensitive={"+2%": 5, "-2%": 1})])
    assert r.outcome is Outcome.FAILED and fig(r, "exact_fraction").value == 1.0
    assert not fig(r, "min_sensitive_decisions").ok
    assert "run 'scale-screen' found 1 (5 at +2%, 1 at -2%, < 3 for some sign)" in r.summary
    assert "cannot show that such an error changes tokens" in r.summary


def test_a_spec_asking_for_a_screen_without_a_screened_run_is_an_error():
    from kdtree.gates.base import run_check

    r = run_check(SCREENED, lambda s, ctx: check_token_exact(s, two_runs(), ctx, runs=[RunStats("decoy")]),
                  GateContext())
    assert r.outcome is Outcome.ERROR and "screen.min_sensitive is set but no run screened decisions" in r.summary


# -- near-ties: a flip to the oracle's runner-up where its margin is below spec.tie_margin --------
def _tied_streams(flips: dict[int, tuple[int, float]], n=4, length=10):
    """Streams p0..p{n-1}; flips[i] = (candidate token at index 3, oracle margin there); the
    oracle's runner-up is 99 everywhere and its margins 5.0 elsewhere."""
    out = []
    for i in range(n):
        ref = list(range(i, i + length))
        cand = list(ref)
        margins = [5.0] * length
        if i in flips:
            cand[3:] = [flips[i][0]] + [7] * (length - 4)
            margins[3] = flips[i][1]
        out.append(Stream(f"p{i}", "", cand, ref, margins, [99] * length))
    return out


def _tie_spec(**kw):
    return TokenExactGateSpec(name="t", min_prompts=4, tie_margin=0.1, **kw)


def test_a_flip_to_the_runner_up_at_a_near_tie_is_reported_not_failed():
    result = check_token_exact(_tie_spec(), _tied_streams({1: (99, 0.01)}), GateContext())
    assert result.outcome is Outcome.PASSED, result.summary
    assert fig(result, "exact_fraction").value == 1.0 and fig(result, "near_tie_prompts").value == 1
    assert result.details["near_ties"][0]["margin"] == pytest.approx(0.01)
    assert "near-tie" in result.summary


@pytest.mark.parametrize("flip, why", [((99, 0.5), "margin above the tie margin"),
                                       ((42, 0.01), "not the runner-up")])
def test_a_flip_that_is_not_a_near_tie_fails(flip, why):
    result = check_token_exact(_tie_spec(), _tied_streams({2: flip}), GateContext())
    assert result.outcome is Outcome.FAILED, why
    assert "first divergence at token 3" in result.summary


def test_near_ties_in_more_prompts_than_allowed_fail():
    result = check_token_exact(_tie_spec(max_near_tie_prompts=1), _tied_streams({0: (99, 0.01), 2: (99, 0.02)}),
                               GateContext())
    assert result.outcome is Outcome.FAILED
    assert "near-tie flips in 2 prompts" in result.summary


def test_without_a_tie_margin_every_flip_diverges():
    spec = TokenExactGateSpec(name="t", min_prompts=4)
    result = check_token_exact(spec, _tied_streams({1: (99, 0.01)}), GateContext())
    assert result.outcome is Outcome.FAILED
    assert "near_tie_prompts" not in [f.name for f in result.figures]
