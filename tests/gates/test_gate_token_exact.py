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
