"""Seeded weights whose greedy decisions keep wide top-1 logit margins, yet depend on the context.

Why: the token-exactness gates compare two bf16 runs on the GPU (different kernels and batch
shapes). Their logits differ by bf16 rounding noise, and greedy decoding diverges wherever the
top-1 and top-2 logits are closer than that. A plain random transformer either lets its context
decide tokens, and then puts ~1-3 % of steps within bf16 noise of a tie, or has margins wide
enough that the context never decides anything, and then a token-exact gate cannot catch a wrong
attention. Measured on CPU: tests/engine/test_margins.py.

How: random seeded weights everywhere, plus a small circuit written into them whose decisions
are discrete. The residual stream (``hidden_size``) is split into subspaces: a constant dim,
``A`` (the token's own code: a random vector of fixed norm per vocab entry), ``B`` (the previous
token's code), ``C`` (a copied code) and ``R`` (everything random reads and writes).

- Layer 0, head 0 attends to the previous position by RoPE alone (query and rope key are fixed
  vectors read off the constant dim, phased so the score peaks at distance 1; the peak stands
  ~20 softmax units above every other distance up to 4096) and copies that token's code into B.
- The last layer's head 0 is an induction head: its score is the equality of the query's code
  with each key's B code (strong) and its A code (half as strong), so it attends to the tokens
  that followed earlier occurrences of the current token, or, when there are none, to
  occurrences of the current token itself (the query's own position among them); it copies the
  attended codes into C. Equal codes score ``|code|^2``, different ones ``|code|^2 / sqrt(code_dim)``
  typically, so matches are clear-cut.
- The lm_head reads ``pi(t)`` from A with weight 1, where ``pi`` is a permutation of short
  cycles (the backbone), and every token ``y`` from ``C - A`` with weight ``copy_vote``: a copy of the
  current token itself cancels, a copied successor ``y`` wins (1.83 vs 1), and an even split
  between two different successors loses to the backbone (0.915 vs 1: the thinnest designed margin). So greedy decoding is
  "continue as the last occurrence of this token did, else follow pi", a prompt-lookup oracle,
  with the top-1 ahead by a sizeable fraction of the logit scale wherever the split is not
  within 1/1.83 of a vote.
- All other heads and the MLPs are random (fan-in scaled) and write only into R with gain
  ``context_gain``; the lm_head reads R with weight ``context_readout``, so every weight moves
  the logits a little (a wrong attention shows up in logits) without deciding near-ties.
- Logits are computed in fp32 (`kdtree.engine.model.model`), so bf16 never rounds logits into ties.

What is left near a tie: code cross-talk (random codes have cosines of std 1/sqrt(code_dim),
which the ``C - A`` readout multiplies by ``copy_vote``) and uneven splits between earlier
occurrences (k of n agreeing, k/n near 1/copy_vote). Measured on CPU (tiny, 3 x 32 prompts x 32
tokens): the smallest top-1 vs top-2 margin is 6-18 bf16 ulps of the top logit (median ~115),
and running the whole model in bf16 moves any step's margin by at most 1/8 of the smallest
margin, so greedy decoding on the oracle and tree speculative decoding on any correct kernel
give the same tokens (on a GPU, phase 2's token_exact gate checks it).
Quirks, all deterministic: position 0 counts as its own predecessor, and a key whose token
repeats its predecessor copies nothing, so such occurrences yield the backbone token.

The circuit needs ``q_lora_rank = None`` and ``num_layers >= 2``; otherwise the heads stay random.
Everything is drawn on the CPU in fp32 from one ``torch.Generator`` and then cast, so a seed gives
the same model on every device and dtype.
"""

from __future__ import annotations

import math

import torch

from kdtree.engine.model.config import ModelConfig

PREV_TOKEN_PAIRS = 8  # rope frequency pairs the previous-token head uses (the 8 fastest)
PREV_TOKEN_PEAK = 150.0  # its softmax score at distance 1 (others: <= ~87 % of it)
MATCH_SCORE = 28.0  # induction score of a B-code match; an A-code match scores half


class Layout:
    """Where the circuit's subspaces live in the residual stream."""

    def __init__(self, cfg: ModelConfig):
        c = cfg.code_dim
        self.const = 0
        self.A = slice(1, 1 + c)
        self.B = slice(1 + c, 1 + 2 * c)
        self.C = slice(1 + 2 * c, 1 + 3 * c)
        self.R = slice(1 + 3 * c, cfg.hidden_size)


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


def _fixed_norm_rows(gen, rows: int, cols: int, sq_norm: float) -> torch.Tensor:
    x = torch.randn(rows, cols, generator=gen)
    return x * (math.sqrt(sq_norm) / x.norm(dim=1, keepdim=True))


