"""Drafters: each proposes one token tree per request, rooted at its pending token, within a budget.

- ``ngram``: prompt lookup. The longest recent suffix (up to ``max_n`` tokens) that occurred
  earlier in the request's context; every earlier occurrence's continuation becomes a path
  (most recent first, shared prefixes merged), then shorter suffixes fill the remaining budget.
- ``selfdraft``: the model's first ``num_layers`` layers (and the shared head) run greedily for a
  few depths; the tree is that chain plus the ``top_k`` candidates at every depth.
- ``ddtree``: the same per-depth distributions, grown best-first (`best_first_tree`) under the
  budget, as DDTree does over a block drafter's per-position distributions.

The self-draft layers are the target model's own first layers, so the prefix KV the target wrote
is exactly theirs; draft tokens get temporary slots, freed before the drafter returns. Their
attention over the prefix goes through the runner's backend in decode mode (the kernel backend
sends it to the CUDA kernel), with the prefix slots already on the device, replayed from the
runner's draft graphs where it has them (`Runner.draft_logits`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Optional, Sequence, Union

import torch

from kdtree.engine.decode.h2d import to_device
from kdtree.engine.decode.speculative import Request, Runner
from kdtree.engine.decode.tree import TokenTree, TreeBuilder, best_first_tree


class Drafter(ABC):
    name: str = "?"
    #: positions a draft may reach past the pending token (for sizing checks)
    max_depth: int = 0

    @abstractmethod
    def propose(self, requests: Sequence[Request], budget: int, runner: Runner) -> list[TokenTree]:
        """One tree per request with at most `budget` nodes, root = the request's pending token."""


class NgramDrafter(Drafter):
    name = "ngram"

    def __init__(self, max_n: int = 4, max_depth: int = 16):
        if max_n < 1 or max_depth < 1:
            raise ValueError(f"max_n and max_depth must be >= 1, got {max_n}, {max_depth}")
        self.max_n, self.max_depth = max_n, max_depth

    def tree_for(self, context: Sequence[int], budget: int) -> TokenTree:
        builder = TreeBuilder(context[-1], budget)
        n_ctx = len(context)
        for n in range(min(self.max_n, n_ctx - 1), 0, -1):
            suffix = list(context[n_ctx - n:])
            for i in range(n_ctx - n - 1, -1, -1):
                if builder.full:
                    return builder.build()
                if list(context[i: i + n]) == suffix:
                    builder.add_path(context[i + n: i + n + self.max_depth])
        return builder.build()

    def propose(self, requests, budget, runner):
        return [self.tree_for(r.context, budget) for r in requests]


class SelfDraftDrafter(Drafter):
    name = "selfdraft"

    def __init__(self, num_layers: Optional[int] = None, max_depth: int = 6, top_k: int = 4):
        if max_depth < 1 or top_k < 1:
            raise ValueError(f"max_depth and top_k must be >= 1, got {max_depth}, {top_k}")
        self.num_layers, self.max_depth, self.top_k = num_layers, max_depth, top_k

    def draft_layers(self, runner: Runner) -> int:
        return self.layers_for(runner.model.config.num_layers)

    def layers_for(self, total_layers: int) -> int:
        """The draft model's layer count for a target of `total_layers` layers."""
        return self.num_layers if self.num_layers is not None else max(1, total_layers // 2)

    def depth_logprobs(self, requests: Sequence[Request], depth: int, runner: Runner) -> torch.Tensor:
        """[B, depth, V] log-probs of the draft model along its own greedy chain from the pending token."""
        pool, layers = runner.pool, self.draft_layers(runner)
        dev = runner.model.device
        prefix = [runner.prefix(r.rid) for r in requests]  # device tensors: no host copy of long prefixes
        temp: list[list[int]] = [[] for _ in requests]
        # after the first pass the chain's tokens stay on the device: no pass waits for the one before
        tokens: Union[list[int], torch.Tensor] = [r.pending for r in requests]
        out = []
        try:
            for _ in range(depth):
                slots = pool.alloc(len(requests)).tolist()
                context = [torch.cat([p, to_device(t, dev, torch.int32)]) if t else p
                           for p, t in zip(prefix, temp)]
                for t, s in zip(temp, slots):
                    t.append(s)
                logits = runner.draft_logits(context, tokens, slots, layers)
                logprobs = torch.log_softmax(logits, dim=-1)
                out.append(logprobs)
                tokens = logprobs.argmax(-1)
        finally:
            pool.free([s for t in temp for s in t])
        return torch.stack(out, dim=1)

    def passes(self, budget: int) -> int:
        """Decode passes of the draft model per `propose` at this budget (0 below 2 nodes)."""
        if budget < 2:
            return 0
        return max(1, min(self.max_depth, (budget - 1) // min(self.top_k, budget - 1)))

    def propose(self, requests, budget, runner):
        if budget < 2:
            return [TokenTree.single(r.pending) for r in requests]
        k = min(self.top_k, budget - 1)
        depth = self.passes(budget)
        top = self.depth_logprobs(requests, depth, runner).topk(k, dim=-1).indices.tolist()
        trees = []
        for r, per_depth in zip(requests, top):
            builder, node = TreeBuilder(r.pending, budget), 0
            for candidates in per_depth:
                children = [builder.add_child(node, tok) for tok in candidates]
                node = children[0]
            trees.append(builder.build())
        return trees


class DDTreeDrafter(SelfDraftDrafter):
    name = "ddtree"

    def __init__(self, num_layers: Optional[int] = None, max_depth: int = 8):
        super().__init__(num_layers=num_layers, max_depth=max_depth)

    def passes(self, budget: int) -> int:
        return min(self.max_depth, budget - 1) if budget >= 2 else 0

    def propose(self, requests, budget, runner):
        if budget < 2:
            return [TokenTree.single(r.pending) for r in requests]
        depth = self.passes(budget)
        logprobs = self.depth_logprobs(requests, depth, runner)
        return [best_first_tree(r.pending, lp, budget) for r, lp in zip(requests, logprobs)]


_DRAFTERS = {"ngram": NgramDrafter, "selfdraft": SelfDraftDrafter, "ddtree": DDTreeDrafter}
DRAFTER_NAMES = ("none",) + tuple(_DRAFTERS)


def get_drafter(name: str) -> Optional[Drafter]:
    """A drafter by name; None for 'none' (plain greedy decoding)."""
    if name == "none":
        return None
    if name not in _DRAFTERS:
        raise ValueError(f"unknown drafter {name!r}; known: {list(DRAFTER_NAMES)}")
    return _DRAFTERS[name]()
