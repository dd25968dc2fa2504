"""A model's whole verify step on random KV, and its time broken down.

`VerifySetup`: B requests with an L-token prefix of random KV in a pool and one random tree each,
one runner per engine backend on the same model and pool (phase 2's verify-step speed gate,
`python -m kdtree.tools.step_profile`); `step_breakdown` splits one step's time. `EngineVerify`:
the same with an eager and a CUDA-graph runner, both on the kernel backend (phase 3);
`StepInputs`: fresh verify steps for one graph bucket. `token_exact_prompts`: the prompts of
phase 2's token-exactness gate (`python -m kdtree.tools.variant_audit` replays them).
"""

from __future__ import annotations

import math
import random
import statistics
import time
from typing import Any, Callable

import torch

from kdtree.engine.decode.backends import get_backend
from kdtree.engine.decode.graph_capture import VerifyGraphs, stage_values, verify_body
from kdtree.engine.kv.kv_pool import KVPool
from kdtree.engine.decode.metadata import verify_metadata
from kdtree.engine.decode.speculative import Request, Runner
from kdtree.engine.decode.tree import TokenTree


def token_exact_prompts(n: int, long_prompts: int, long_len: int, vocab: int, seed: int) -> list[list[int]]:
    """n prompts: `long_prompts` of `long_len`+ tokens (a motif repeated with noise, so prompt
    lookup and the induction circuit both have matches far back), the rest 4..48 tokens."""
    rng = random.Random(seed)
    prompts = []
    for i in range(n):
        if i < long_prompts:
            motif = [rng.randrange(vocab) for _ in range(rng.randint(64, 512))]
            p = [motif[j % len(motif)] if rng.random() > 0.05 else rng.randrange(vocab)
                 for j in range(long_len + rng.randrange(256))]
        else:
            m = [rng.randrange(vocab) for _ in range(rng.randint(2, 6))]
            p = [m[j % len(m)] if i % 2 else rng.randrange(vocab) for j in range(rng.randint(4, 48))]
        prompts.append(p)
    return prompts


class VerifySetup:
    """Requests with an L-token prefix of random KV in a pool, one tree each, two runners (kernel and
    triton backends) on the same model and pool. `step(runner)` is one whole verify step."""

    def __init__(self, model, context: int, batch: int, budget: int, seed: int, backends=("kernel", "triton")):
        rng = random.Random(seed)
        cfg = model.config
        slots = batch * (context + budget) + 64
        self.pool = KVPool(cfg.num_layers, slots, dtype=model.dtype, device=model.device)
        gen = torch.Generator(device=model.device).manual_seed(seed)
        for layer in self.pool.kv:
            layer.normal_(generator=gen)
        self.requests, self.trees = [], []
        order = self.pool.alloc(batch * context).tolist()
        rng.shuffle(order)
        for b in range(batch):
            self.pool.add_request(b)
            self.pool.append(b, order[b * context: (b + 1) * context])
            prompt = [rng.randrange(cfg.vocab_size) for _ in range(8)]
            r = Request(b, prompt, 1 << 20, output=[rng.randrange(cfg.vocab_size)])
            self.requests.append(r)
            parents = [-1] + [rng.randrange(t) for t in range(1, budget)]
            tokens = [r.pending] + rng.sample(range(cfg.vocab_size), budget - 1)
            self.trees.append(TokenTree(tokens, parents))
        tree_ids = self.pool.alloc(batch * budget).tolist()
        self.tree_slots = [tree_ids[b * budget: (b + 1) * budget] for b in range(batch)]
        self.runners = {name: Runner(model, self.pool, get_backend(name)) for name in backends}
        self.context, self.batch, self.budget = context, batch, budget

    def step(self, name: str):
        return self.runners[name].verify_logits(self.requests, self.trees, self.tree_slots)

    def refresh(self, seed: int) -> None:
        """New prefix KV in place (every layer's pool rows redrawn): the speed gate's rounds must
        not be answerable from a cache keyed on shapes or pointers."""
        gen = torch.Generator(device=self.pool.kv[0].device).manual_seed(seed)
        for layer in self.pool.kv:
            layer.normal_(generator=gen)

    def metadata(self, name: str):
        runner = self.runners[name]
        return verify_metadata([runner.prefix(r.rid) for r in self.requests], self.tree_slots,
                               [t.parents for t in self.trees], runner.model.device)


def _median_ms(fn, repeats: int, sync) -> float:
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def step_breakdown(setup: VerifySetup, name: str, repeats: int = 10) -> dict[str, float]:
    """One verify step's time split: metadata conversion, attention (every layer's op call on
    that metadata, alone), the rest (projections, MLPs, KV writes, head, host). Wall clock with
    the device synchronised around each part."""
    model = setup.runners[name].model
    dev = model.device
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    backend = setup.runners[name].backend
    meta = setup.metadata(name)
    rows = sum(setup.budget for _ in setup.requests)
    q = torch.randn(rows, model.config.num_heads, 576, device=dev, dtype=model.dtype)
    kv = setup.pool.kv
    scale = model.config.sm_scale

    def attention():
        for layer in kv:
            backend.forward_verify(q, layer, meta, scale)

    step_ms = _median_ms(lambda: setup.step(name), repeats, sync)
    conv_ms = _median_ms(lambda: setup.metadata(name), repeats, sync)
    attn_ms = _median_ms(attention, repeats, sync)
    return {"step_ms": step_ms, "conversion_ms": conv_ms, "attention_ms": attn_ms,
            "rest_ms": max(0.0, step_ms - conv_ms - attn_ms), "attention_share": attn_ms / step_ms if step_ms else math.nan}