def init_weights(model: torch.nn.Module, seed: int) -> None:
    """Fill `model` (an MLAModel, fp32 on the CPU) in place from `seed`, following the design above."""
    cfg: ModelConfig = model.config
    gen = torch.Generator().manual_seed(int(seed))
    lay = Layout(cfg)
    d, c = cfg.hidden_size, cfg.code_dim
    code_sq = d / 4  # |code|^2; the constant holds d/8, R the rest, so an embedding has RMS 1
    const = math.sqrt(d / 8)

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=gen) * std

    with torch.no_grad():
        codes = _fixed_norm_rows(gen, cfg.vocab_size, c, code_sq)
        emb = torch.zeros(cfg.vocab_size, d)
        emb[:, lay.const] = const
        emb[:, lay.A] = codes
        emb[:, lay.R] = _fixed_norm_rows(gen, cfg.vocab_size, lay.R.stop - lay.R.start, d - const ** 2 - code_sq)
        model.embed_tokens.weight.copy_(emb)

        succ = backbone_permutation(cfg, gen)
        head = torch.zeros(cfg.vocab_size, d)
        head[succ, lay.A] = codes
        head[:, lay.A] -= cfg.copy_vote * codes
        head[:, lay.C] = cfg.copy_vote * codes
        head *= cfg.logit_scale / code_sq
        n_r = lay.R.stop - lay.R.start
        head[:, lay.R] = randn(cfg.vocab_size, n_r, std=cfg.context_readout * cfg.logit_scale / math.sqrt(n_r))
        model.lm_head.weight.copy_(head)

        for layer in model.layers:
            _random_layer(layer, cfg, lay, randn)
        circuit = cfg.q_lora_rank is None and cfg.num_layers >= 2
        if circuit:
            _previous_token_head(model.layers[0].self_attn, cfg, lay, const)
        scale = residual_scale_at(model, cfg.num_layers - 1, gen)
        if circuit:
            _induction_head(model.layers[-1].self_attn, cfg, lay, scale)


def _random_layer(layer, cfg: ModelConfig, lay: Layout, randn) -> None:
    d, h, v, g = cfg.hidden_size, cfg.num_heads, cfg.v_head_dim, cfg.context_gain
    attn = layer.self_attn
    if hasattr(attn, "q_proj"):
        attn.q_proj.weight.copy_(randn(*attn.q_proj.weight.shape, std=1 / math.sqrt(d)))
    else:
        attn.q_a_proj.weight.copy_(randn(*attn.q_a_proj.weight.shape, std=1 / math.sqrt(d)))
        attn.q_b_proj.weight.copy_(randn(*attn.q_b_proj.weight.shape, std=1 / math.sqrt(cfg.q_lora_rank)))
    attn.kv_a_proj_with_mqa.weight.copy_(randn(*attn.kv_a_proj_with_mqa.weight.shape, std=1 / math.sqrt(d)))
    attn.kv_b_proj.weight.copy_(randn(*attn.kv_b_proj.weight.shape, std=1 / math.sqrt(cfg.kv_lora_rank)))
    o = torch.zeros_like(attn.o_proj.weight)
    o[lay.R] = randn(lay.R.stop - lay.R.start, h * v, std=g / math.sqrt(h * v))
    attn.o_proj.weight.copy_(o)
    mlp = layer.mlp
    mlp.gate_proj.weight.copy_(randn(*mlp.gate_proj.weight.shape, std=1 / math.sqrt(d)))
    mlp.up_proj.weight.copy_(randn(*mlp.up_proj.weight.shape, std=1 / math.sqrt(d)))
    down = torch.zeros_like(mlp.down_proj.weight)
    down[lay.R] = randn(lay.R.stop - lay.R.start, cfg.intermediate_size, std=g / math.sqrt(cfg.intermediate_size))
    mlp.down_proj.weight.copy_(down)


def head_rows(cfg: ModelConfig, head: int):
    """(nope rows, rope rows) of one head in q_proj, (W_UK rows, W_UV rows) in kv_b_proj."""
    qk = cfg.qk_head_dim
    q_nope = slice(head * qk, head * qk + cfg.qk_nope_head_dim)
    q_rope = slice(head * qk + cfg.qk_nope_head_dim, (head + 1) * qk)
    kv = cfg.qk_nope_head_dim + cfg.v_head_dim
    uk = slice(head * kv, head * kv + cfg.qk_nope_head_dim)
    uv = slice(head * kv + cfg.qk_nope_head_dim, (head + 1) * kv)
    return q_nope, q_rope, uk, uv


