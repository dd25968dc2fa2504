"""Plain rotary embedding (no YaRN) on the 64 rope dims, half-split layout (`rotate_half`).

Transformers' DeepseekV3 must run with ``rope_interleave=False`` to match this layout.
"""

from __future__ import annotations

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    def __init__(self, dim: int, theta: float, max_positions: int):
        super().__init__()
        assert dim % 2 == 0, dim
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        freqs = torch.arange(max_positions, dtype=torch.float)[:, None] * inv_freq[None, :]
        angles = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        self.max_positions = max_positions

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate x [N, ..., dim] by its token's position (positions [N])."""
        shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (x.shape[-1],)
        cos = self.cos[positions].to(x.dtype).view(shape)
        sin = self.sin[positions].to(x.dtype).view(shape)
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin
