"""The MLA model's configuration (pydantic) and its named sizes."""

from __future__ import annotations

import math
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kdtree.kernels.contract import LATENT_DIM, ROPE_DIM


class ModelConfig(BaseModel):
    """A DeepSeek-V3-style MLA transformer. kv_lora_rank and qk_rope_head_dim are fixed by the op contract.

    The fields from code_dim on shape the seeded weights so greedy decisions have wide logit
    margins (see `kdtree.engine.model.weights`); they change values, never the architecture.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    vocab_size: int = Field(1024, ge=2)
    hidden_size: int = Field(512, ge=8)
    num_layers: int = Field(4, ge=1)
    num_heads: int = Field(8, ge=1, le=128)
    q_lora_rank: Optional[int] = Field(None, ge=1)
    kv_lora_rank: Literal[512] = LATENT_DIM
    qk_rope_head_dim: Literal[64] = ROPE_DIM
    qk_nope_head_dim: int = Field(128, ge=1)
    v_head_dim: int = Field(128, ge=1)
    intermediate_size: int = Field(1024, ge=1)
    rms_norm_eps: float = Field(1e-6, gt=0)
    rope_theta: float = Field(10000.0, gt=1)
    max_position_embeddings: int = Field(4096, ge=2)
    # margin design (kdtree.engine.model.weights): values only, never the architecture
    code_dim: int = Field(128, ge=8)
    logit_scale: float = Field(16.0, gt=0)
    copy_vote: float = Field(1.83, gt=1)
    context_gain: float = Field(1.0, ge=0)
    context_readout: float = Field(0.03, ge=0)
    backbone_cycle: tuple[int, int] = (3, 12)

    @model_validator(mode="after")
    def _check(self) -> "ModelConfig":
        lo, hi = self.backbone_cycle
        if not 1 <= lo <= hi:
            raise ValueError(f"backbone_cycle: need 1 <= lo <= hi, got {self.backbone_cycle}")
        if self.hidden_size < 3 * self.code_dim + 2:
            raise ValueError(f"hidden_size {self.hidden_size} cannot hold 3 token codes of code_dim "
                             f"{self.code_dim} plus a constant and a free dim (need >= {3 * self.code_dim + 2})")
        if min(self.qk_nope_head_dim, self.v_head_dim) < self.code_dim or self.kv_lora_rank < 2 * self.code_dim:
            raise ValueError(f"qk_nope_head_dim and v_head_dim must be >= code_dim ({self.code_dim}) and "
                             f"kv_lora_rank >= 2 * code_dim")
        return self

    @property
    def qk_head_dim(self) -> int:
        """Per-head query/key width of the un-absorbed model (nope + rope)."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def sm_scale(self) -> float:
        """Softmax scale: 1/sqrt(nope + rope) of the un-absorbed model; absorbed dot products are equal."""
        return 1.0 / math.sqrt(self.qk_head_dim)


PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(),
    "small": ModelConfig(hidden_size=1024, num_layers=8, num_heads=16, intermediate_size=2816,
                         vocab_size=4096),
    # token-exactness at long context: 16 heads (one TP-8 shard of DeepSeek-V3's 128), 2 layers
    # (the margin circuit's minimum), positions for prompts of 32k tokens and more
    "tiny-long": ModelConfig(num_layers=2, num_heads=16, max_position_embeddings=40960),
    # DeepSeek-V3 / Kimi-K2 attention as one TP-8 shard: 16 heads, kv_lora_rank 512, rope 64,
    # nope 128, v 128, hidden 7168, the dense MLP's 18432 / 8 = 2304 per shard; 8 layers, so
    # that long-context steps are attention-bound as in the real model, at a size whose random
    # weights build in seconds. q_lora_rank is left None: the margin circuit needs it (it
    # changes the query projection only, not the attention's shape).
    "dsv3-tp8": ModelConfig(hidden_size=7168, num_layers=8, num_heads=16, intermediate_size=2304,
                            vocab_size=8192, max_position_embeddings=139264),
}


def preset(name: str) -> ModelConfig:
    """A named configuration ('tiny' runs fast on 2 CPU cores; 'dsv3-tp8' is a deployment's
    attention shape, for the GPU)."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name]
