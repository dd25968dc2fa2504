"""The draft model's decode passes captured in CUDA graphs, one per (batch, context) bucket.

A self-draft pass runs the model's first layers for one new token per request over its prefix
and the draft tokens before it. As a graph it is the verify graph of one-node trees
(`kdtree.engine.decode.graph_capture.VerifyGraphs` with ``tree_buckets=(1,)``, ``mode="decode"``, the
draft model's ``num_layers``): the host writes the staging vector and each request's slots, then
replays. The attention inside is the backend's decode path with static buffers: the kernel with
the bucket's launch plan by default, or what ``backend_factory`` gives.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

import torch

from kdtree.engine.decode.backends import AttentionBackend
from kdtree.engine.decode.graph_capture import BATCH_BUCKETS, Bucket, VerifyGraphs
from kdtree.engine.decode.tree import TokenTree


class DraftGraphs:
    """Captured decode passes of the draft model (its first `num_layers` layers) of one model and pool.

    `decode_logits` serves a pass from its bucket's graph (capturing it on first use) or returns
    None when no bucket holds it (the caller runs it eagerly). ``graphs`` is the underlying
    `VerifyGraphs`: its ``captures``, ``replays`` and ``fallbacks`` count what happened.
    """

    def __init__(self, model, pool, num_layers: int, batch_buckets: Sequence[int] = BATCH_BUCKETS,
                 max_context: Optional[int] = None,
                 backend_factory: Optional[Callable[[Bucket], AttentionBackend]] = None):
        if not 1 <= num_layers <= model.config.num_layers:
            raise ValueError(f"num_layers must be in [1, {model.config.num_layers}], got {num_layers}")
        self.num_layers = num_layers
        self.graphs = VerifyGraphs(model, pool, batch_buckets=batch_buckets, tree_buckets=(1,),
                                   max_context=max_context, backend_factory=backend_factory,
                                   num_layers=num_layers, mode="decode")

    def decode_logits(self, contexts: Sequence[torch.Tensor], tokens: Union[Sequence[int], torch.Tensor],
                      slots: Sequence[int]) -> Optional[torch.Tensor]:
        """Logits [B, vocab] of one decode pass: request b's token `tokens[b]` written into `slots[b]`
        attends to `contexts[b]` (int32 device slots) and itself. `tokens` may be a device tensor
        [B] (the previous pass's argmax): it is copied into the graph's input on the device, so the
        host never waits for the pass before. A view of the graph's static output, valid until the
        next replay; None when no bucket holds the pass."""
        if isinstance(tokens, torch.Tensor):
            trees = [TokenTree.single(0) for _ in slots]
            return self.graphs.logits_for(contexts, trees, [[int(s)] for s in slots], row_ids=tokens)
        trees = [TokenTree.single(int(t)) for t in tokens]
        return self.graphs.logits_for(contexts, trees, [[int(s)] for s in slots])
