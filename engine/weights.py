"""Seeded weights whose greedy decisions keep wide top-1 logit margins.

Why: the token-exactness gates compare two bf16 runs on the GPU (different kernels, different
batch shapes). Their logits differ by bf16 rounding noise, and greedy decoding diverges wherever
the top-1 and top-2 logits are closer than that noise. A plain random model puts ~1-3 % of its
steps within bf16 noise of a tie, so a 512-token gate would almost never be stable.

How:
- *Token-identity backbone.* Each token's embedding is a random vector of RMS 1. The lm_head row
  of token ``j`` is ``logit_scale * e[pi^-1(j)] / hidden`` for a permutation ``pi`` of the vocab,
  so the residual stream's own token ``t`` votes for ``pi(t)`` with logit ~``logit_scale`` while
  every other row sees ~N(0, logit_scale / sqrt(hidden)): a margin of ~75 % of the logit scale.
  ``pi`` is made of short cycles (lengths in ``backbone_cycle``), so greedy text falls into loops,
  which gives the prompt-lookup drafter something to find, as greedy loops do in real models.
- *Context of controlled gain.* Attention and MLP weights are ordinary random (fan-in scaled);
  their outputs into the residual (``o_proj``, ``down_proj``) are scaled by ``context_gain``. The
  context moves every logit (the backends' and the KV pool's mistakes show up in logits and,
  through the logits, in tokens) and overrules the backbone in a minority of steps; those steps
  are the only ones that can come near a tie, so the rate of near-ties is the backbone's share
  of the margin budget. tests/engine/test_margins.py measures the margin distribution against
  bf16 rounding, and bf16-vs-fp32 greedy agreement, on CPU.
- Logits are computed in fp32 (see `kdtree.engine.model`), so bf16 never rounds logits into ties.

Everything is drawn on the CPU in fp32 from one ``torch.Generator`` and then cast, so a seed gives
the same model on every device and dtype.
"""

from __future__ import annotations

import math

import torch

from kdtree.engine.config import ModelConfig


def backbone_permutation(cfg: ModelConfig, gen: torch.Generator) -> torch.Tensor:
    """pi as a long tensor [vocab]: token t's backbone successor, made of cycles of bounded length."""
    order = torch.randperm(cfg.vocab_size, generator=gen).tolist()
    lo, hi = cfg.backbone_cycle
    succ = [0] * cfg.vocab_size
    start = 0
    while start < len(order):
        length = int(torch.randint(lo, hi + 1, (1,), generator=gen))
        cycle = order[start: start + length]
        for i, tok in enumerate(cycle):
            succ[tok] = cycle[(i + 1) % len(cycle)]
        start += length
    return torch.tensor(succ, dtype=torch.long)


def init_weights(model: torch.nn.Module, seed: int) -> None:
    """Fill `model` (an MLAModel) in place from `seed`, following the design above."""
    cfg: ModelConfig = model.config
    gen = torch.Generator().manual_seed(int(seed))

    def normal(shape, std):
        return torch.randn(*shape, generator=gen) * std

    def linear(module, std):
        module.weight.copy_(normal(module.weight.shape, std).to(module.weight))

    with torch.no_grad():
        embeddings = normal((cfg.vocab_size, cfg.hidden_size), 1.0)
        embeddings = embeddings / embeddings.pow(2).mean(-1, keepdim=True).sqrt()
        model.embed_tokens.weight.copy_(embeddings.to(model.embed_tokens.weight))
        successor = backbone_permutation(cfg, gen)
        head = torch.empty_like(embeddings)
        head[successor] = embeddings * (cfg.logit_scale / cfg.hidden_size)
        model.lm_head.weight.copy_(head.to(model.lm_head.weight))

        d = cfg.hidden_size
        for layer in model.layers:
            attn = layer.self_attn
            if hasattr(attn, "q_proj"):
                linear(attn.q_proj, 1 / math.sqrt(d))
            else:
                linear(attn.q_a_proj, 1 / math.sqrt(d))
                linear(attn.q_b_proj, 1 / math.sqrt(cfg.q_lora_rank))
            linear(attn.kv_a_proj_with_mqa, 1 / math.sqrt(d))
            linear(attn.kv_b_proj, 1 / math.sqrt(cfg.kv_lora_rank))
            linear(attn.o_proj, cfg.context_gain / math.sqrt(cfg.num_heads * cfg.v_head_dim))
            linear(layer.mlp.gate_proj, 1 / math.sqrt(d))
            linear(layer.mlp.up_proj, 1 / math.sqrt(d))
            linear(layer.mlp.down_proj, cfg.context_gain / math.sqrt(cfg.intermediate_size))