def _previous_token_head(attn, cfg: ModelConfig, lay: Layout, const: float) -> None:
    """Layer 0, head 0: attend to position p-1 by RoPE alone, copy its A code (latent dims [0, c)) into B."""
    c, r, half = cfg.code_dim, cfg.kv_lora_rank, cfg.qk_rope_head_dim // 2
    q_nope, q_rope, uk, uv = head_rows(cfg, 0)
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, 2 * half, 2, dtype=torch.float) / (2 * half)))
    amp = math.sqrt(PREV_TOKEN_PEAK / (PREV_TOKEN_PAIRS * cfg.sm_scale))
    q = attn.q_proj.weight
    q[q_nope] = 0
    q[q_rope] = 0
    kv_a = attn.kv_a_proj_with_mqa.weight
    kv_a[r:] = 0  # the shared rope key of layer 0 is the same fixed vector for every token
    for i in range(PREV_TOKEN_PAIRS):
        # query pair = amp * e^{-i theta}, key pair = amp: the score is sum amp^2 cos(theta (p - s - 1))
        q[q_rope.start + i, lay.const] = amp * math.cos(inv_freq[i]) / const
        q[q_rope.start + half + i, lay.const] = -amp * math.sin(inv_freq[i]) / const
        kv_a[r + i, lay.const] = amp / const
    kv_a[:c] = 0
    kv_a[torch.arange(c), torch.arange(lay.A.start, lay.A.stop)] = 1.0  # latent [0, c) = A code
    kv_b = attn.kv_b_proj.weight
    kv_b[uk] = 0
    kv_b[uv] = 0
    kv_b[uv.start + torch.arange(c), torch.arange(c)] = 1.0
    o = attn.o_proj.weight
    o[:, : cfg.v_head_dim] = 0
    o[torch.arange(lay.B.start, lay.B.stop), torch.arange(c)] = 1.0


def _induction_head(attn, cfg: ModelConfig, lay: Layout, scale: float) -> None:
    """Last layer, head 0: score = code(query) . (B code + A code / 2) of each key; copy the key's A code into C.

    `scale` is the typical 1/RMS of this layer's residual input, which the RMSNorm applies to
    the codes; the gains undo it so a B match scores MATCH_SCORE.
    """
    c = cfg.code_dim
    code_sq = cfg.hidden_size / 4
    q_nope, q_rope, uk, uv = head_rows(cfg, 0)
    q = attn.q_proj.weight
    q[q_nope] = 0
    q[q_rope] = 0
    q[q_nope.start + torch.arange(c), torch.arange(lay.A.start, lay.A.stop)] = 1.0 / scale
    kv_a = attn.kv_a_proj_with_mqa.weight
    kv_a[: 2 * c] = 0
    kv_a[torch.arange(c), torch.arange(lay.B.start, lay.B.stop)] = 1.0 / scale  # latent [0, c) = B code
    kv_a[c + torch.arange(c), torch.arange(lay.A.start, lay.A.stop)] = 1.0 / scale  # latent [c, 2c) = A code
    match = MATCH_SCORE / (code_sq * cfg.sm_scale)
    kv_b = attn.kv_b_proj.weight
    kv_b[uk] = 0
    kv_b[uk.start + torch.arange(c), torch.arange(c)] = match
    kv_b[uk.start + torch.arange(c), c + torch.arange(c)] = match / 2
    kv_b[uv] = 0
    kv_b[uv.start + torch.arange(c), c + torch.arange(c)] = 1.0
    o = attn.o_proj.weight
    o[:, : cfg.v_head_dim] = 0
    o[torch.arange(lay.C.start, lay.C.stop), torch.arange(c)] = 1.0


def residual_scale_at(model, layer_index: int, gen: torch.Generator, tokens: int = 96) -> float:
    """Mean 1/RMS of the residual stream entering `layer_index`, over a random prompt (fp32, CPU)."""
    from kdtree.engine.decode.backends import TorchBackend  # noqa: PLC0415 - avoid an import cycle
    from kdtree.engine.kv.kv_pool import KVPool  # noqa: PLC0415
    from kdtree.engine.decode.metadata import extend_metadata  # noqa: PLC0415

    cfg = model.config
    ids = torch.randint(0, cfg.vocab_size, (tokens,), generator=gen)
    seen = []
    hook = model.layers[layer_index].input_layernorm.register_forward_hook(
        lambda mod, args, out: seen.append(args[0].pow(2).mean(-1).rsqrt()))
    try:
        pool = KVPool(cfg.num_layers, tokens)
        slots = pool.alloc(tokens)
        model(ids, torch.arange(tokens), slots, pool.kv, TorchBackend(),
              extend_metadata([[]], [slots.tolist()]), num_layers=layer_index + 1)
    finally:
        hook.remove()
    return float(seen[0].mean())
