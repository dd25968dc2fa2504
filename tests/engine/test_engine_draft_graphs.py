"""The draft model's decode passes as graph steps, on the CPU: the drafter's pass count is what
it runs, every pass goes through `Runner.draft_logits` (where draft graphs replay), the graph
body in decode mode gives the eager pass's logits, and what cannot be a decode graph is refused
with a clear error. Capture and replay on the GPU: test_engine_draft_graphs_gpu.py."""

from __future__ import annotations

import random

import pytest
import torch

from kdtree.engine import TokenTree
from kdtree.engine.decode.backends import get_backend
from kdtree.engine.decode.drafters import DDTreeDrafter, SelfDraftDrafter
from kdtree.engine.decode.graph_capture import Bucket, stage_values, verify_body
from kdtree.engine.kv.kv_pool import KVPool
from kdtree.engine.decode.speculative import Request, Runner

from test_engine_graph import PaddedReference


class CountingRunner(Runner):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.passes: list[tuple[int, int]] = []
        self.token_kinds: list[str] = []

    def draft_logits(self, contexts, tokens, slots, num_layers):
        self.passes.append((len(tokens), num_layers))
        self.token_kinds.append("tensor" if isinstance(tokens, torch.Tensor) else "host")
        return super().draft_logits(contexts, tokens, slots, num_layers)


def _requests(model, pool, lens, seed=0):
    rng = random.Random(seed)
    requests = []
    for b, n in enumerate(lens):
        pool.add_request(b)
        pool.append(b, pool.alloc(n).tolist())
        requests.append(Request(b, [1] * n, 100, output=[rng.randrange(model.config.vocab_size)]))
    return requests


@pytest.mark.parametrize("drafter,budget", [(DDTreeDrafter(), 16), (DDTreeDrafter(), 4), (SelfDraftDrafter(), 16),
                                            (SelfDraftDrafter(), 2)])
def test_every_draft_pass_goes_through_draft_logits(tiny_model, drafter, budget):
    pool = KVPool(tiny_model.config.num_layers, 512, dtype=tiny_model.dtype)
    runner = CountingRunner(tiny_model, pool, get_backend("torch"))
    requests = _requests(tiny_model, pool, [10, 25])
    free = pool.num_free
    trees = drafter.propose(requests, budget, runner)
    layers = drafter.layers_for(tiny_model.config.num_layers)
    assert runner.passes == [(2, layers)] * drafter.passes(budget)
    assert all(len(t) <= budget for t in trees) and pool.num_free == free  # draft slots handed back
    # the pending tokens come from the host; every later pass takes the one before's argmax as is
    assert runner.token_kinds == ["host"] + ["tensor"] * (drafter.passes(budget) - 1)


def test_a_pass_given_device_tokens_equals_the_pass_given_host_ints(tiny_model):
    pool = KVPool(tiny_model.config.num_layers, 256, dtype=tiny_model.dtype)
    gen = torch.Generator().manual_seed(5)
    for layer in pool.kv:
        layer.normal_(generator=gen)
    requests = _requests(tiny_model, pool, [17, 40], seed=4)
    runner = Runner(tiny_model, pool, get_backend("torch"))
    contexts = [runner.prefix(r.rid) for r in requests]
    slots = pool.alloc(2).tolist()
    host = runner.draft_logits(contexts, [r.pending for r in requests], slots, 2)
    device = runner.draft_logits(contexts, torch.tensor([r.pending for r in requests]), slots, 2)
    assert torch.equal(host, device)
    with pytest.raises(ValueError, match=r"tokens must be \[2\]"):
        runner.draft_logits(contexts, torch.tensor([requests[0].pending]), slots, 2)


def test_decode_bucket_body_gives_the_eager_passs_logits(tiny_model):
    cfg = tiny_model.config
    pool = KVPool(cfg.num_layers, 256, dtype=tiny_model.dtype)
    gen = torch.Generator().manual_seed(3)
    for layer in pool.kv:
        layer.normal_(generator=gen)
    requests = _requests(tiny_model, pool, [9, 31, 4], seed=2)
    runner = Runner(tiny_model, pool, get_backend("reference"))
    contexts = [runner.prefix(r.rid) for r in requests]
    slots = pool.alloc(3).tolist()
    eager = runner.draft_logits(contexts, [r.pending for r in requests], slots, 2)
    bucket = Bucket(4, 1, 32)
    trees = [TokenTree.single(r.pending) for r in requests]
    values, starts = stage_values(bucket, [9, 31, 4], trees, [[s] for s in slots], int(pool.alloc(1)[0]))
    kv_indices = torch.zeros(bucket.kv_capacity, dtype=torch.int32)
    for start, ctx in zip(starts, contexts):
        kv_indices[start: start + ctx.numel()] = ctx
    logits = torch.full((bucket.rows, cfg.vocab_size), float("nan"))
    verify_body(tiny_model, pool.kv, bucket, PaddedReference(), torch.tensor(values), kv_indices, logits,
                num_layers=2, mode="decode")
    assert torch.allclose(logits[:3], eager, rtol=1e-4, atol=1e-4)
    assert torch.isfinite(logits).all()


def test_what_cannot_be_a_decode_graph_is_refused(tiny_model):
    from kdtree.engine.decode.draft_graphs import DraftGraphs
    from kdtree.engine.decode.graph_capture import VerifyGraphs

    pool = KVPool(tiny_model.config.num_layers, 64, dtype=tiny_model.dtype)
    bucket = Bucket(1, 4, 32)
    stage = torch.zeros(bucket.stage_len, dtype=torch.int64)
    with pytest.raises(ValueError, match="one node per request"):
        verify_body(tiny_model, pool.kv, bucket, PaddedReference(), stage, torch.zeros(bucket.kv_capacity,
                    dtype=torch.int32), torch.zeros(4, tiny_model.config.vocab_size), mode="decode")
    with pytest.raises(ValueError, match="mode must be"):
        verify_body(tiny_model, pool.kv, bucket, PaddedReference(), stage, torch.zeros(bucket.kv_capacity,
                    dtype=torch.int32), torch.zeros(4, tiny_model.config.vocab_size), mode="extend")
    with pytest.raises(ValueError, match="num_layers must be in"):
        DraftGraphs(tiny_model, pool, num_layers=99)
    with pytest.raises(ValueError, match="CUDA device"):
        DraftGraphs(tiny_model, pool, num_layers=1)
    with pytest.raises(ValueError, match="CUDA device"):
        VerifyGraphs(tiny_model, pool, tree_buckets=(1,), mode="decode")