class EngineVerify:
    """Requests with an L-token prefix of random KV and one tree each, and two runners on the same
    model and pool, both on the kernel backend: ``eager`` and ``graph`` (`VerifyGraphs`)."""

    def __init__(self, model, context: int, batch: int, tree: int, seed: int, graphs_factory=None):
        rng = random.Random(seed)
        cfg = model.config
        self.pool = KVPool(cfg.num_layers, batch * (context + tree) + 64, dtype=model.dtype, device=model.device)
        gen = torch.Generator(device=model.device).manual_seed(seed)
        for layer in self.pool.kv:
            layer.normal_(generator=gen)
        order = self.pool.alloc(batch * context).tolist()
        rng.shuffle(order)
        self.requests, self.trees = [], []
        for b in range(batch):
            self.pool.add_request(b)
            self.pool.append(b, order[b * context: (b + 1) * context])
            r = Request(b, [1], 1 << 20, output=[rng.randrange(cfg.vocab_size)])
            self.requests.append(r)
            self.trees.append(TokenTree([r.pending] + rng.sample(range(cfg.vocab_size), tree - 1),
                                        [-1] + [rng.randrange(t) for t in range(1, tree)]))
        ids = self.pool.alloc(batch * tree).tolist()
        self.tree_slots = [ids[b * tree: (b + 1) * tree] for b in range(batch)]
        graphs = (graphs_factory or VerifyGraphs)(model, self.pool)
        self.runners = {"eager": Runner(model, self.pool, get_backend("kernel")),
                        "graph": Runner(model, self.pool, get_backend("kernel"), graphs=graphs)}

    def step(self, name: str):
        return self.runners[name].verify_logits(self.requests, self.trees, self.tree_slots)


def mixed_parents(rng: random.Random, n: int) -> list[int]:
    """A tree of n nodes: random (half the draws), a chain or a star."""
    kind = rng.choice(["random", "random", "chain", "star"])
    if kind == "chain":
        return list(range(-1, n - 1))
    if kind == "star":
        return [-1] + [0] * (n - 1)
    return [-1] + [rng.randrange(t) for t in range(1, n)]


class StepInputs:
    """Fresh verify steps for a bucket of the engine: a model, a pool of random KV, and draws of
    live requests, prefix lengths, trees, tokens and slots (prefix and tree slots disjoint)."""

    def __init__(self, model, bucket, seed: int = 0):
        self.model, self.bucket = model, bucket
        self.slots = bucket.batch * (bucket.context + bucket.tree) + 8
        self.pool = KVPool(model.config.num_layers, self.slots + 1, dtype=model.dtype, device=model.device)
        gen = torch.Generator(device=model.device).manual_seed(seed)
        for layer in self.pool.kv:
            layer.normal_(generator=gen)
        self.scratch = self.slots  # the last slot: never a prefix or tree slot of a draw

    def draw(self, seed: int, device: str, lens=None, sizes=None) -> dict[str, Any]:
        rng = random.Random(seed)
        B, T, C = self.bucket.batch, self.bucket.tree, self.bucket.context
        vocab = self.model.config.vocab_size
        if lens is None:
            live = rng.choice([B, rng.randint(1, B)])
            lens = [rng.choice([0, C - T, rng.randint(0, C - T)]) for _ in range(live)]
        if sizes is None:
            sizes = [rng.choice([T, 1, rng.randint(1, T)]) for _ in lens]
        order = list(range(self.slots))
        rng.shuffle(order)
        trees, tree_slots, prefixes, at = [], [], [], 0
        for length, size in zip(lens, sizes):
            prefixes.append(order[at: at + length])
            tree_slots.append(order[at + length: at + length + size])
            at += length + size
            trees.append(TokenTree(rng.sample(range(vocab), size), mixed_parents(rng, size)))
        values, starts = stage_values(self.bucket, lens, trees, tree_slots, self.scratch)
        kv_indices = torch.tensor(order[: self.bucket.kv_capacity], dtype=torch.int32)
        for start, prefix in zip(starts, prefixes):
            kv_indices[start: start + len(prefix)] = torch.tensor(prefix, dtype=torch.int32)
        return {"stage": torch.tensor(values, dtype=torch.int64, device=device), "kv_indices": kv_indices.to(device)}

    def outputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"logits": torch.empty(self.bucket.rows, self.model.config.vocab_size, dtype=torch.float32,
                                      device=inputs["stage"].device)}

    def body(self, backend) -> Callable[[dict[str, Any], dict[str, Any]], None]:
        def fn(inputs, outputs):
            verify_body(self.model, self.pool.kv, self.bucket, backend, inputs["stage"], inputs["kv_indices"],
                        outputs["logits"])
        return fn
