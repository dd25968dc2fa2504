"""The verify graph's pieces on the CPU: buckets, buffer sizes, the device mask, the staging vector
and the captured body (run eagerly) against the engine's eager verify step. Capture itself is in
test_engine_graph_gpu.py."""

from __future__ import annotations

import random

import pytest
import torch

from kdtree.engine import TokenTree
from kdtree.engine.decode.backends import AttentionBackend, get_backend
from kdtree.engine.decode.graph_capture import (
    MIN_CONTEXT, Bucket, choose_bucket, context_bucket, doubling_rounds, graph_buffer_bytes,
    sglang_verify_mask_bytes, stage_values, tree_mask_from_parent_rows, verify_body,
)
from kdtree.engine.decode.speculative import Runner
from kdtree.bench.sglang_batches import random_parents
from kdtree.kernels import pack_tree_masks
from kdtree.kernels.reference import tree_verify_mla_reference


@pytest.mark.parametrize("sizes,shape", [([1], "random"), ([5, 1, 7], "random"), ([33, 64], "chain"),
                                         ([100, 3], "random"), ([64], "star"), ([1024], "chain")])
def test_device_mask_equals_the_host_packed_mask(sizes, shape):
    rng = random.Random(len(sizes) * 31 + sizes[0])
    parents = [random_parents(rng, n, shape) for n in sizes]
    tree = max(sizes)
    rows, parent_row, node = 0, [], []
    for par in parents:
        parent_row += [rows + (p if p >= 0 else t) for t, p in enumerate(par)]
        node += list(range(len(par)))
        rows += len(par)
    words = (tree + 31) // 32
    got = tree_mask_from_parent_rows(torch.tensor(parent_row), torch.tensor(node), words, doubling_rounds(tree))
    want = pack_tree_masks(parents)
    assert got.dtype == torch.int32 and torch.equal(got[:, : want.shape[1]], want)


def test_too_few_doubling_rounds_miss_deep_ancestors():
    # the gate against a frozen "depth" would need this: a chain of 9 needs ceil(log2 9) = 4 rounds
    par = random_parents(random.Random(0), 9, "chain")
    rows = torch.tensor([p if p >= 0 else 0 for p in par])
    short = tree_mask_from_parent_rows(rows, torch.arange(9), 1, doubling_rounds(9) - 1)
    assert not torch.equal(short, pack_tree_masks([par]))


def test_buckets_round_up_and_refuse_what_does_not_fit():
    assert choose_bucket(3, 17, 5000, 131072) == Bucket(4, 32, 8192)
    assert choose_bucket(1, 1, 0, 131072) == Bucket(1, 4, MIN_CONTEXT)
    assert choose_bucket(33, 4, 10, 131072) is None  # more requests than the largest bucket
    assert choose_bucket(1, 1025, 10, 131072) is None
    assert choose_bucket(1, 4, 200000, 131072) is None
    assert context_bucket(40000, 40960) == 40960  # capped at the model's positions


def test_graph_buffers_are_sized_by_tokens_and_tree_words_not_t_times_l():
    small, long = Bucket(8, 64, 4096), Bucket(8, 64, 131072)
    growth = graph_buffer_bytes(long) - graph_buffer_bytes(small)
    assert growth == 4 * 8 * (131072 - 4096)  # int32 kv_indices only: 4 bytes per context token
    ratio = sglang_verify_mask_bytes(8, 64, 131072) / graph_buffer_bytes(long)
    assert 15 < ratio < 17  # N / 4 for N = 64: a T x L mask against one int32 per token
    assert sglang_verify_mask_bytes(1, 512, 131072) / graph_buffer_bytes(Bucket(1, 512, 131072)) > 100


def test_stage_values_lay_out_rows_and_padding():
    trees = [TokenTree([5, 6, 7], [-1, 0, 0]), TokenTree([9], [-1])]
    bucket = Bucket(4, 4, 8)
    values, starts = stage_values(bucket, [2, 0], trees, [[10, 11, 12], [13]], scratch_slot=99)
    r = bucket.rows
    ids, pos, slots, parent_row, node, kv_pos = (values[i * r:(i + 1) * r] for i in range(6))
    qo, kv = values[6 * r: 6 * r + 5], values[6 * r + 5:]
    assert ids[:4] == [5, 6, 7, 9] and set(ids[4:]) == {0}
    assert pos[:4] == [2, 3, 3, 0] and slots[:4] == [10, 11, 12, 13] and set(slots[4:]) == {99}
    assert parent_row[:4] == [0, 0, 0, 3] and parent_row[4:] == list(range(4, r))
    assert node[:4] == [0, 1, 2, 0] and kv_pos[:4] == [2, 3, 4, 5] and set(kv_pos[4:]) == {bucket.kv_capacity - 1}
    assert qo == [0, 3, 4, 4, 4] and kv == [0, 5, 6, 6, 6] and starts == [0, 5]


