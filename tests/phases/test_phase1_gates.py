"""Phase 1's gates bound to this project: they pass on the real thing and fail on broken variants.

CPU part: the build gate on real nvcc output (and failing when its limits are tightened below what
the kernel uses), the accuracy gate with the project's cases against deliberately broken
candidates (wrong mask bit, missing prefix, wrong scale, unwritten rows), and the token-exact gate
against an engine backend with a broken mask. GPU part (skipped on CPU): the same broken variants
compiled into the CUDA kernel itself (KD_BREAK) must fail the accuracy gate, in a fresh process.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch

from kdtree.gates.base import GateContext, Outcome, run_check
from kdtree.kernels.reference import tree_verify_mla_reference
from kdtree.orchestrator.plan import resolve_check
from kdtree.phases import phase1
from kdtree.phases.phase1 import checks as phase1_checks

CPU_CASES = [
    ("random H4 T9 L20", 4, [(9, 20)], "random"),
    ("chain H2 T6 L0", 2, [(6, 0)], "chain"),
    ("mixed H3", 3, [(5, 7), (1, 3), (35, 4)], "random"),
]
# CPU-sized dominant-key cases: one past 8192 keys (33 splits at 132 SMs), one tree with traps.
CPU_STRUCTURED = [
    ("dominant H8 T16 L8k", 8, [(16, 8200)], "random"),
    ("dominant H4 T40 L60", 4, [(40, 60)], "random"),
]
# i.i.d. random cases past 8192 keys, with few splits at 132 SMs (H64 T16: 4): what the gate had.
LONG_RANDOM = [("random H8 T4 L8k", 8, [(4, 8200)], "random"), ("random H64 T16 L8k", 64, [(16, 8200)], "random")]


def _ctx():
    return GateContext(device="cpu")


def _spec(**update):
    return phase1.SPEC.gate("accuracy").model_copy(update={"trials": 2, "requires": [], **update})


def _accuracy(candidate, cases=CPU_CASES, structured=CPU_STRUCTURED, spec=None):
    return run_check(spec or _spec(), lambda s, c: phase1_checks.check_accuracy(s, c, candidate, cases, structured),
                     _ctx())


def _problems(result):
    return [f["problem"] for f in result.details.get("failures", [])]


def _failed_cases(result):
    return {f["case"] for f in result.details.get("failures", [])}


def _allocating(fn):
    """A broken op written for an `out` buffer, honouring out=None like the contract."""
    def op(q, kv, qo, kvp, idx, mask, scale, *, out=None, lse=None):
        if out is None:
            out = torch.empty(q.shape[0], q.shape[1], 512, dtype=q.dtype, device=q.device)
        fn(q, kv, qo, kvp, idx, mask, scale, out=out, lse=lse)
        return out
    return op


def _drop_keys(q, kv, qo, kvp, idx, mask, scale, drop, *, out=None, lse=None):
    """The oracle over each request's slots except the positions `drop(b, L, T)` names."""
    kept, new_kvp = [], [0]
    qo_l, kv_l = qo.tolist(), kvp.tolist()
    for b in range(len(qo_l) - 1):
        t = qo_l[b + 1] - qo_l[b]
        slots = idx[kv_l[b]: kv_l[b + 1]]
        L = slots.numel() - t
        gone = {p for p in drop(b, L, t) if p < L}  # prefix keys only: the tree mask stays aligned
        keep = torch.tensor([p for p in range(slots.numel()) if p not in gone], dtype=torch.long)
        kept.append(slots[keep])
        new_kvp.append(new_kvp[-1] + keep.numel())
    return tree_verify_mla_reference(q, kv, qo, torch.tensor(new_kvp, dtype=torch.int32), torch.cat(kept), mask,
                                     scale, out=out, lse=lse)


def _drop_tail_past_8192(q, kv, qo, kvp, idx, mask, scale, *, out=None, lse=None):
    return _drop_keys(q, kv, qo, kvp, idx, mask, scale, lambda b, L, T: [L - 1] if L > 8192 else [],
                      out=out, lse=lse)


