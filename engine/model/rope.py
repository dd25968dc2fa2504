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

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> "RopeTables":
        """cos and sin of every token's position, gathered once per forward and shared by all layers."""
        return RopeTables(self.cos[positions].to(dtype), self.sin[positions].to(dtype))

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate x [N, ..., dim] by its token's position (positions [N])."""
        return self.tables(positions, x.dtype).rotate(x)


class RopeTables:
    """Per-token cos/sin rows [N, dim] for one forward (`RotaryEmbedding.tables`)."""

    __slots__ = ("cos", "sin")

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor):
        self.cos, self.sin = cos, sin

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, dim] or [N, H, dim] rotated by its token's position (rotate_half layout)."""
        cos, sin = (self.cos, self.sin) if x.dim() == 2 else (self.cos[:, None], self.sin[:, None])
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return torch.addcmul(x * cos, rotated, sin)
