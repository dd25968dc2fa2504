"""The MLA model: agrees with transformers' DeepseekV3 on the same weights; config and seeding contracts."""

from __future__ import annotations

import math

import pytest
import torch

from kdtree.engine import ModelConfig, build_model, get_backend, preset
from kdtree.engine.kv.kv_pool import KVPool
from kdtree.engine.decode.metadata import decode_metadata, extend_metadata
from kdtree.engine.decode.speculative import Runner

transformers = pytest.importorskip("transformers", reason="transformers (a test extra) is not installed")


def engine_logits(model, ids: list[int], split: int) -> torch.Tensor:
    """Logits of every position: prefill ids[:split], then decode the rest one token at a time."""
    pool = KVPool(model.config.num_layers, len(ids) + 4)
    runner = Runner(model, pool, get_backend("torch"))
    slots = pool.alloc(split).tolist()
    rows = [runner.forward(ids[:split], range(split), slots, extend_metadata([[]], [slots]))]
    for pos in range(split, len(ids)):
        new = pool.alloc(1).tolist()
        rows.append(runner.forward([ids[pos]], [pos], new, decode_metadata([slots], new)))
        slots += new
    return torch.cat(rows)


@pytest.mark.parametrize("cfg", [preset("tiny"), ModelConfig(num_layers=2, q_lora_rank=96, num_heads=4)],
                         ids=["tiny", "q_lora"])
@pytest.mark.slow
def test_logits_match_transformers_deepseek_v3(cfg):
    from kdtree.engine.model.hf_convert import to_hf_model

    model = build_model(cfg, seed=5)
    hf = to_hf_model(model)
    ids = torch.randint(0, cfg.vocab_size, (21,), generator=torch.Generator().manual_seed(2)).tolist()
    with torch.no_grad():
        expected = hf(torch.tensor([ids])).logits[0].float()
    got = engine_logits(model, ids, split=15)  # prefill and decode paths both checked
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert expected.std() > 1.0  # not a degenerate model whose logits all agree trivially


def test_sm_scale_is_the_unabsorbed_head_dim():
    assert preset("tiny").sm_scale == pytest.approx(1 / math.sqrt(128 + 64))


def test_config_rejects_a_latent_the_op_contract_does_not_take():
    with pytest.raises(ValueError):
        ModelConfig(kv_lora_rank=256)
    with pytest.raises(ValueError):
        ModelConfig(qk_rope_head_dim=32)
    with pytest.raises(ValueError, match="cannot hold 3 token codes"):
        ModelConfig(hidden_size=256)


def test_weights_come_from_the_seed():
    a, b, c = build_model(seed=1), build_model(seed=1), build_model(seed=2)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)


def test_bf16_model_gives_fp32_logits_close_to_fp32_model():
    ids = list(range(40, 60))
    ref = engine_logits(build_model(seed=0), ids, split=20)
    got = engine_logits(build_model(seed=0, dtype=torch.bfloat16), ids, split=20)
    assert got.dtype == torch.float32
    assert ((got - ref).norm() / ref.norm()) < 0.02
    assert torch.equal(got.argmax(-1), ref.argmax(-1))
