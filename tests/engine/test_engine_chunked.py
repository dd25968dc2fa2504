"""Prefill in bounded memory: chain-tree chunks equal one causal pass; the device slot mirror."""

from __future__ import annotations

import random

import pytest
import torch

from kdtree.engine import build_model, generate, preset
from kdtree.engine.decode.backends import dense_attention, get_backend
from kdtree.engine.decode.chunked import chain_chunks, chain_mask
from kdtree.engine.kv.kv_pool import KVPool
from kdtree.engine.decode.metadata import extend_metadata
from kdtree.engine.kv.slot_mirror import SlotMirror
from kdtree.kernels.masks import tree_mask_from_parents

SCALE = 1 / 192 ** 0.5


def test_chain_mask_rows_are_packed_chains():
    mask = chain_mask("cpu")
    for n in (1, 31, 32, 33, 100, 1024):
        expected = tree_mask_from_parents(list(range(-1, n - 1)))
        assert torch.equal(mask[:n, : expected.shape[1]], expected)


@pytest.mark.slow
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_chunked_prefill_equals_one_dense_causal_pass(rows):
    rng = random.Random(rows)
    prefix = [rng.sample(range(500, 900), n) for n in (0, 13, 40)]
    new = [list(range(b * 100, b * 100 + n)) for b, n in enumerate((70, 5, 33))]
    meta = extend_metadata(prefix, new)
    gen = torch.Generator().manual_seed(rows)
    q = torch.randn(sum(map(len, new)), 2, 576, generator=gen)
    kv = torch.randn(900, 576, generator=gen)
    whole = dense_attention(q, kv, meta, SCALE)
    chunks = list(chain_chunks(meta, rows))
    assert all(max(c.meta.qo_lens) <= rows for c in chunks)
    out = torch.empty_like(whole)
    for c in chunks:
        idx = torch.arange(c.row_start, c.row_start + c.num_rows) if c.rows is None else c.rows
        out[idx] = dense_attention(q[idx].contiguous(), kv, c.meta, SCALE)
    torch.testing.assert_close(out, whole, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(get_backend("reference").forward(q, kv, meta, SCALE), whole, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_model_level_prefill_chunks_give_the_same_tokens(tiny_model):
    prompts = [[(5 * i + b) % 1000 for i in range(n)] for b, n in enumerate((300, 41, 7))]
    one = generate(prompts, model=tiny_model, drafter="none", max_new_tokens=4, prefill_chunk=4096)
    many = generate(prompts, model=tiny_model, drafter="ngram", budget=8, max_new_tokens=4, prefill_chunk=64)
    assert many.tokens == one.tokens


def test_slot_mirror_uploads_only_new_slots_and_catches_rewrites():
    pool = KVPool(1, 64)
    mirror = SlotMirror(pool, "cpu")
    pool.add_request(0)
    pool.append(0, pool.alloc(10))
    assert mirror.prefix(0).tolist() == pool.slots(0) and mirror.uploaded == 10
    pool.append(0, pool.alloc(3))
    assert mirror.prefix(0).tolist() == pool.slots(0) and mirror.uploaded == 13
    src = pool.slots(0)[2:4]
    pool.relocate(src, [s for s in range(64) if not pool.allocator.is_allocated(s)][:2])
    assert mirror.prefix(0).tolist() == pool.slots(0), "a relocation must not leave the mirror stale"
    assert mirror.uploaded == 26
    with pytest.raises(ValueError, match="not in the pool"):
        mirror.prefix(5)


@pytest.mark.slow
def test_long_prompts_need_no_dense_score_matrix(monkeypatch):
    """A 3000-token prompt on the torch backend: no chunk holds more scores than the dense budget."""
    import kdtree.engine.decode.backends as backends

    seen = []
    real = backends._dense_chunk

    def spy(q, kv_cache, meta, b0, b1, sm_scale, tree_rows, probs_hook=None):
        seen.append(q.shape[1] * max(meta.qo_lens[b0:b1]) * max(meta.kv_lens[b0:b1]) * (b1 - b0))
        return real(q, kv_cache, meta, b0, b1, sm_scale, tree_rows, probs_hook)

    monkeypatch.setattr(backends, "_dense_chunk", spy)
    monkeypatch.setattr(backends, "_DENSE_ELEMENT_BUDGET", 1 << 20)
    model = build_model(preset("tiny-long").model_copy(update={"num_layers": 2}))
    generate([[i % 900 for i in range(3000)]], model=model, drafter="none", max_new_tokens=1)
    assert seen and max(seen) <= 1 << 20
