"""Tier 0 in the engine's own speculative loop: `Runner.verify_step` takes each request's tree
slots through the allocator's grow path (right after the request's last slot where it is free)
and frees the rejected ones, so a request's KV stays in few runs in real decoding."""

from __future__ import annotations

import random

import pytest

from kdtree.engine.kv.allocator import FreeListAllocator, SortedRunAllocator
from kdtree.engine.decode.backends import get_backend
from kdtree.engine.kv.kv_pool import KVPool
from kdtree.engine.decode.speculative import Request, Runner
from kdtree.engine.decode.tree import TreeBuilder


def _chain_trees(requests, size, rng, vocab):
    trees = []
    for r in requests:
        builder, node = TreeBuilder(r.pending, size), 0
        for _ in range(size - 1):
            node = builder.add_child(node, rng.randrange(vocab))
        trees.append(builder.build())
    return trees


def _decode(model, allocator, steps=6, size=8):
    pool = KVPool(model.config.num_layers, allocator.num_slots, dtype=model.dtype, device=model.device,
                  allocator=allocator)
    runner = Runner(model, pool, get_backend("torch"))
    rng = random.Random(0)
    requests = [Request(i, [rng.randrange(model.config.vocab_size) for _ in range(n)], 10_000)
                for i, n in enumerate((5, 9, 7))]
    runner.prefill(requests)
    seen = []  # per step: (last slot, was the slot after it free, the tree's slots) per request
    real = runner.verify_logits

    def spy(reqs, trees, tree_slots):
        seen[-1] = [(last, free, list(own)) for (last, free), own in zip(seen[-1], tree_slots)]
        return real(reqs, trees, tree_slots)

    runner.verify_logits = spy
    for _ in range(steps):
        seen.append([(pool.slots(r.rid)[-1], not allocator.is_allocated(pool.slots(r.rid)[-1] + 1))
                     for r in requests])
        runner.verify_step(requests, _chain_trees(requests, size, rng, model.config.vocab_size))
    return pool, requests, seen


@pytest.mark.slow
def test_verify_step_grows_each_request_after_its_last_slot(tiny_model):
    pool, requests, seen = _decode(tiny_model, SortedRunAllocator(4096))
    grown = 0
    for step in seen:
        for last, free_after, own in step:
            if free_after:
                assert own[0] == last + 1  # the tree's root sits right after the request's last token
                grown += 1
    assert grown >= len(seen) * (len(requests) - 1)  # all but the first request (blocked by its neighbour)
    # the accepted chain is the tree's first nodes, so rows stay one run once they can grow
    assert all(pool.num_runs(r.rid) <= 2 for r in requests)
    assert pool.num_free + sum(pool.seq_len(r.rid) for r in requests) == 4096  # rejected slots came back


@pytest.mark.slow
def test_verify_step_keeps_the_batch_order_with_a_plain_free_list(tiny_model):
    pool, requests, seen = _decode(tiny_model, FreeListAllocator(4096))
    for step in seen:  # one allocation for the whole batch, split in request order
        flat = [s for _, _, own in step for s in own]
        assert len(set(flat)) == len(flat)
    assert pool.num_free + sum(pool.seq_len(r.rid) for r in requests) == 4096
