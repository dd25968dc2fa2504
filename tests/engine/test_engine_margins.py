"""The margin design (kdtree.engine.model.weights): greedy top-1 logits stand far above bf16 rounding, the
context decides tokens, and bf16 greedy decoding matches fp32 on CPU."""

from __future__ import annotations


import pytest
import torch

from kdtree.engine import build_model, generate, get_backend
from kdtree.engine.kv.kv_pool import KVPool
from kdtree.engine.decode.metadata import extend_metadata
from kdtree.engine.decode.speculative import Runner
from engine_prompts import random_prompts


def teacher_forced_logits(model, seq: list[int]) -> torch.Tensor:
    pool = KVPool(model.config.num_layers, len(seq))
    slots = pool.alloc(len(seq)).tolist()
    return Runner(model, pool, get_backend("torch")).forward(seq, range(len(seq)), slots,
                                                             extend_metadata([[]], [slots]))


def bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """Spacing of bf16 numbers at |x| (8 significant bits)."""
    return torch.exp2(torch.floor(torch.log2(x.abs())) - 7)


@pytest.fixture(scope="module")
def greedy_run(tiny_model):
    prompts = random_prompts(32, seed=11)
    return prompts, generate(prompts, model=tiny_model, max_new_tokens=32).tokens


@pytest.fixture(scope="module")
def step_logits(tiny_model, greedy_run):
    """Per greedy step: (fp32 logits, bf16-model logits) of the 32 x 32 generated tokens."""
    prompts, outputs = greedy_run
    bf16_model = build_model(seed=0, dtype=torch.bfloat16)
    fp32, bf16 = [], []
    for prompt, out in zip(prompts, outputs):
        seq, span = prompt + out, slice(len(prompt) - 1, len(prompt) + len(out) - 1)
        fp32.append(teacher_forced_logits(tiny_model, seq)[span])
        bf16.append(teacher_forced_logits(bf16_model, seq)[span])
    return torch.cat(fp32), torch.cat(bf16), torch.tensor([t for out in outputs for t in out])


@pytest.mark.slow
def test_top1_margins_are_far_above_bf16_rounding(step_logits):
    fp32, _, tokens = step_logits
    assert torch.equal(fp32.argmax(-1), tokens) and tokens.numel() == 32 * 32
    top = fp32.topk(2, dim=-1).values
    ratio = (top[:, 0] - top[:, 1]) / bf16_ulp(top[:, 0])  # margin in bf16 ulps of the top logit
    assert float(ratio.min()) > 4, "some greedy step is within 4 bf16 ulps of a tie"
    assert float(ratio.quantile(0.01)) > 25
    assert float(ratio.median()) > 80


def test_margins_exceed_the_whole_bf16_perturbation(step_logits):
    """Running the entire model in bf16 moves each step's top-1 vs top-2 margin by far less than the margin."""
    fp32, bf16, _ = step_logits
    top2 = fp32.topk(2, dim=-1).indices
    rows = torch.arange(fp32.shape[0])
    margin = fp32[rows, top2[:, 0]] - fp32[rows, top2[:, 1]]
    moved = (bf16[rows, top2[:, 0]] - bf16[rows, top2[:, 1]] - margin).abs()
    assert float(moved.max()) > 0  # bf16 really perturbed something
    assert float(margin.min()) > 4 * float(moved.max())


def test_context_decides_a_share_of_tokens(tiny_model, greedy_run):
    """Tokens are not a fixed function of the previous token: the induction head (attention over the
    whole context) decides some; removing it changes them."""
    prompts, outputs = greedy_run
    ablated = build_model(seed=0)
    ablated.layers[-1].self_attn.o_proj.weight[:, : ablated.config.v_head_dim] = 0
    changed = sum(a != b for a, b in zip(outputs, generate(prompts, model=ablated, max_new_tokens=32).tokens))
    assert changed >= len(prompts) // 4
    # and the same previous token is followed by different tokens in different contexts
    followers: dict[int, set[int]] = {}
    for prompt, out in zip(prompts, outputs):
        seq = prompt + out
        for i in range(len(prompt) - 1, len(seq) - 1):
            followers.setdefault(seq[i], set()).add(seq[i + 1])
    assert sum(len(f) > 1 for f in followers.values()) >= 5


def test_bf16_greedy_matches_fp32_greedy_on_cpu(greedy_run):
    """bf16 vs fp32 is a far larger perturbation than two bf16 GPU runs; tokens still agree."""
    prompts, outputs = greedy_run
    bf16 = generate(prompts[:16], model=build_model(seed=0, dtype=torch.bfloat16), max_new_tokens=32)
    assert bf16.tokens == outputs[:16]


def test_generate_records_each_greedy_tokens_margin_and_runner_up():
    model = build_model(seed=0)
    prompts = random_prompts(3, seed=5, vocab=model.config.vocab_size)
    res = generate(prompts, model=model, backend="torch", max_new_tokens=6, record_margins=True)
    assert [len(m) for m in res.margins] == [len(t) for t in res.tokens] == [6, 6, 6]
    for i, prompt in enumerate(prompts):  # the recorded margin is the teacher-forced logits' top-2 gap
        logits = teacher_forced_logits(model, list(prompt) + res.tokens[i][:-1])[len(prompt) - 1:].float()
        top = logits.topk(2, dim=-1)
        assert res.runner_up[i] == top.indices[:, 1].tolist()
        assert res.margins[i] == pytest.approx((top.values[:, 0] - top.values[:, 1]).tolist(), rel=1e-4, abs=1e-4)
    plain = generate(prompts, model=model, backend="torch", max_new_tokens=6)
    assert plain.margins is None and plain.tokens == res.tokens
    with pytest.raises(ValueError, match="plain greedy"):
        generate(prompts, model=model, drafter="ngram", backend="torch", max_new_tokens=6, record_margins=True)
