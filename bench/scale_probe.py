"""The softmax-scale probe: an opt-in head written into a circuit model (`kdtree.engine.model.weights`)
whose output depends smoothly and strongly on the softmax scale, read by the lm_head so that some
greedy decisions hinge on it. A workload of the token-exact measurements (`kdtree.bench.token_probe`):
a kernel with a wrong scale changes tokens on such a model."""

from __future__ import annotations

import math

import torch

from kdtree.engine.model.config import ModelConfig
from kdtree.engine.model.weights import Layout, head_rows, residual_scale_at

PROBE_DIMS = 64  # residual dims (taken from R) and latent dims the probe's value spreads over
PROBE_SOFTNESS = 2.0  # std of the probe head's scores in softmax units: soft, so the scale matters
PROBE_GAIN = 1.0  # the probe's logit spread as a fraction of logit_scale


class ProbeLayout:
    """The probe's dims: Z (one residual dim: the token's salience), D (residual dims the probe
    head writes, the last `PROBE_DIMS` of R) and the latent dims of the last layer it uses."""

    def __init__(self, cfg: ModelConfig):
        lay = Layout(cfg)
        m = PROBE_DIMS
        if lay.R.stop - lay.R.start < m + 8 or cfg.kv_lora_rank < 2 * cfg.code_dim + m or cfg.num_heads < 2 \
                or cfg.v_head_dim < m:
            raise ValueError(f"add_scale_probe needs R >= {m + 8} dims, kv_lora_rank >= 2 code_dim + {m}, "
                             f"v_head_dim >= {m} and 2 heads; {cfg} has not")
        self.D = slice(cfg.hidden_size - m, cfg.hidden_size)
        self.Z = cfg.hidden_size - m - 1
        self.R = slice(lay.R.start, self.Z)
        self.latent = slice(2 * cfg.code_dim, 2 * cfg.code_dim + m)