def split_edges(q, qo, kvp, mask, num_kv, sm_count=132):
    """Where the ws kernel's KV splits start (after the first) for this call at `sm_count` SMs (as an
    sm_120 card plans it: 32-row CTAs, 32-key tiles; a 9.0 device dispatches wgmma from 64 rows)."""
    from kdtree.kernels.device_facts import DeviceFacts
    from kdtree.kernels.launch_plan import BLOCK_N, plan as make_plan

    plan = make_plan(q.shape[0], q.shape[1], qo.numel() - 1, mask.shape[1], num_kv, DeviceFacts(sm_count, (12, 0)))
    edges = {}
    kv_l = kvp.tolist()
    for b in range(len(kv_l) - 1):
        n = kv_l[b + 1] - kv_l[b]
        chunk = -(-(-(-n // plan.num_splits)) // BLOCK_N) * BLOCK_N
        edges[b] = list(range(chunk, n, chunk))
    return plan.num_splits, edges


def _lose_split_boundary_keys(q, kv, qo, kvp, idx, mask, scale, *, out=None, lse=None):
    _, edges = split_edges(q, qo, kvp, mask, idx.numel())
    return _drop_keys(q, kv, qo, kvp, idx, mask, scale, lambda b, L, T: edges[b], out=out, lse=lse)


# The gate as it was (i.i.d. random cases only, rel-L2 1e-2 and an absolute max-abs of 5e-2).
_OLD_GATE = dict(max_row_rel=None, max_abs=5e-2, max_abs_rel=1e9)


def _wrong_mask_bit(q, kv, qo, kvp, idx, mask, scale, *, out=None, lse=None):
    sizes = (qo[1:] - qo[:-1]).long()
    tree = sizes.repeat_interleave(sizes).clamp(max=31)  # each row's request's nodes, up to 31
    leaky = mask.clone()  # every node sees nodes 0..min(T, 31) - 1, descendants and siblings included
    leaky[:, 0] |= ((1 << tree) - 1).to(torch.int32)
    return tree_verify_mla_reference(q, kv, qo, kvp, idx, leaky, scale, out=out, lse=lse)


def _missing_prefix(q, kv, qo, kvp, idx, mask, scale, *, out=None, lse=None):
    kept, new_kvp = [], [0]
    qo_l, kv_l = qo.tolist(), kvp.tolist()
    for b in range(len(qo_l) - 1):
        t = qo_l[b + 1] - qo_l[b]
        kept.append(idx[kv_l[b + 1] - t: kv_l[b + 1]])
        new_kvp.append(new_kvp[-1] + t)
    return tree_verify_mla_reference(q, kv, qo, torch.tensor(new_kvp, dtype=torch.int32), torch.cat(kept), mask,
                                     scale, out=out, lse=lse)


def _wrong_scale(q, kv, qo, kvp, idx, mask, scale, *, out=None, lse=None):
    return tree_verify_mla_reference(q, kv, qo, kvp, idx, mask, scale * 1.25, out=out, lse=lse)


def _unwritten_rows(q, kv, qo, kvp, idx, mask, scale, *, out=None, lse=None):
    full = tree_verify_mla_reference(q, kv, qo, kvp, idx, mask, scale,
                                     lse=torch.empty(q.shape[0], q.shape[1], dtype=torch.float32))
    out[:-1] = full[:-1]
    if lse is not None:
        lse[:-1] = 0.0
    return out



def _screen_total(result) -> dict:
    """The scale screen's counts summed over the probe models drawn (model_draws may draw several)."""
    screen = result.details["scale_screen"]
    draws = screen["model_draws"] if "model_draws" in screen else [screen]
    return {k: sum(d[k] for d in draws) for k, v in draws[0].items() if isinstance(v, (int, float))}

def test_accuracy_gate_passes_the_oracle_in_bf16():
    result = _accuracy(tree_verify_mla_reference)
    assert result.outcome is Outcome.PASSED, result.summary
    assert {s["buffers"] for s in result.details["seeds"]} == {"poisoned", "stale", "none"}
    row = next(f for f in result.figures if f.name == "worst_row_rel")
    assert row.value < 2e-3  # bf16 output rounding alone: about 2^-9 / sqrt(3) of the row scale


# Each broken candidate fails, for its reason: (problem text that must appear, cases that must fail,
# cases that must not).
_BROKEN = {
    "wrong-mask-bit": (_wrong_mask_bit, "rows off by more than", {"dominant H4 T40 L60", "chain H2 T6 L0"}, set()),
    "missing-prefix": (_missing_prefix, "rel-L2", {"random H4 T9 L20", "dominant H8 T16 L8k"}, set()),
    "wrong-scale": (_wrong_scale, "lse: max-abs", {"random H4 T9 L20", "dominant H8 T16 L8k"}, set()),
    "unwritten-rows": (_unwritten_rows, "unwritten (still poisoned)", {"random H4 T9 L20"}, set()),
}


@pytest.mark.parametrize("name", sorted(_BROKEN))
def test_accuracy_gate_fails_broken_candidates_for_their_reason(name):
    broken, reason, must_fail, may_not_fail = _BROKEN[name]
    result = _accuracy(_allocating(broken) if broken is _unwritten_rows else broken)
    assert result.outcome is Outcome.FAILED, result.summary
    assert any(reason in p for p in _problems(result)), (reason, _problems(result)[:5])
    assert must_fail <= _failed_cases(result), _failed_cases(result)
    assert not (may_not_fail & _failed_cases(result)), _failed_cases(result)


@pytest.mark.parametrize("broken", [_drop_tail_past_8192, _lose_split_boundary_keys],
                         ids=["drop-tail-past-8192", "lose-split-boundary-keys"])
@pytest.mark.slow
def test_long_context_key_drops_slip_through_random_cases_but_fail_on_dominant_keys(broken):
    before = _accuracy(broken, cases=LONG_RANDOM[1:] if broken is _lose_split_boundary_keys else LONG_RANDOM,
                       structured=[], spec=_spec(**_OLD_GATE))
    assert before.outcome is Outcome.PASSED, before.summary  # the hole: diluted below 1e-2
    after = _accuracy(broken, cases=LONG_RANDOM, structured=CPU_STRUCTURED[:1])
    assert after.outcome is Outcome.FAILED, after.summary
    dominant = [f["problem"] for f in after.details["failures"] if f["case"] == "dominant H8 T16 L8k"]
    assert any("rows off by more than 0.01 of their scale" in p for p in dominant), dominant[:3]


def test_the_split_boundary_candidate_is_not_vacuous():
    case = phase1_checks._structured_inputs(8, [(16, 8200)], "random", 1, "cpu")
    splits, edges = split_edges(case["q"], case["qo_indptr"], case["kv_indptr"], case["tree_mask"],
                                case["kv_indices"].numel())
    assert splits > 8 and len(edges[0]) == splits - 1


def test_dominant_key_cases_make_their_marked_keys_dominate():
    from kdtree.bench.cases import oracle
    from kdtree.bench.structured_cases import marked_positions

    case = phase1_checks._structured_inputs(8, [(16, 8200)], "random", 3, "cpu")
    _, lse = oracle(case)
    L = case["kv_indices"].numel() - 16
    marks = marked_positions(L, 16, 32)
    assert L >= 8200 and L - 1 in marks and 8192 in marks and 8191 in marks
    # a row held by 8 targets of 20 softmax units has lse ~ 20 + log 8; the random rows far less
    assert float(lse.max()) == pytest.approx(20 + math.log(8), abs=0.2)


# -- token_exact (issue 12, item 3) ---------------------------------------------------------------
def _masked_oracle(q, kv, qo, kvp, idx, visible, scale):
    """fp64 attention with tree visibility `visible(b, T, q0)` -> bool [T, T] (no contract checks)."""
    out = torch.empty(q.shape[0], q.shape[1], 512, dtype=q.dtype, device=q.device)
    qo_l, kv_l = qo.tolist(), kvp.tolist()
    for b in range(len(qo_l) - 1):
        t = qo_l[b + 1] - qo_l[b]
        slots = idx[kv_l[b]: kv_l[b + 1]].long()
        L = slots.numel() - t
        keys = kv[slots].double()
        scores = torch.einsum("thd,sd->ths", q[qo_l[b]: qo_l[b + 1]].double(), keys) * scale
        vis = torch.ones(t, L + t, dtype=torch.bool)
        vis[:, L:] = visible(b, t, qo_l[b])
        scores = scores.masked_fill(~vis[:, None, :], float("-inf"))
        out[qo_l[b]: qo_l[b + 1]] = torch.einsum("ths,sd->thd", torch.softmax(scores, -1), keys[:, :512]).to(q.dtype)
    return out


def _chain_mask_op(q, kv, qo, kvp, idx, mask, scale, *, out=None, lse=None):
    return _masked_oracle(q, kv, qo, kvp, idx, lambda b, t, q0: torch.tril(torch.ones(t, t, dtype=torch.bool)), scale)


def _first_mask_word_op(q, kv, qo, kvp, idx, mask, scale, *, out=None, lse=None):
    from kdtree.kernels.masks import unpack_bool_rows

    first = mask.clone()
    first[:, 1:] = 0
    return _masked_oracle(q, kv, qo, kvp, idx, lambda b, t, q0: unpack_bool_rows(first[q0: q0 + t], t), scale)


def _scale_drift_op(q, kv, qo, kvp, idx, mask, scale, *, out=None, lse=None):
    return tree_verify_mla_reference(q, kv, qo, kvp, idx, mask, scale * 1.03, out=out, lse=lse)


def _scale_576_op(q, kv, qo, kvp, idx, mask, scale, *, out=None, lse=None):
    return tree_verify_mla_reference(q, kv, qo, kvp, idx, mask, 1 / math.sqrt(576), out=out, lse=lse)


def _op_backend(name, op, verify_without_op=False):
    """Register an OpBackend whose op is `op` (what the gate counts); optionally one whose verify
    never calls it (dense torch attention instead)."""
    from kdtree.engine.decode import backends

    class Backend(backends.OpBackend):
        requires_cuda = False  # its op is the fp64 oracle, which runs anywhere

        def __init__(self):
            super().__init__(name, "kdtree.kernels.reference", "tree_verify_mla_reference")
            self._ops = {"verify": op, "decode": op}  # OpBackend resolves each mode's op from _ops

        if verify_without_op:
            def forward_verify(self, q, kv_cache, meta, sm_scale):  # noqa: D102
                return backends.dense_attention(q, kv_cache, meta, sm_scale)

    backends.register_backend(name, Backend)
    return name


# CPU-sized: 4 prompts x 192-256 screened nodes (4-20 sensitive per drift sign and round on the tiny
# probe model; needing 2 within 3 rounds leaves a correct candidate failing by chance less than once
# in 10^4 runs); 4 noise draws: in fp32 the margins respond smoothly to the dither (12 are for bf16,
# where a node's noise is bimodal: test_phase1_tokens.py)
_TOKEN_SPEC = dict(requires=[], min_prompts=4, max_new_tokens=8,  # screen: 3 rounds at most
                   screen=phase1.SPEC.gate("token_exact").screen.model_copy(update={"min_sensitive": 2, "noise_draws": 4, "tree_nodes": 256}))


def _token_exact(name, op, screen=True):
    spec = phase1.SPEC.gate("token_exact").model_copy(update=_TOKEN_SPEC if screen else
                                                                 {**_TOKEN_SPEC, "screen": None})
    return run_check(spec, lambda s, c: phase1_checks.check_token_exact(
        s, c, backend=name, device="cpu", drafters=(("ngram", 8),), op_under_test=op,
        reference_backend="torch", decoy_path=12), _ctx())


def _runs(result):
    return {r["run"]: r for r in result.details.get("runs", [])}


@pytest.mark.slow
def test_token_exact_gate_passes_the_oracle_counting_its_calls():
    r = _token_exact(_op_backend("oracle-op-test", tree_verify_mla_reference), tree_verify_mla_reference)
    assert r.outcome is Outcome.PASSED, r.summary
    runs = _runs(r)
    assert runs["decoy"]["min_op_calls_per_step"] == 8  # one per layer, in the logits forward and in verify_step
    assert runs["ngram:8"]["min_op_calls_per_step"] >= 4 and runs["ngram:8"]["steps_without_op_calls"] == 0
    assert runs["decoy"]["candidate_accepted"] == runs["decoy"]["reference_accepted"] == 13  # path + bonus
    assert r.details["prompts"] == 4  # prompts, not streams over runs
    screen = _screen_total(r)
    assert runs["scale-screen"]["min_op_calls_per_step"] == 4  # the screened forward ran through the op
    assert screen["kept nodes the candidate changed"] == 0 and screen["kept"] > 0.8 * screen["nodes"]
    assert min(runs["scale-screen"]["sensitive"].values()) >= 2


@pytest.mark.slow
@pytest.mark.parametrize("op", [_chain_mask_op, _first_mask_word_op], ids=["chain-mask", "first-mask-word-only"])
def test_token_exact_gate_fails_a_wrong_tree_mask_on_decoy_trees(op):
    r = _token_exact(_op_backend(f"{op.__name__}-test", op), op, screen=False)
    assert r.outcome is Outcome.FAILED, r.summary
    decoy = [d for d in r.details["divergences"] if d["run"] == "decoy"]
    assert decoy, r.summary  # the decoy tree's tokens changed
    # the summary names the first 3 divergences in order; where the drafted run's streams diverge
    # too (some draws), the decoy's may come after them, so its report is read from the details
    assert "first divergence" in r.summary
    assert decoy[0]["candidate"] != decoy[0]["reference"] or decoy[0]["candidate_len"] != decoy[0]["reference_len"]
    assert _runs(r)["decoy"]["candidate_accepted"] < _runs(r)["decoy"]["reference_accepted"]
    assert "mean accepted length per step differs" in r.summary


@pytest.mark.slow
def test_token_exact_gate_fails_a_scale_of_one_over_sqrt_576_by_its_logit_drift():
    r = _token_exact(_op_backend("scale576-test", _scale_576_op), _scale_576_op)
    assert r.outcome is Outcome.FAILED, r.summary
    # the logit drift is over the bound in some run (which one varies with the draw: the decoy's
    # narrowest greedy margin was under 4x the drift in ~1 % of fresh draws) and the summary says so
    worst = max(_runs(r).values(), key=lambda row: row.get("margin_fraction") or 0.0)
    assert worst["margin_fraction"] > 0.25
    assert f"run {worst['run']!r}: " in r.summary and "of the margin (> 0.25)" in r.summary
    # a 42 % scale error changes screened decisions too (not always to the token a -2 % drift
    # takes: in ~5 % of draws it overshoots to a third one, so only the 3 % drifts below pin the
    # direction)
    screen = _screen_total(r)
    assert screen["kept nodes the candidate changed"] > 0
    assert any(d["run"] == "scale-screen" for d in r.details["divergences"]), r.summary


@pytest.mark.slow
def test_token_exact_gate_fails_a_backend_that_never_calls_the_op():
    r = _token_exact(_op_backend("no-op-test", tree_verify_mla_reference, verify_without_op=True),
                     tree_verify_mla_reference, screen=False)
    assert r.outcome is Outcome.FAILED, r.summary
    assert next(f for f in r.figures if f.name == "exact_fraction").value == 1.0  # tokens alone pass
    assert "had a step with 0 op calls" in r.summary and "did not come from the op" in r.summary


def test_a_three_percent_scale_drift_fails_the_accuracy_gate_too():
    acc = _accuracy(_scale_drift_op)
    assert acc.outcome is Outcome.FAILED and any("lse: max-abs" in p for p in _problems(acc))


@pytest.mark.slow
@pytest.mark.parametrize("factor", [1.03, 0.97], ids=["+3%", "-3%"])
def test_token_exact_gate_fails_a_three_percent_scale_drift_on_screened_decisions(factor):
    def drift(q, kv, qo, kvp, idx, mask, scale, *, out=None, lse=None):
        return tree_verify_mla_reference(q, kv, qo, kvp, idx, mask, scale * factor, out=out, lse=lse)

    # Greedy margins of the engine's model are wide by design (so bf16 noise never flips a token):
    # the drafted and decoy runs usually keep every token under a 3 % drift (a narrow decoy
    # decision flipped once in a fresh-clone run); the screened run must change tokens every time.
    r = _token_exact(_op_backend(f"drift{factor}-test", drift), drift)
    assert r.outcome is Outcome.FAILED, r.summary
    assert "scale-screen" in {d["run"] for d in r.details["divergences"]}, r.summary
    screen = _screen_total(r)
    label = "+2%" if factor > 1 else "-2%"
    # the decisions the reference's own 2 % drift flips, the 3 % drift flips the same way
    assert screen[f"candidate took the {label} token"] >= 1
    assert screen[f"candidate took the {label} token"] >= screen[f"sensitive {label}"] // 2
    # The decoy's logit drift is a fresh draw each run, usually below 0.25 of the margin (0.43 seen
    # once in ~25 runs), so the margin check may catch it too; the screen must, whatever the draw.


def test_a_length_mismatch_between_runs_is_an_error():
    from kdtree.bench.token_probe import same_length

    with pytest.raises(ValueError, match="returned 3 token streams and the reference 4"):
        same_length("x", [[1]] * 3, [[1]] * 4)


needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None and not os.path.exists("/usr/local/cuda/bin/nvcc"),
                                reason="nvcc is not installed")


@pytest.mark.slow
@needs_nvcc
def test_build_gate_passes_the_kernel_for_sm90_and_sm120():
    spec = phase1.SPEC.gate("build")
    result = run_check(spec, resolve_check(phase1.CHECKS["build"]), _ctx())
    assert result.outcome is Outcome.PASSED, result.summary


@pytest.mark.slow
@needs_nvcc
def test_build_gate_bites_on_the_real_kernel():
    base = phase1.SPEC.gate("build").model_copy(update={"archs": ["sm_90"]})
    for tighter in ({"max_registers": 128}, {"forbidden_sass": ["HMMA"]}, {"max_shared_bytes": 64 * 1024}):
        result = run_check(base.model_copy(update=tighter), resolve_check(phase1.CHECKS["build"]), _ctx())
        assert result.outcome is Outcome.FAILED, (tighter, result.summary)


@pytest.mark.slow
@needs_nvcc
def test_build_sm90a_gate_passes_the_wgmma_variant():
    spec = phase1.SPEC.gate("build_sm90a")
    assert spec.archs == ["sm_90a"] and spec.required_sass == ["HGMMA"]
    result = run_check(spec, resolve_check(phase1.CHECKS["build_sm90a"]), _ctx())
    assert result.outcome is Outcome.PASSED, result.summary
    checked = [r for r in result.details["kernels"] if r.get("checked", True)]
    assert [r["function"] for r in checked] == ["_ZN6kdtree28tree_verify_mla_wgmma_kernelENS_16TreeVerifyParamsE"]
    assert 101376 < checked[0]["smem_dynamic"] <= 232448 and checked[0]["spill_stores"] == 0
    figures = {f.name: f.value for f in result.figures}
    assert figures["sm_90a required_sass_missing"] == 0 and figures["sm_90a kernels"] == 1
    # the sm_90 / sm_120 gate is the one it was: no wgmma there, sm_120's shared-memory limit
    build = phase1.SPEC.gate("build")
    assert build.archs == ["sm_90", "sm_120"] and "HGMMA" in build.forbidden_sass and build.max_shared_bytes == 101376
    assert not build.only_kernels and not build.required_sass


@pytest.mark.slow
@needs_nvcc
def test_build_sm90a_gate_bites():
    base = phase1.SPEC.gate("build_sm90a")
    for tighter in ({"archs": ["sm_90"]},  # no wgmma kernel in an sm_90 build
                    {"required_sass": ["HGMMA", "UTCHMMA"]}, {"max_shared_bytes": 101376},
                    {"max_registers": 128}, {"only_kernels": ["no_such_kernel"]}):
        result = run_check(base.model_copy(update=tighter), resolve_check(phase1.CHECKS["build_sm90a"]), _ctx())
        assert result.outcome is Outcome.FAILED, (tighter, result.summary)


_BROKEN_BUILD_SCRIPT = r"""
import json, sys
from kdtree.gates.base import GateContext, run_check
from kdtree.orchestrator.plan import resolve_check
from kdtree.phases import phase1
spec = phase1.SPEC.gate("accuracy").model_copy(update={"trials": 2})
r = run_check(spec, resolve_check(phase1.CHECKS["accuracy"]), GateContext(device="cuda"))
print(json.dumps({"outcome": r.outcome.value, "summary": r.summary,
                  "failures": r.details.get("failures", []), "cases": r.details.get("cases", [])}))
"""

# KD_BREAK bit: (name, problem text some failure must carry, a case that must fail, a case that must not)
_CUDA_BREAKS = {
    1: ("wrong-mask-bit", "rows off by more than", "dominant star H16 T300 L2000", None),
    2: ("missing-prefix", "rel-L2", "H8 T4 L32k", "T1 L0 H16"),  # no prefix there to miss
    4: ("wrong-scale", "lse: max-abs", "random H8 T16 L1000", None),
    8: ("unwritten", "unwritten (still poisoned)", "T1024 H8 L200", None),
}


@pytest.mark.gpu
@pytest.mark.parametrize("flag", sorted(_CUDA_BREAKS), ids=[_CUDA_BREAKS[f][0] for f in sorted(_CUDA_BREAKS)])
def test_accuracy_gate_fails_broken_cuda_builds_for_their_reason(flag):
    _, reason, must_fail, must_pass = _CUDA_BREAKS[flag]
    env = dict(os.environ, KDTREE_NVCC_FLAGS=f"-DKD_BREAK={flag}")
    proc = subprocess.run([sys.executable, "-c", _BROKEN_BUILD_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["outcome"] == "failed", result["summary"]
    problems = [f["problem"] for f in result["failures"]]
    failed = {f["case"] for f in result["failures"]}
    assert any(reason in p for p in problems), (reason, problems[:5])
    assert must_fail in failed, sorted(failed)
    if must_pass is not None:
        assert must_pass not in failed, sorted(failed)


@pytest.mark.gpu
def test_accuracy_gate_fails_a_wgmma_only_break_in_the_wgmma_cases_only():
    import torch

    from kdtree.kernels.launch_plan import runnable_variants

    if "wgmma" not in runnable_variants(torch.cuda.get_device_capability()):
        pytest.skip("the wgmma variant runs on compute capability 9.0 only")
    env = dict(os.environ, KDTREE_NVCC_FLAGS="-DKD_BREAK=16")  # its second warpgroup reads V's low half
    proc = subprocess.run([sys.executable, "-c", _BROKEN_BUILD_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["outcome"] == "failed", result["summary"]
    failed = {f["case"] for f in result["failures"]}
    assert "random H8 T16 L1000 [wgmma]" in failed, sorted(failed)
    # cases forced onto another variant pass; the default dispatch fails where it picks wgmma (9.0, >= 64 rows)
    assert not [n for n in failed if any(n.endswith(f"{v}]") for v in ("ws", "base16", "base32"))], sorted(failed)


@pytest.mark.gpu
def test_accuracy_gate_passes_the_real_cuda_kernel():
    spec = phase1.SPEC.gate("accuracy").model_copy(update={"trials": 2})
    result = run_check(spec, resolve_check(phase1.CHECKS["accuracy"]), GateContext(device="cuda"))
    assert result.outcome is Outcome.PASSED, result.summary


@pytest.mark.gpu
def test_speed_gate_fails_a_pointer_keyed_cache_around_the_kernel():
    from kdtree.kernels import tree_verify_mla

    cache = {}

    def cached(q, kv, qo, kvp, idx, mask, scale, *, out=None, lse=None):
        key = (q.data_ptr(), tuple(q.shape), idx.data_ptr())
        if key not in cache:
            cache[key] = tree_verify_mla(q, kv, qo, kvp, idx, mask, scale)
        return cache[key]

    spec = phase1.SPEC.gate("speedup_naive").model_copy(update={"repeats": 5, "warmup": 1})
    result = run_check(spec, lambda s, c: phase1_checks._speed(s, c, "naive", candidate_fn=cached),
                       GateContext(device="cuda", quick=True))
    assert result.outcome is Outcome.FAILED, result.summary
    rows = result.details["configs"]
    assert all(r["status"] == "stale" for r in rows), [r["status"] for r in rows]
    assert all(r["agree_rel_l2"] is not None and r["agree_rel_l2"] <= spec.agree_max_rel_l2 for r in rows)
    assert "last timed call" in result.summary


@pytest.mark.slow
@pytest.mark.parametrize("name,H,reqs,kind", phase1_checks.STRUCTURED_CASES, ids=[c[0] for c in phase1_checks.STRUCTURED_CASES])
def test_every_structured_case_of_the_gate_can_target_all_its_marked_keys(name, H, reqs, kind):
    # _assign_targets raises when T x H rows cannot hold every marked key: the GPU gate would error
    case = phase1_checks._structured_inputs(H, reqs, kind, 20261203, "cpu")
    assert case["q"].dtype == torch.bfloat16 and bool(torch.isfinite(case["q"].float()).all())
    assert int(case["kv_indptr"][-1]) == case["kv_indices"].numel()
