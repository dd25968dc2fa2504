"""The decode loop's steps: prefill, plain greedy decode, and tree verification.

A `Request` keeps its prompt and the tokens generated so far; the last generated token (the
*pending* token) has no KV yet: the next step writes it, as the root of that step's tree.
Verification writes every tree node's KV into fresh slots, runs one forward over all nodes with
the tree mask, follows the path greedy decoding agrees with from the root, emits the accepted
drafts plus the bonus token, keeps the accepted nodes' slots in the request's token order and
frees the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

from kdtree.engine.backends import AttentionBackend
from kdtree.engine.kv_pool import KVPool
from kdtree.engine.metadata import AttentionMetadata, decode_metadata, extend_metadata, verify_metadata
from kdtree.engine.model import MLAModel
from kdtree.engine.tree import TokenTree


@dataclass
class Request:
    rid: int
    prompt: list[int]
    max_new_tokens: int
    output: list[int] = field(default_factory=list)

    @property
    def context(self) -> list[int]:
        """Prompt and generated tokens; the last one is the pending token."""
        return self.prompt + self.output

    @property
    def pending(self) -> int:
        return self.output[-1]

    @property
    def done(self) -> bool:
        return len(self.output) >= self.max_new_tokens


class Runner:
    """One model, its KV pool and an attention backend; runs batched steps over requests."""

    def __init__(self, model: MLAModel, pool: KVPool, backend: AttentionBackend):
        self.model, self.pool, self.backend = model, pool, backend

    def forward(self, tokens: Sequence[int], positions: Sequence[int], slots: Sequence[int],
                meta: AttentionMetadata, num_layers: Optional[int] = None) -> torch.Tensor:
        dev = self.model.device
        return self.model(torch.tensor(list(tokens), device=dev), torch.tensor(list(positions), device=dev),
                          torch.tensor(list(slots), dtype=torch.int32, device=dev), self.pool.kv,
                          self.backend, meta, num_layers)

    def prefill(self, requests: Sequence[Request]) -> None:
        """Write every prompt's KV and take each request's first greedy token."""
        lens = [len(r.prompt) for r in requests]
        slots = self.pool.alloc(sum(lens)).tolist()
        per_req = [slots[sum(lens[:b]): sum(lens[:b + 1])] for b in range(len(requests))]
        for r, s in zip(requests, per_req):
            self.pool.add_request(r.rid)
            self.pool.append(r.rid, s)
        meta = extend_metadata([[] for _ in requests], per_req, self.model.device)
        logits = self.forward([t for r in requests for t in r.prompt],
                              [p for n in lens for p in range(n)], slots, meta)
        last = torch.tensor(lens).cumsum(0) - 1
        for r, tok in zip(requests, logits[last.to(logits.device)].argmax(-1).tolist()):
            r.output.append(tok)

    def decode_step(self, requests: Sequence[Request]) -> list[int]:
        """Plain greedy decoding: one token per request. Returns tokens emitted per request."""
        prefix = [self.pool.slots(r.rid) for r in requests]
        slots = self.pool.alloc(len(requests)).tolist()
        for r, s in zip(requests, slots):
            self.pool.append(r.rid, [s])
        meta = decode_metadata(prefix, slots, self.model.device)
        logits = self.forward([r.pending for r in requests], [len(p) for p in prefix], slots, meta)
        for r, tok in zip(requests, logits.argmax(-1).tolist()):
            r.output.append(tok)
        return [1] * len(requests)

    def verify_step(self, requests: Sequence[Request], trees: Sequence[TokenTree]) -> list[int]:
        """Verify one tree per request (root = its pending token). Returns tokens emitted per request."""
        for r, tree in zip(requests, trees):
            if tree.root != r.pending:
                raise ValueError(f"request {r.rid}: tree root {tree.root} is not the pending token {r.pending}")
        sizes = [len(t) for t in trees]
        slots = self.pool.alloc(sum(sizes)).tolist()
        starts = [sum(sizes[:b]) for b in range(len(trees))]
        tree_slots = [slots[s: s + n] for s, n in zip(starts, sizes)]
        try:
            prefix = [self.pool.slots(r.rid) for r in requests]
            meta = verify_metadata(prefix, tree_slots, [t.parents for t in trees], self.model.device)
            positions = [len(p) + d for p, t in zip(prefix, trees) for d in t.depths()]
            logits = self.forward([tok for t in trees for tok in t.tokens], positions, slots, meta)
            greedy = logits.argmax(-1).tolist()
        except BaseException:
            self.pool.free(slots)
            raise
        emitted = []
        for r, tree, start, own in zip(requests, trees, starts, tree_slots):
            path = [0]
            while (child := tree.child(path[-1], greedy[start + path[-1]])) is not None:
                path.append(child)
            kept = set(path)
            self.pool.append(r.rid, [own[n] for n in path])
            self.pool.free([s for n, s in enumerate(own) if n not in kept])
            new = [tree.tokens[n] for n in path[1:]] + [greedy[start + path[-1]]]
            r.output.extend(new)
            emitted.append(len(new))
        return emitted