class PaddedReference(AttentionBackend):
    """The oracle per request with rows, zeros elsewhere: the kernel's behaviour on padded buffers."""

    name = "padded-reference"

    def forward_verify(self, q, kv_cache, meta, sm_scale):
        out = torch.zeros(q.shape[0], q.shape[1], 512, dtype=q.dtype)
        qo, kv = meta.qo_indptr.tolist(), meta.kv_indptr.tolist()
        for b in range(len(qo) - 1):
            if qo[b + 1] > qo[b]:
                one = lambda t: torch.tensor(t, dtype=torch.int32)  # noqa: E731
                out[qo[b]: qo[b + 1]] = tree_verify_mla_reference(
                    q[qo[b]: qo[b + 1]].contiguous(), kv_cache, one([0, qo[b + 1] - qo[b]]), one([0, kv[b + 1] - kv[b]]),
                    meta.kv_indices[kv[b]: kv[b + 1]].contiguous(), meta.tree_mask[qo[b]: qo[b + 1]].contiguous(),
                    sm_scale)
        return out

    forward_extend = forward_decode = forward_verify


@pytest.mark.parametrize("lens,sizes,bucket", [([7, 30], [5, 3], Bucket(2, 8, 32)),
                                               ([0, 12, 3], [1, 8, 4], Bucket(4, 8, 16))])
def test_the_body_gives_the_eager_steps_logits(tiny_model, pool_batch, lens, sizes, bucket):
    cfg = tiny_model.config
    pool, requests, trees, tree_slots, scratch = pool_batch(lens, sizes, random.Random(sum(lens)))
    eager = Runner(tiny_model, pool, get_backend("reference")).verify_logits(requests, trees, tree_slots)

    values, starts = stage_values(bucket, lens, trees, tree_slots, scratch)
    stage = torch.tensor(values, dtype=torch.int64)
    kv_indices = torch.zeros(bucket.kv_capacity, dtype=torch.int32)
    for start, b in zip(starts, range(len(lens))):
        kv_indices[start: start + lens[b]] = torch.tensor(pool.slots(b), dtype=torch.int32)
    logits = torch.full((bucket.rows, cfg.vocab_size), float("nan"))
    verify_body(tiny_model, pool.kv, bucket, PaddedReference(), stage, kv_indices, logits)
    n = sum(sizes)
    assert torch.allclose(logits[:n], eager, rtol=1e-4, atol=1e-4)
    assert torch.isfinite(logits).all()  # padded rows too
    pad = logits[n:]
    assert torch.equal(pad, pad[:1].expand_as(pad))  # every padded row is the same row


@pytest.mark.slow
def test_cuda_graph_where_it_cannot_apply_is_a_clear_error(tiny_model):
    from click.testing import CliRunner

    from kdtree.engine import generate
    from kdtree.engine.__main__ import main

    result = CliRunner().invoke(main, ["generate", "--backend", "torch", "--cuda-graph", "--max-new-tokens", "2"])
    assert result.exit_code == 2 and "--backend kernel --device cuda" in result.output
    with pytest.raises(ValueError, match="cuda_graph needs the kernel backend"):
        generate([[1, 2, 3]], model=tiny_model, drafter="ngram", backend="torch", cuda_graph=True, max_new_tokens=2)
    auto = generate([[1, 2, 3]], model=tiny_model, drafter="ngram", backend="torch", max_new_tokens=2,
                    cuda_graph=None)
    assert not auto.cuda_graph and auto.graph_replays == 0  # auto: off where it cannot apply
    ok = CliRunner().invoke(main, ["generate", "--no-cuda-graph", "--max-new-tokens", "2", "--json"])
    assert ok.exit_code == 0 and '"cuda_graph": false' in ok.output
