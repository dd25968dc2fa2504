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
from typing import Optional, Sequence, Union

import torch

from kdtree.engine.decode.backends import AttentionBackend
from kdtree.engine.decode.h2d import to_device
from kdtree.engine.kv.kv_pool import KVPool
from kdtree.engine.decode.metadata import AttentionMetadata, decode_metadata, extend_metadata, verify_metadata
from kdtree.engine.model.model import MLAModel
from kdtree.engine.kv.slot_mirror import SlotMirror
from kdtree.engine.decode.tree import TokenTree


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
    """One model, its KV pool and an attention backend; runs batched steps over requests.

    Long prompts are prefilled in chunks of `prefill_chunk` tokens per request (each chunk's
    attention is itself cut into chain trees by the backend), so prefill memory is bounded by
    the chunk, not the prompt. Request prefixes reach the metadata as device tensors
    (`SlotMirror`): a step uploads only the slots that are new since the last one.
    With `graphs` (`kdtree.engine.decode.graph_capture.VerifyGraphs`), verify steps that fit a bucket
    replay its CUDA graph; with `draft_graphs` (`kdtree.engine.decode.draft_graphs.DraftGraphs`), so do
    the draft model's decode passes (`draft_logits`); the others run eagerly.
    """

    def __init__(self, model: MLAModel, pool: KVPool, backend: AttentionBackend, prefill_chunk: int = 8192,
                 graphs=None, draft_graphs=None):
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        self.model, self.pool, self.backend = model, pool, backend
        self.prefill_chunk = prefill_chunk
        self.mirror = SlotMirror(pool, model.device)
        self.graphs, self.draft_graphs = graphs, draft_graphs
        # rid -> (top-1 minus top-2 logit, runner-up token) of every greedy token prefill and plain
        # decode steps take, when set to a dict (`generate(record_margins=True)`: the token_exact
        # gates' near-tie test needs the oracle's margins).
        self.decisions: Optional[dict[int, list[tuple[float, int]]]] = None

    def _record(self, rids: Sequence[int], logits: torch.Tensor) -> None:
        if self.decisions is None:
            return
        top = logits.float().topk(2, dim=-1)
        margins = (top.values[:, 0] - top.values[:, 1]).tolist()
        for rid, margin, runner_up in zip(rids, margins, top.indices[:, 1].tolist()):
            self.decisions.setdefault(rid, []).append((margin, runner_up))

    def forward(self, tokens: Union[Sequence[int], torch.Tensor], positions: Sequence[int], slots: Sequence[int],
                meta: AttentionMetadata, num_layers: Optional[int] = None,
                logit_rows: Optional[Sequence[int]] = None) -> torch.Tensor:
        """Logits of one forward pass; `tokens` are host ints or a tensor of ids already on the device."""
        dev = self.model.device
        rows = None if logit_rows is None else to_device(list(logit_rows), dev, torch.long)
        positions = list(positions)
        ids = tokens.to(torch.long) if isinstance(tokens, torch.Tensor) else to_device(list(tokens), dev, torch.long)
        return self.model(ids, to_device(positions, dev, torch.long),
                          to_device(list(slots), dev, torch.int32), self.pool.kv,
                          self.backend, meta, num_layers, rows, max_position=max(positions, default=None))

    def draft_logits(self, contexts: Sequence[torch.Tensor], tokens: Union[Sequence[int], torch.Tensor],
                     slots: Sequence[int], num_layers: int) -> torch.Tensor:
        """Logits [B, vocab] of one decode pass of the first `num_layers` layers: request b's token
        `tokens[b]`, written into `slots[b]`, attends to `contexts[b]` (int32 device slots) and itself.
        `tokens` are host ints or a device tensor [B] (a previous pass's argmax, never read back).
        Replayed from `draft_graphs` where a bucket holds it (and its layer count is this one), else eager."""
        if isinstance(tokens, torch.Tensor) and (tokens.shape != (len(slots),) or tokens.device != self.model.device):
            raise ValueError(f"tokens must be [{len(slots)}] on {self.model.device}, "
                             f"got shape {tuple(tokens.shape)} on {tokens.device}")
        graphs = self.draft_graphs
        if graphs is not None and graphs.num_layers == num_layers:
            logits = graphs.decode_logits(contexts, tokens, slots)
            if logits is not None:
                return logits
        meta = decode_metadata(contexts, slots, self.model.device)
        return self.forward(tokens, [len(c) for c in contexts], slots, meta, num_layers=num_layers)

    def prefix(self, rid: int) -> torch.Tensor:
        """The request's slots so far, int32 on the model's device (a view kept by the mirror)."""
        return self.mirror.prefix(rid)

    def release(self, rid: int) -> None:
        """Free a finished request's slots."""
        self.pool.release(rid)
        self.mirror.forget(rid)

    def prefill(self, requests: Sequence[Request]) -> None:
        """Write every prompt's KV and take each request's first greedy token."""
        lens = [len(r.prompt) for r in requests]
        slots = self.pool.alloc(sum(lens)).tolist()
        starts = [sum(lens[:b]) for b in range(len(requests))]
        per_req = [slots[s: s + n] for s, n in zip(starts, lens)]
        for r, s in zip(requests, per_req):
            self.pool.add_request(r.rid)
            self.pool.append(r.rid, s)
        chunk = self.prefill_chunk
        for c0 in range(0, max(lens), chunk):
            batch = [b for b, n in enumerate(lens) if n > c0]
            prefix = [self.prefix(requests[b].rid)[:c0] for b in batch]
            new = [per_req[b][c0: c0 + chunk] for b in batch]
            meta = extend_metadata(prefix, new, self.model.device)
            ends = [c0 + len(n) for n in new]
            last_rows, at = [], 0
            for b, n in zip(batch, new):
                at += len(n)
                if c0 + len(n) == lens[b]:
                    last_rows.append((b, at - 1))
            logits = self.forward([t for b in batch for t in requests[b].prompt[c0: c0 + chunk]],
                                  [p for c1 in ends for p in range(c0, c1)],
                                  [s for n in new for s in n], meta,
                                  logit_rows=[row for _, row in last_rows] or [0])
            if last_rows:
                for (b, _), tok in zip(last_rows, logits.argmax(-1).tolist()):
                    requests[b].output.append(tok)
                self._record([requests[b].rid for b, _ in last_rows], logits)

    def decode_step(self, requests: Sequence[Request]) -> list[int]:
        """Plain greedy decoding: one token per request. Returns tokens emitted per request."""
        prefix = [self.prefix(r.rid) for r in requests]
        slots = self.pool.alloc(len(requests)).tolist()
        for r, s in zip(requests, slots):
            self.pool.append(r.rid, [s])
        meta = decode_metadata(prefix, slots, self.model.device)
        logits = self.forward([r.pending for r in requests], [len(p) for p in prefix], slots, meta)
        for r, tok in zip(requests, logits.argmax(-1).tolist()):
            r.output.append(tok)
        self._record([r.rid for r in requests], logits)
        return [1] * len(requests)

    def verify_logits(self, requests: Sequence[Request], trees: Sequence[TokenTree],
                      tree_slots: Sequence[Sequence[int]]) -> torch.Tensor:
        """Logits [sum T_b, vocab] of every tree node: writes the trees' KV into `tree_slots` (every
        layer) and attends over prefix and tree slots straight from the pool. Changes nothing else."""
        if self.graphs is not None:
            logits = self.graphs.verify_logits(self, requests, trees, tree_slots)
            if logits is not None:
                return logits
        prefix = [self.prefix(r.rid) for r in requests]
        meta = verify_metadata(prefix, tree_slots, [t.parents for t in trees], self.model.device)
        positions = [len(p) + d for p, t in zip(prefix, trees) for d in t.depths()]
        return self.forward([tok for t in trees for tok in t.tokens], positions,
                            [s for own in tree_slots for s in own], meta)

    def verify_step(self, requests: Sequence[Request], trees: Sequence[TokenTree]) -> list[int]:
        """Verify one tree per request (root = its pending token). Returns tokens emitted per request."""
        for r, tree in zip(requests, trees):
            if tree.root != r.pending:
                raise ValueError(f"request {r.rid}: tree root {tree.root} is not the pending token {r.pending}")
        sizes = [len(t) for t in trees]
        # Each request's tree slots, grown after its last slot where the allocator can (Tier 0).
        tree_slots = self.pool.alloc_trees([r.rid for r in requests], sizes)
        slots = [s for own in tree_slots for s in own]
        starts = [sum(sizes[:b]) for b in range(len(trees))]
        try:
            greedy = self.verify_logits(requests, trees, tree_slots).argmax(-1).tolist()
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
