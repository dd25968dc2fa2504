"""The MLA transformer the engine serves (DeepSeek-V3 layout, dense SwiGLU MLPs).

The model owns no KV state: every forward writes its tokens' latent rows into the pool slots it
is given and attends through an `AttentionBackend` with the batch's `AttentionMetadata`.
Logits are always computed in fp32 (final norm output upcast, lm_head upcast), so bf16 runs never
produce ties from rounding the logits themselves.

Weights come from a seed (`kdtree.engine.model.weights.init_weights`), scaled so that the greedy top-1
logit stands well clear of the top-2: a token-identity backbone in the residual stream plus a
context term of controlled gain. Module names match transformers' DeepseekV3 so a state dict maps
one to one (`kdtree.engine.model.hf_convert`).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from kdtree.engine.model.config import ModelConfig
from kdtree.engine.model.mla import MLAttention
from kdtree.engine.model.mlp import SwiGLU
from kdtree.engine.model.norm import RMSNorm
from kdtree.engine.model.rope import RotaryEmbedding


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = MLAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)


class MLAModel(nn.Module):
    """Embedding, `num_layers` MLA decoder layers, final RMSNorm, lm_head."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rope = RotaryEmbedding(cfg.qk_rope_head_dim, cfg.rope_theta, cfg.max_position_embeddings)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, out_slots: torch.Tensor,
                kv_caches: list[torch.Tensor], backend, meta, num_layers: Optional[int] = None,
                logit_rows: Optional[torch.Tensor] = None, max_position: Optional[int] = None) -> torch.Tensor:
        """Logits fp32 [N, vocab] for N tokens of a batch laid out as `meta` describes.

        input_ids, positions, out_slots: [N]; kv_caches: one [S, 576] tensor per layer (the pool).
        num_layers < config.num_layers runs only the first layers, then the final norm and head
        (the self-draft model). logit_rows (long [n]): compute the logits of these rows only
        ([n, vocab]; prefill needs one row per request, not [N, vocab] fp32). max_position: the
        largest position, when the caller knows it on the host (else it is read from the device,
        a synchronisation).
        """
        depth = self.config.num_layers if num_layers is None else num_layers
        if not 1 <= depth <= self.config.num_layers:
            raise ValueError(f"num_layers must be in [1, {self.config.num_layers}], got {depth}")
        if max_position is None and positions.numel():
            max_position = int(positions.max())
        if max_position is not None and max_position >= self.config.max_position_embeddings:
            raise ValueError(f"position {max_position} exceeds max_position_embeddings "
                             f"= {self.config.max_position_embeddings}")
        rope = self.rope.tables(positions.long(), self.dtype)
        slots = out_slots.long()
        h = self.embed_tokens(input_ids.long())
        for layer, kv_cache in zip(self.layers[:depth], kv_caches):
            h = h + layer.self_attn(layer.input_layernorm(h), rope, kv_cache, slots, backend, meta)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        if logit_rows is not None:
            h = h[logit_rows]
        return torch.nn.functional.linear(self.norm(h).float(), self.lm_head.weight.float())
