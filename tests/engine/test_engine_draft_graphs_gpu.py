"""The draft model's decode-pass graphs on the GPU: generation with graphs replays every draft pass
(not silently eager) and emits the eager tokens; one replayed pass equals the eager pass; the
Triton backend as SGLang serves it captures and replays both halves of a step too."""

from __future__ import annotations

import pytest
import torch

from kdtree.engine import TokenTree, generate
from kdtree.engine.api import decode_loop
from kdtree.engine.decode.backends import get_backend
from kdtree.engine.decode.drafters import get_drafter
from kdtree.engine.decode.draft_graphs import DraftGraphs
from kdtree.engine.kv.kv_pool import KVPool
from kdtree.engine.decode.speculative import Request, Runner

pytestmark = pytest.mark.gpu


def prompts():
    import random

    rng = random.Random(7)
    return [[rng.randrange(1024) for _ in range(n)] for n in (12, 300, 1500)]


@pytest.mark.parametrize("drafter", ["ddtree", "selfdraft"])
def test_generation_replays_every_draft_pass_and_keeps_the_tokens(tiny_cuda_model, drafter):
    eager = generate(prompts(), model=tiny_cuda_model, drafter=drafter, budget=16, backend="kernel", max_new_tokens=24,
                     cuda_graph=False)
    graph = generate(prompts(), model=tiny_cuda_model, drafter=drafter, budget=16, backend="kernel", max_new_tokens=24,
                     cuda_graph=True)
    assert graph.tokens == eager.tokens
    assert graph.draft_graph_replays > 0 and graph.graph_replays == graph.steps
    assert eager.draft_graph_replays == 0


def test_a_replayed_pass_matches_the_eager_pass(tiny_cuda_model):
    pool = KVPool(tiny_cuda_model.config.num_layers, 4096, dtype=tiny_cuda_model.dtype, device="cuda")
    for layer in pool.kv:
        layer.normal_()
    graphs = DraftGraphs(tiny_cuda_model, pool, num_layers=2)
    eager_runner = Runner(tiny_cuda_model, pool, get_backend("kernel"))
    graph_runner = Runner(tiny_cuda_model, pool, get_backend("kernel"), draft_graphs=graphs)
    for b, n in enumerate((700, 33)):
        pool.add_request(b)
        pool.append(b, pool.alloc(n).tolist())
    requests = [Request(b, [1], 10, output=[5 + b]) for b in range(2)]
    contexts = [eager_runner.prefix(r.rid) for r in requests]
    slots = pool.alloc(2).tolist()
    want = eager_runner.draft_logits(contexts, [5, 6], slots, 2).clone()
    for _ in range(2):  # the first call captures, the second replays
        got = graph_runner.draft_logits(contexts, [5, 6], slots, 2)
        assert torch.allclose(got, want, rtol=2e-2, atol=2e-2)
    # a previous pass's argmax goes in on the device (the host stages token 0 in its place)
    got = graph_runner.draft_logits(contexts, torch.tensor([5, 6], device="cuda"), slots, 2)
    assert torch.allclose(got, want, rtol=2e-2, atol=2e-2)
    assert graphs.graphs.captures == 1 and graphs.graphs.replays == 3
    with pytest.raises(ValueError, match="row_ids must be"):
        graphs.graphs.logits_for(contexts, [TokenTree.single(0)] * 2, [[s] for s in slots],
                                 row_ids=torch.tensor([5], device="cuda"))


def test_sglang_triton_backend_replays_both_halves(tiny_cuda_model):
    from kdtree.bench.decode_backends import Arm, make_runner
    from kdtree.bench.decode_triton import load_kernels

    try:
        load_kernels()
    except ImportError as err:
        pytest.skip(f"SGLang's Triton kernels are not loadable here: {err}")
    pool = KVPool(tiny_cuda_model.config.num_layers, 4096, dtype=tiny_cuda_model.dtype, device="cuda")
    runner = make_runner(Arm("triton", "graph"), tiny_cuda_model, pool, draft_layers=2)
    eager = make_runner(Arm("triton", "eager"), tiny_cuda_model, pool, draft_layers=None)
    spec = get_drafter("ddtree")
    out = {}
    for name, r in (("eager", eager), ("graph", runner)):
        requests = [Request(10 * (len(out) + 1) + i, p, 12) for i, p in enumerate(prompts())]
        r.prefill(requests)
        decode_loop(r, requests, spec, 16)
        out[name] = [q.output for q in requests]
    assert out["graph"] == out["eager"]
    assert runner.graphs.replays > 0 and runner.draft_graphs.graphs.replays > 0
