"""`kdtree.bench.cases`: make_case builds calls the op contract accepts, with the asked-for trees
and slot layout, and oracle agrees with the fp64 reference run on the whole pool."""

from __future__ import annotations

import pytest
import torch

from kdtree.bench.cases import call, make_case, oracle
from kdtree.kernels.contract import validate
from kdtree.kernels.masks import unpack_bool_rows
from kdtree.kernels.reference import tree_verify_mla_reference

REQS = [(5, 7), (1, 0), (33, 2), (12, 40)]  # T_b 33 needs two mask words; T_b 1 and L_b 0 edges


def _requests(case):
    qo, kv = case["qo_indptr"].tolist(), case["kv_indptr"].tolist()
    return [(qo[b], qo[b + 1], kv[b], kv[b + 1]) for b in range(len(qo) - 1)]


@pytest.mark.parametrize("contiguous", [False, True], ids=["scattered", "contiguous"])
@pytest.mark.parametrize("kind", ["random", "chain", "star"])
def test_make_case_passes_the_contract_validator(kind, contiguous):
    case = make_case(3, REQS, kind, seed=11, contiguous=contiguous, device="cpu")
    problem = validate(case["q"], case["kv_cache"], case["qo_indptr"], case["kv_indptr"],
                       case["kv_indices"], case["tree_mask"], case["sm_scale"])
    nq, total = sum(t for t, _ in REQS), sum(t + ell for t, ell in REQS)
    assert (problem.num_rows, problem.num_heads, problem.batch, problem.mask_words) == (nq, 3, 4, 2)
    assert case["q"].dtype == case["kv_cache"].dtype == torch.bfloat16
    idx = case["kv_indices"]
    assert idx.numel() == total and idx.unique().numel() == total  # distinct slots
    if contiguous:
        assert torch.equal(idx - idx[0], torch.arange(total, dtype=torch.int32))
    else:
        assert not torch.equal(idx.sort().values, idx)


@pytest.mark.parametrize("kind", ["random", "chain", "star"])
def test_make_case_draws_the_asked_for_tree(kind):
    case = make_case(1, [(40, 3), (7, 0)], kind, seed=5, device="cpu")
    for q0, q1, _, _ in _requests(case):
        T = q1 - q0
        vis = unpack_bool_rows(case["tree_mask"][q0:q1], T)
        assert vis.diagonal().all() and vis[:, 0].all()  # itself and the root
        assert not vis.triu(1).any()  # parents precede their children
        if kind == "chain":
            assert torch.equal(vis, torch.ones(T, T, dtype=torch.bool).tril())
        elif kind == "star":
            assert torch.equal(vis, torch.eye(T, dtype=torch.bool) | (torch.arange(T) == 0))
        else:  # ancestor-closed: a visible node's parent (its deepest other visible node) is visible
            for t in range(1, T):
                parent = int(torch.nonzero(vis[t, :t]).max())
                assert torch.equal(vis[t, :t], vis[parent, :t] | (torch.arange(t) == parent))


def test_make_case_follows_the_seed_and_uses_a_given_pool():
    a = make_case(2, REQS, "random", seed=3, device="cpu")
    b = make_case(2, REQS, "random", seed=3, device="cpu")
    c = make_case(2, REQS, "random", seed=4, device="cpu")
    assert all(torch.equal(a[k], b[k]) for k in a if isinstance(a[k], torch.Tensor))
    assert not torch.equal(a["q"], c["q"])
    pool = torch.zeros(500, 576, dtype=torch.bfloat16)
    assert make_case(2, REQS, "star", seed=3, pool=pool, device="cpu")["kv_cache"] is pool


@pytest.mark.parametrize("kind", ["random", "chain", "star"])
def test_oracle_matches_the_reference_on_the_whole_pool(kind):
    case = make_case(2, [(6, 9), (1, 0), (4, 3)], kind, seed=21, pool_slots=200, device="cpu")
    kept = {k: v.clone() for k, v in case.items() if isinstance(v, torch.Tensor)}
    out, lse = oracle(case)
    assert out.dtype == torch.float64 and out.shape == (11, 2, 512)
    assert lse.dtype == torch.float32 and lse.shape == (11, 2)
    want_lse = torch.empty(11, 2, dtype=torch.float32)
    want = tree_verify_mla_reference(case["q"].double(), case["kv_cache"].double(), case["qo_indptr"],
                                     case["kv_indptr"], case["kv_indices"], case["tree_mask"],
                                     case["sm_scale"], lse=want_lse)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=0, atol=0)
    assert all(torch.equal(case[k], v) for k, v in kept.items())  # the case is left as it was
    got = call(tree_verify_mla_reference, case)  # bf16 through `call`: the oracle rounded to bf16
    torch.testing.assert_close(got.double(), out, rtol=1e-2, atol=1e-2)
