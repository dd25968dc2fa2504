"""Multi-head latent attention in the absorbed form the op contract computes.

Per token the layer stores one 576-wide row in the pool: the RMS-normed 512-dim latent ``c`` and
the 64 rope dims of the shared key, already rotated. Per head the query is
``[W_UK^T q_nope ; rope(q_pe)]`` (576 wide), so ``q · row`` equals the un-absorbed
``q_nope · (W_UK c) + q_pe · k_pe``; the attention output over the latents (512 wide) goes
through ``W_UV`` and ``o_proj``. ``kv_b_proj`` holds W_UK and W_UV stacked per head, as in
DeepSeek-V3 checkpoints.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from kdtree.engine.model.config import ModelConfig
from kdtree.engine.model.norm import RMSNorm
from kdtree.engine.model.rope import RopeTables

if TYPE_CHECKING:
    from kdtree.engine.decode.backends import AttentionBackend
    from kdtree.engine.decode.metadata import AttentionMetadata


class MLAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads = cfg.num_heads
        self.nope = cfg.qk_nope_head_dim
        self.rope_dim = cfg.qk_rope_head_dim
        self.v_dim = cfg.v_head_dim
        self.rank = cfg.kv_lora_rank
        self.sm_scale = cfg.sm_scale
        q_out = cfg.num_heads * cfg.qk_head_dim
        if cfg.q_lora_rank is None:
            self.q_proj = nn.Linear(cfg.hidden_size, q_out, bias=False)
        else:
            self.q_a_proj = nn.Linear(cfg.hidden_size, cfg.q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank)
            self.q_b_proj = nn.Linear(cfg.q_lora_rank, q_out, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(cfg.hidden_size, self.rank + self.rope_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(self.rank)
        self.kv_b_proj = nn.Linear(self.rank, cfg.num_heads * (self.nope + self.v_dim), bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * self.v_dim, cfg.hidden_size, bias=False)

    def _queries(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "q_proj"):
            return self.q_proj(x)
        return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))

    def forward(self, x: torch.Tensor, rope: RopeTables, kv_cache: torch.Tensor, out_slots: torch.Tensor,
                backend: "AttentionBackend", meta: "AttentionMetadata") -> torch.Tensor:
        """x [N, hidden] -> [N, hidden]; writes the N tokens' rows into kv_cache[out_slots] (long) first.

        The per-head absorptions are batched matmuls over heads (one launch each, little host work:
        at short context the eager step is bound by the host's per-op cost)."""
        n = x.shape[0]
        q = self._queries(x).view(n, self.num_heads, self.nope + self.rope_dim)
        q_nope, q_pe = q.split([self.nope, self.rope_dim], dim=-1)
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([self.rank, self.rope_dim], dim=-1)
        latent = self.kv_a_layernorm(latent)
        kv_cache[out_slots] = torch.cat([latent, rope.rotate(k_pe)], dim=-1).to(kv_cache.dtype)

        w = self.kv_b_proj.weight.view(self.num_heads, self.nope + self.v_dim, self.rank)
        w_uk, w_uv = w[:, : self.nope], w[:, self.nope:]
        q_latent = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)  # [N, H, r]
        q_full = torch.cat([q_latent, rope.rotate(q_pe)], dim=-1)
        o_latent = backend.forward(q_full, kv_cache, meta, self.sm_scale)  # [N, H, 512]
        o = torch.bmm(o_latent.to(x.dtype).transpose(0, 1), w_uv.transpose(1, 2))  # [H, N, v]
        return self.o_proj(o.transpose(0, 1).reshape(n, self.num_heads * self.v_dim))
