"""Tree speculative decoding emits exactly greedy decoding's tokens; the verify step keeps the right KV."""

from __future__ import annotations

import pytest
import torch

import kdtree.engine.decode.drafters as drafters
from kdtree.engine import TokenTree, build_model, generate, get_backend
from kdtree.engine.kv.allocator import PoolExhaustedError
from kdtree.engine.kv.kv_pool import KVPool
from kdtree.engine.decode.speculative import Request, Runner
from engine_prompts import random_prompts, repetitive_prompts

PROMPTS = random_prompts(18, seed=3)  # lengths 3..39, half of them repetitive
NEW = 24


@pytest.fixture(scope="module")
def greedy(tiny_model):
    return generate(PROMPTS, model=tiny_model, max_new_tokens=NEW).tokens


def test_prompt_set_is_batched_with_different_lengths():
    assert len(PROMPTS) >= 16 and len({len(p) for p in PROMPTS}) >= 12


@pytest.mark.slow
@pytest.mark.parametrize("drafter,budget", [("ngram", 16), ("selfdraft", 16), ("ddtree", 16), ("ddtree", 48)])
def test_speculative_decoding_is_token_exact(tiny_model, greedy, drafter, budget):
    result = generate(PROMPTS, model=tiny_model, drafter=drafter, budget=budget, max_new_tokens=NEW)
    assert result.tokens == greedy
    assert all(len(t) == NEW for t in result.tokens)
    assert result.mean_accepted > 1.0  # drafts were accepted, so the trees really were verified
    assert result.steps < NEW  # and fewer steps than plain greedy decoding needed


@pytest.mark.slow
def test_prompt_lookup_accepts_on_repetitive_prompts(tiny_model):
    prompts = repetitive_prompts(16, seed=5)
    plain = generate(prompts, model=tiny_model, max_new_tokens=NEW)
    looked_up = generate(prompts, model=tiny_model, drafter="ngram", budget=16, max_new_tokens=NEW)
    assert looked_up.tokens == plain.tokens
    assert plain.mean_accepted == 1.0
    assert looked_up.mean_accepted > 2.0
    assert looked_up.accepted_per_step[0] > 1.0  # accepted from the prompt itself, on the first step


@pytest.mark.slow
def test_big_ddtree_budgets_stay_exact(tiny_model, greedy):
    for budget in (256, 512):
        result = generate(PROMPTS[:3], model=tiny_model, drafter="ddtree", budget=budget, max_new_tokens=12)
        assert result.tokens == [g[:12] for g in greedy[:3]]


def test_backends_agree_end_to_end(tiny_model, greedy):
    some = PROMPTS[:6]
    for backend, drafter in (("reference", "none"), ("reference", "ddtree"), ("torch", "ngram")):
        result = generate(some, model=tiny_model, backend=backend, drafter=drafter, max_new_tokens=16)
        assert result.tokens == [g[:16] for g in greedy[:6]], (backend, drafter)


def oracle_tree(pending: int, future: list[int], wrong: int) -> TokenTree:
    """The true continuation as a chain, a wrong sibling at every depth, and a dead branch under it."""
    tokens, parents, node = [pending], [-1], 0
    for tok in future:
        tokens += [tok, wrong]
        parents += [node, node]
        tokens.append((wrong + 1) % 1024)
        parents.append(len(tokens) - 2)
        node = len(tokens) - 3
    return TokenTree(tokens, parents)


def test_verify_keeps_the_accepted_path_in_order_and_frees_the_rest(tiny_model, greedy):
    pool = KVPool(tiny_model.config.num_layers, 400)
    runner = Runner(tiny_model, pool, get_backend("torch"))
    reqs = [Request(i, PROMPTS[i], NEW) for i in range(3)]
    runner.prefill(reqs)
    depth = [5, 0, 2]
    trees = []
    for r, d in zip(reqs, depth):
        future = greedy[r.rid][1: 1 + d]
        wrong = next(t for t in range(1024) if t not in future and t != greedy[r.rid][1 + d])
        trees.append(oracle_tree(r.pending, future, wrong))
    free_before = pool.num_free
    before = [pool.slots(r.rid) for r in reqs]
    emitted = runner.verify_step(reqs, trees)
    assert emitted == [d + 1 for d in depth]
    for r, d, old in zip(reqs, depth, before):
        assert r.output == greedy[r.rid][: 2 + d]
        assert pool.slots(r.rid)[: len(old)] == old and pool.seq_len(r.rid) == len(old) + 1 + d
    assert free_before - pool.num_free == sum(1 + d for d in depth)  # only the kept path stays allocated
    pool.owner_map()  # no slot held twice
    # the kept KV is what sequential decoding would have written: the next steps still follow greedy
    while not all(r.done for r in reqs):
        runner.decode_step([r for r in reqs if not r.done])
    assert [r.output[:NEW] for r in reqs] == [greedy[r.rid] for r in reqs]
    for r in reqs:
        pool.release(r.rid)
    assert pool.num_free == pool.num_slots


def test_selfdraft_frees_its_temporary_slots(tiny_model):
    pool = KVPool(tiny_model.config.num_layers, 200)
    runner = Runner(tiny_model, pool, get_backend("torch"))
    reqs = [Request(i, p, 8) for i, p in enumerate(PROMPTS[:4])]
    runner.prefill(reqs)
    free = pool.num_free
    for name in ("selfdraft", "ddtree"):
        trees = drafters.get_drafter(name).propose(reqs, 32, runner)
        assert pool.num_free == free
        assert all(1 < len(t) <= 32 and t.root == r.pending for t, r in zip(trees, reqs))


def test_bad_inputs_get_clear_errors(tiny_model, monkeypatch):
    with pytest.raises(ValueError, match="unknown attention backend 'nope'"):
        generate([[1, 2]], model=tiny_model, backend="nope")
    with pytest.raises(ValueError, match="unknown drafter 'eagle'"):
        generate([[1, 2]], model=tiny_model, drafter="eagle")
    for budget in (0, 1025):
        with pytest.raises(ValueError, match="budget"):
            generate([[1, 2]], model=tiny_model, drafter="ddtree", budget=budget)
    with pytest.raises(ValueError, match="longer than the KV pool"):
        generate([list(range(10))], model=tiny_model, pool_slots=8)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        generate([[1, 5000]], model=tiny_model)
    with pytest.raises(ValueError, match="prompts"):
        generate([[]], model=tiny_model)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        generate([[1] * 4000], model=tiny_model, max_new_tokens=200)
    with pytest.raises(PoolExhaustedError, match="KV pool exhausted"):
        generate([[1, 2, 3, 4]], model=tiny_model, drafter="ddtree", budget=16, pool_slots=12)

    class Greedy(drafters.Drafter):
        def propose(self, requests, budget, runner):
            return [TokenTree([r.pending] + list(range(budget)), [-1] + list(range(budget))) for r in requests]

    monkeypatch.setitem(drafters._DRAFTERS, "greedy", Greedy)
    with pytest.raises(ValueError, match="tree of 9 nodes .* over the budget of 8"):
        generate([[1, 2, 3]], model=tiny_model, drafter="greedy", budget=8)


def test_bf16_model_runs_the_speculative_path():
    model = build_model(seed=0, dtype=torch.bfloat16)
    plain = generate(PROMPTS[:4], model=model, max_new_tokens=8)
    spec = generate(PROMPTS[:4], model=model, drafter="ddtree", budget=32, max_new_tokens=8)
    assert spec.tokens == plain.tokens and spec.dtype == "bfloat16"
