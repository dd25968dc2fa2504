"""Load the engine's weights into transformers' DeepseekV3 (an independent implementation).

transformers is a test extra and is imported only inside these functions. The config is built
locally (nothing is downloaded): every MLP dense (``first_k_dense_replace = num_layers``), plain
RoPE (``rope_type = default``) in the half-split layout (``rope_interleave = False``), no MTP layers.
"""

from __future__ import annotations

from kdtree.engine.model.config import ModelConfig
from kdtree.engine.model.model import MLAModel


def hf_config(cfg: ModelConfig):
    from transformers import DeepseekV3Config  # noqa: PLC0415 - optional dependency

    return DeepseekV3Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        moe_intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_heads,
        n_shared_experts=1, n_routed_experts=8, n_group=1, topk_group=1, num_experts_per_tok=2,
        first_k_dense_replace=cfg.num_layers, kv_lora_rank=cfg.kv_lora_rank, q_lora_rank=cfg.q_lora_rank,
        qk_rope_head_dim=cfg.qk_rope_head_dim, qk_nope_head_dim=cfg.qk_nope_head_dim,
        v_head_dim=cfg.v_head_dim, max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=cfg.rms_norm_eps, rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        rope_interleave=False, tie_word_embeddings=False, attention_bias=False, num_mtp_layers=0,
        pad_token_id=None, bos_token_id=None, eos_token_id=None,
    )


def hf_state_dict(model: MLAModel) -> dict:
    """The model's weights under DeepseekV3ForCausalLM's parameter names."""
    out = {}
    for name, tensor in model.state_dict().items():
        out[name if name.startswith("lm_head.") else f"model.{name}"] = tensor
    return out


def to_hf_model(model: MLAModel):
    """A DeepseekV3ForCausalLM (eager attention, fp32, CPU) holding `model`'s weights."""
    from transformers import DeepseekV3ForCausalLM  # noqa: PLC0415 - optional dependency

    hf = DeepseekV3ForCausalLM(hf_config(model.config)).float().eval()
    hf.config._attn_implementation = "eager"
    missing, unexpected = hf.load_state_dict({k: v.float().cpu() for k, v in hf_state_dict(model).items()},
                                             strict=False)
    if missing or unexpected:
        raise ValueError(f"weight mapping mismatch: missing {missing}, unexpected {unexpected}")
    return hf
