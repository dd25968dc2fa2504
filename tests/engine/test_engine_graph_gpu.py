"""The engine's verify graphs on the GPU: generation with graphs emits the eager path's tokens,
steps are replayed (not silently run eagerly), a replay equals the captured body run eagerly
bitwise, and steps outside every bucket fall back to the eager path."""

from __future__ import annotations

import pytest
import torch

from kdtree.bench.verify_step import EngineVerify, StepInputs
from kdtree.engine import generate
from kdtree.engine.decode.graph_capture import Bucket, VerifyGraphs

pytestmark = pytest.mark.gpu


def prompts():
    import random

    rng = random.Random(4)
    return [[rng.randrange(1024) for _ in range(n)] for n in (5, 40, 300, 17)]


@pytest.mark.parametrize("drafter,budget", [("ddtree", 16), ("ngram", 8)])
def test_generation_with_graphs_emits_the_eager_tokens(tiny_cuda_model, drafter, budget):
    eager = generate(prompts(), model=tiny_cuda_model, drafter=drafter, budget=budget, backend="kernel",
                     max_new_tokens=20, cuda_graph=False)
    graph = generate(prompts(), model=tiny_cuda_model, drafter=drafter, budget=budget, backend="kernel",
                     max_new_tokens=20, cuda_graph=True)
    assert graph.tokens == eager.tokens
    assert graph.cuda_graph and graph.graph_replays == graph.steps > 0
    assert not eager.cuda_graph and eager.graph_replays == 0


def test_graph_logits_match_the_eager_step(tiny_cuda_model):
    setup = EngineVerify(tiny_cuda_model, context=700, batch=3, tree=8, seed=2)
    graph, eager = setup.step("graph").clone(), setup.step("eager")
    assert torch.allclose(graph, eager, rtol=2e-2, atol=2e-2)
    assert setup.runners["graph"].graphs.replays == 1 and setup.runners["graph"].graphs.captures == 1


def test_a_replay_equals_the_body_run_eagerly_bitwise(tiny_cuda_model):
    from kdtree.engine.decode.graph_capture import BucketKernelBackend

    bucket = Bucket(4, 16, 2048)
    setup = StepInputs(tiny_cuda_model, bucket, seed=3)
    graphs = VerifyGraphs(tiny_cuda_model, setup.pool)
    plan = graphs.plan(bucket)
    assert (plan.num_rows, plan.batch, plan.context[1]) == (bucket.rows, bucket.batch, bucket.context)
    fn = setup.body(BucketKernelBackend(plan))
    static = setup.draw(0, "cuda")
    out = setup.outputs(static)
    fn(static, out)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn(static, out)
    for seed in range(1, 5):
        fresh = setup.draw(seed, "cuda")
        for key in static:
            static[key].copy_(fresh[key])
        g.replay()
        eager = setup.outputs(fresh)
        fn(fresh, eager)
        assert torch.equal(out["logits"], eager["logits"]), f"seed {seed}"


def test_steps_outside_every_bucket_run_eagerly(tiny_cuda_model):
    setup = EngineVerify(tiny_cuda_model, context=100, batch=3, tree=8, seed=5,
                         graphs_factory=lambda m, p: VerifyGraphs(m, p, batch_buckets=(1, 2)))
    graph, eager = setup.step("graph").clone(), setup.step("eager")
    graphs = setup.runners["graph"].graphs
    assert graphs.fallbacks == 1 and graphs.replays == 0 and torch.equal(graph, eager)