def add_scale_probe(model: torch.nn.Module, seed: int) -> None:
    """Give a circuit model (`init_weights`, fp32 on the CPU) a head whose output depends smoothly
    and strongly on the softmax scale, read by the lm_head so that some greedy decisions hinge on it.

    Every token gets a salience ``z ~ N(0, 1)`` (residual dim Z). The last layer's head 1 scores
    each visible key by ``PROBE_SOFTNESS * z_key`` softmax units (a constant query: no position,
    no token identity) and returns ``E_p[z] * v`` over ``PROBE_DIMS`` latent dims (``v`` a fixed
    random vector of entries +-[0.5, 1.5], so the dims round independently); o_proj copies it into
    residual dims D, and the lm_head adds ``PROBE_GAIN * logit_scale * c_y * (E_p[z] - mean)`` to
    each token y's logit (``c_y ~ N(0, 1)``, a matched readout of D; ``mean`` measured on a random
    prompt). ``d E_p[z] / d log(sm_scale) = PROBE_SOFTNESS * Var_p(z)``, 0.3-1 on contexts of
    5-80 keys, against a spread of E_p[z] of ~0.5: a 2 % scale error moves a decision's margin by
    ~0.35 logits (median), while 1-ulp bf16 noise on every attention output of the model moves it
    by ~0.02 (fp32 model) to ~0.05 (bf16 model), medians measured on CPU over 1024 tree nodes;
    deeper contexts (more keys) are more sensitive. Most greedy decisions have margins of a few
    logits; per sign about 1 % (fp32) or 0.3 % (bf16, trees of 1024 nodes) of them lie between 4x
    the noise and what a 2 % scale error shifts: the phase-1 token-exact gate screens for them.
    Nothing else writes Z or D. Drawn from ``seed`` apart from `init_weights`: the circuit's own
    weights stay those of the plain model, which this function is never applied to by default.
    """
    cfg: ModelConfig = model.config
    lay, pl = Layout(cfg), ProbeLayout(cfg)
    gen = torch.Generator().manual_seed(int(seed) ^ 0x5CA1E)
    d, m = cfg.hidden_size, PROBE_DIMS
    with torch.no_grad():
        emb = model.embed_tokens.weight
        r_sq = emb[:, lay.R].pow(2).sum(-1, keepdim=True)
        salience = torch.randn(cfg.vocab_size, generator=gen)
        z_amp = math.sqrt(float(r_sq.mean()) / (lay.R.stop - lay.R.start))  # an R dim's typical size
        emb[:, pl.D] = 0
        emb[:, pl.Z] = salience * z_amp
        kept = emb[:, pl.R]
        kept.mul_(torch.sqrt((r_sq - emb[:, pl.Z:pl.Z + 1].pow(2)).clamp_min(0) / kept.pow(2).sum(-1, keepdim=True)))
        for layer in model.layers:
            layer.self_attn.o_proj.weight[pl.Z] = 0
            layer.self_attn.o_proj.weight[pl.D] = 0
            layer.mlp.down_proj.weight[pl.Z] = 0
            layer.mlp.down_proj.weight[pl.D] = 0
        scale = residual_scale_at(model, cfg.num_layers - 1, gen)
        v = torch.rand(m, generator=gen) + 0.5
        v *= torch.where(torch.rand(m, generator=gen) < 0.5, -1.0, 1.0)
        attn = model.layers[-1].self_attn
        q_nope, q_rope, uk, uv = head_rows(cfg, 1)
        q = attn.q_proj.weight
        q[q_nope] = 0
        q[q_rope] = 0
        const = math.sqrt(d / 8)
        q[q_nope.start, lay.const] = PROBE_SOFTNESS / (cfg.sm_scale * const * scale)
        kv_a = attn.kv_a_proj_with_mqa.weight
        kv_a[pl.latent] = 0
        kv_a[pl.latent, pl.Z] = v / (z_amp * scale)  # latent dims = z * v (before the latent norm)
        kv_b = attn.kv_b_proj.weight
        kv_b[uk] = 0
        kv_b[uv] = 0
        kv_b[uk.start, pl.latent] = v / v.pow(2).sum()  # score = z_key, times the query's softness
        kv_b[uv.start + torch.arange(m), torch.arange(pl.latent.start, pl.latent.stop)] = 1.0
        o = attn.o_proj.weight
        o[:, cfg.v_head_dim: 2 * cfg.v_head_dim] = 0
        o[torch.arange(pl.D.start, pl.D.stop), cfg.v_head_dim + torch.arange(m)] = 1.0
        mean_e, final_scale = _probe_stats(model, cfg, pl, v, gen)
        readout = torch.randn(cfg.vocab_size, generator=gen) * (PROBE_GAIN * cfg.logit_scale)
        head = model.lm_head.weight
        head[:, pl.D] = readout[:, None] * (v / (v.pow(2).sum() * final_scale))[None, :]
        head[:, lay.const] -= readout * mean_e / (const * final_scale)  # centred: c_y * (E_p[z] - mean)


def _probe_stats(model, cfg: ModelConfig, pl: ProbeLayout, v: torch.Tensor, gen: torch.Generator,
                 tokens: int = 96) -> tuple[float, float]:
    """(mean E_p[z] the probe head writes, mean 1/RMS entering the final norm) over a random prompt."""
    from kdtree.engine.decode.backends import TorchBackend  # noqa: PLC0415 - avoid an import cycle
    from kdtree.engine.kv.kv_pool import KVPool  # noqa: PLC0415
    from kdtree.engine.decode.metadata import extend_metadata  # noqa: PLC0415

    ids = torch.randint(0, cfg.vocab_size, (tokens,), generator=gen)
    seen = {}
    hooks = [model.layers[-1].self_attn.register_forward_hook(
                 lambda mod, args, out: seen.__setitem__("e", out[:, pl.D] @ v / v.pow(2).sum())),
             model.norm.register_forward_hook(
                 lambda mod, args, out: seen.__setitem__("rms", args[0].pow(2).mean(-1).rsqrt()))]
    try:
        pool = KVPool(cfg.num_layers, tokens)
        slots = pool.alloc(tokens)
        model(ids, torch.arange(tokens), slots, pool.kv, TorchBackend(), extend_metadata([[]], [slots.tolist()]))
    finally:
        for h in hooks:
            h.remove()
    return float(seen["e"][8:].mean()), float(seen["rms"].mean())
