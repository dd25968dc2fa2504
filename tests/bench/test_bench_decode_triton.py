"""The Triton backend as SGLang serves it (`kdtree.bench.decode_triton`) on the CPU: the layout it
hands SGLang's kernels (prefix slots compacted, the tree's own slots, the bool verify mask and its
indptr) against one built independently from the trees, for exact metadata and for a graph
bucket's padded metadata; and the backend run through SGLang-signature stand-ins of the two
kernels (reading the layout the way SGLang's kernels read it) against the oracle, eagerly and
inside the graph body (verify and decode modes). With ``KDTREE_TEST_REAL_SGLANG_KERNELS=1`` the
stand-ins are SGLang's real kernels (`test_bench_decode_triton_interpreted` runs this file so, under
Triton's interpreter on the CPU), and phase 2's parity reference call is checked on them too; the GPU
test runs them compiled, eager and captured."""

from __future__ import annotations

import copy
import os
import random

import pytest
import torch

from kdtree.bench.sglang_batches import random_parents
from kdtree.bench.decode_triton import MAX_KV_SPLITS, SGLangTritonBackend, sglang_verify_layout
from kdtree.engine import TokenTree
from kdtree.engine.decode.backends import get_backend
from kdtree.engine.decode.graph_capture import Bucket, bucket_metadata, stage_values, verify_body
from kdtree.engine.decode.metadata import decode_metadata, extend_metadata, verify_metadata
from kdtree.engine.decode.speculative import Runner


def ancestors(parents, t):
    seen = {t}
    while parents[t] >= 0:
        t = parents[t]
        seen.add(t)
    return seen


def expected_mask(prefix_lens, parents_list):
    """SGLang's flattened verify mask, built cell by cell from the trees."""
    cells = []
    for length, par in zip(prefix_lens, parents_list):
        n = len(par)
        for t in range(n):
            anc = ancestors(par, t)
            cells += [True] * length + [s in anc for s in range(n)]
    return torch.tensor(cells, dtype=torch.bool)


def batch(seed, lens, sizes, slots=4096):
    rng = random.Random(seed)
    order = list(range(slots))
    rng.shuffle(order)
    prefixes, tree_slots, parents, at = [], [], [], 0
    for length, size in zip(lens, sizes):
        prefixes.append(order[at: at + length])
        tree_slots.append(order[at + length: at + length + size])
        parents.append(random_parents(rng, size))
        at += length + size
    return prefixes, tree_slots, parents


@pytest.mark.parametrize("lens,sizes", [([5, 0, 40], [3, 1, 7]), ([100], [33]), ([2, 3], [64, 2])])
def test_layout_of_exact_metadata(lens, sizes):
    prefixes, tree_slots, parents = batch(sum(lens), lens, sizes)
    meta = verify_metadata(prefixes, tree_slots, parents)
    lay = sglang_verify_layout(meta, rows=sum(sizes))
    assert lay.prefix_indptr.tolist() == [0] + list(torch.tensor(lens).cumsum(0).tolist())
    assert lay.prefix_indices[: sum(lens)].tolist() == [s for p in prefixes for s in p]
    assert lay.tree_slots.tolist() == [s for own in tree_slots for s in own]
    want = expected_mask(lens, parents)
    n = lay.mask_indptr[-1].item()
    assert n == want.numel() and torch.equal(lay.custom_mask[:n], want)
    sizes_per = [t * (length + t) for length, t in zip(lens, sizes)]
    assert lay.mask_indptr.tolist() == [0] + list(torch.tensor(sizes_per).cumsum(0).tolist())


def test_layout_of_a_graph_buckets_padded_metadata():
    lens, sizes = [7, 30], [5, 3]
    prefixes, tree_slots, parents = batch(3, lens, sizes, slots=512)
    trees = [TokenTree(list(range(len(p))), p) for p in parents]
    bucket = Bucket(4, 8, 32)
    values, starts = stage_values(bucket, lens, trees, tree_slots, scratch_slot=511)
    kv_indices = torch.zeros(bucket.kv_capacity, dtype=torch.int32)
    for start, prefix in zip(starts, prefixes):
        kv_indices[start: start + len(prefix)] = torch.tensor(prefix, dtype=torch.int32)
    _, _, _, meta = bucket_metadata(bucket, torch.tensor(values), kv_indices)
    lay = sglang_verify_layout(meta, rows=bucket.rows)
    # the static buffer is SGLang's preallocated size: batch x tree x (context + tree), plus one junk cell
    assert lay.custom_mask.numel() == bucket.batch * bucket.tree * (bucket.context + bucket.tree) + 1
    assert lay.prefix_indptr.tolist() == [0, 7, 37, 37, 37]
    assert lay.prefix_indices[:37].tolist() == prefixes[0] + prefixes[1]
    assert lay.tree_slots[: sum(sizes)].tolist() == tree_slots[0] + tree_slots[1]
    want = expected_mask(lens, parents)
    assert lay.mask_indptr.tolist()[-1] == want.numel()
    assert torch.equal(lay.custom_mask[: want.numel()], want)


# -- stand-ins with SGLang's signatures ------------------------------------------------------------
def _softmax_pv(q, keys, values, visible, scale):
    scores = torch.einsum("thd,kd->thk", q.double(), keys.double()) * scale
    scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    return torch.einsum("thk,kd->thd", torch.softmax(scores, -1), values.double())


def fake_extend(q, k_ext, v_ext, o, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices, custom_mask, is_causal,
                mask_indptr, max_len_extend, k_scale, v_scale, sm_scale):
    """extend_attention_fwd's reading of its inputs: prefix keys through kv_indptr/kv_indices, the
    extend keys from k_ext, tree cells at mask_start + row * (L + T) + L + col (prefix cells skipped)."""
    qo, kv = qo_indptr.tolist(), kv_indptr.tolist()
    for b in range(len(qo) - 1):
        t = qo[b + 1] - qo[b]
        if t == 0:
            continue
        length = kv[b + 1] - kv[b]
        idx = kv_indices[kv[b]: kv[b + 1]].long()
        keys = torch.cat([k_buf[idx, 0], k_ext[qo[b]: qo[b + 1], 0]])
        values = torch.cat([v_buf[idx, 0], v_ext[qo[b]: qo[b + 1], 0]])
        if custom_mask is not None:
            start = int(mask_indptr[b])
            tree = torch.stack([custom_mask[start + r * (length + t) + length: start + r * (length + t) + length + t]
                                for r in range(t)])
        else:
            tree = torch.ones(t, t, dtype=torch.bool).tril()
        visible = torch.cat([torch.ones(t, length, dtype=torch.bool), tree], dim=1)
        o[qo[b]: qo[b + 1]] = _softmax_pv(q[qo[b]: qo[b + 1]], keys, values, visible, sm_scale).to(o.dtype)


def fake_decode(q, k_buf, v_buf, o, kv_indptr, kv_indices, attn_logits, attn_lse, num_kv_splits, max_kv_splits,
                sm_scale, k_scale, v_scale):
    """decode_attention_fwd: row b attends to request b's keys; a request with none gets NaN."""
    assert attn_logits.shape[2] == max_kv_splits == MAX_KV_SPLITS and num_kv_splits.shape[0] == q.shape[0]
    kv = kv_indptr.tolist()
    for b in range(q.shape[0]):
        idx = kv_indices[kv[b]: kv[b + 1]].long()
        if idx.numel() == 0:
            o[b] = float("nan")
            continue
        visible = torch.ones(1, idx.numel(), dtype=torch.bool)
        o[b] = _softmax_pv(q[b: b + 1], k_buf[idx, 0], v_buf[idx, 0], visible, sm_scale)[0].to(o.dtype)


REAL_KERNELS = os.environ.get("KDTREE_TEST_REAL_SGLANG_KERNELS") == "1"  # the interpreted run (module docstring)
TOL = 1e-5 if REAL_KERNELS else 1e-9  # SGLang's decode kernel keeps its split partials in fp32


def stand_in():
    if REAL_KERNELS:
        return SGLangTritonBackend()
    return SGLangTritonBackend(kernels=(fake_extend, fake_decode))


def pool_with(seed, slots=600, heads=4):
    gen = torch.Generator().manual_seed(seed)
    kv = torch.randn(slots, 576, generator=gen, dtype=torch.float64)
    return kv


@pytest.mark.parametrize("mode", ["verify", "decode", "extend"])
def test_the_backend_through_sglang_signatures_matches_the_oracle(mode):
    lens, sizes = [9, 0, 41], [4, 1, 6]
    prefixes, tree_slots, parents = batch(7, lens, sizes, slots=600)
    if mode == "verify":
        meta = verify_metadata(prefixes, tree_slots, parents)
    elif mode == "decode":
        meta = decode_metadata(prefixes, [own[0] for own in tree_slots])
    else:
        meta = extend_metadata(prefixes, tree_slots)
    kv = pool_with(1)
    rows = sum(meta.qo_lens)
    q = torch.randn(rows, 4, 576, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    want = get_backend("reference").forward(q, kv, meta, 0.05)
    got = stand_in().forward(q, kv, meta, 0.05)
    assert torch.allclose(got, want, rtol=TOL, atol=TOL)


@pytest.mark.parametrize("mode", ["verify", "decode"])
def test_the_graph_body_on_the_backend_gives_the_eager_logits(tiny_model, pool_batch, mode):
    cfg = tiny_model.config
    lens, sizes = ([7, 30], [5, 3]) if mode == "verify" else ([7, 30], [1, 1])
    pool, requests, trees, tree_slots, scratch = pool_batch(lens, sizes, random.Random(11))
    runner = Runner(tiny_model, pool, get_backend("reference"))
    layers = 2 if mode == "decode" else None
    if mode == "verify":
        eager = runner.verify_logits(requests, trees, tree_slots)
    else:
        eager = runner.draft_logits([runner.prefix(r.rid) for r in requests], [r.pending for r in requests],
                                    [own[0] for own in tree_slots], layers)
    bucket = Bucket(4, 8 if mode == "verify" else 1, 32)
    values, starts = stage_values(bucket, lens, trees, tree_slots, scratch)
    kv_indices = torch.zeros(bucket.kv_capacity, dtype=torch.int32)
    for start, b in zip(starts, range(len(lens))):
        kv_indices[start: start + lens[b]] = torch.tensor(pool.slots(b), dtype=torch.int32)
    logits = torch.full((bucket.rows, cfg.vocab_size), float("nan"))
    verify_body(tiny_model, pool.kv, bucket, stand_in(), torch.tensor(values), kv_indices, logits,
                num_layers=layers, mode=mode)
    n = sum(sizes)
    assert torch.allclose(logits[:n], eager, rtol=1e-4, atol=1e-4)
    assert torch.isfinite(logits).all()  # padded rows too: requests without keys get zeros, not NaN


def test_the_layout_is_converted_once_per_metadata():
    prefixes, tree_slots, parents = batch(5, [10, 3], [4, 2])
    meta = verify_metadata(prefixes, tree_slots, parents)
    backend = stand_in()
    first = backend.layout(meta, 6, True)
    assert backend.layout(meta, 6, True) is first  # every layer of a step shares it
    other = verify_metadata(prefixes, tree_slots, parents)
    assert backend.layout(other, 6, True) is not first


def test_missing_sglang_kernels_are_a_clear_error(monkeypatch):
    import kdtree.bench.decode_triton as dt

    def fail():
        raise ImportError("sglang is not installed")

    monkeypatch.setattr(dt, "load_kernels", fail)
    with pytest.raises(RuntimeError, match="SGLang 0.5.23's Triton kernels"):
        SGLangTritonBackend().kernels()
    with pytest.raises(ValueError, match="max_kv_splits"):
        SGLangTritonBackend(max_kv_splits=0)


@pytest.mark.gpu
def test_sglang_kernels_eager_and_captured_match_the_oracle():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from kdtree.bench.decode_triton import load_kernels

    try:
        load_kernels()
    except ImportError as err:
        pytest.skip(f"SGLang's Triton kernels are not loadable here: {err}")
    lens, sizes = [900, 0, 3000], [17, 1, 64]
    prefixes, tree_slots, parents = batch(3, lens, sizes, slots=8192)
    kv = torch.randn(8192, 576, device="cuda", dtype=torch.bfloat16)
    for mode in ("verify", "decode"):
        if mode == "verify":
            meta = verify_metadata(prefixes, tree_slots, parents, "cuda")
        else:
            meta = decode_metadata(prefixes, [own[0] for own in tree_slots], "cuda")
        q = torch.randn(sum(meta.qo_lens), 16, 576, device="cuda", dtype=torch.bfloat16)
        want = get_backend("reference").forward(q, kv, meta, 0.05).float()
        backend = SGLangTritonBackend()
        got = backend.forward(q, kv, meta, 0.05).float()
        assert (got - want).norm() / want.norm() < 1e-2, mode
        graph = torch.cuda.CUDAGraph()
        fresh = SGLangTritonBackend()
        fresh.forward(q, kv, meta, 0.05)
        with torch.cuda.graph(graph):  # a new metadata object: the layout is built inside capture, as in a bucket
            out = fresh.forward(q, kv, copy.copy(meta), 0.05)
        q.normal_()
        graph.replay()
        want = get_backend("reference").forward(q, kv, meta, 0.05).float()
        assert (out.float() - want).norm() / want.norm() < 1e-2, f"{mode} replay"


def test_both_sglang_kernels_load_from_a_trimmed_copy(tmp_path, monkeypatch):
    """The decode kernel loads the way the extend kernel does (`load_kernels`): a copy of the
    wheel's kernel files without package __init__s, its platform predicates from our shim."""
    import sys

    from kdtree.bench.decode_triton import load_kernels

    attention = tmp_path / "sglang" / "kernels" / "ops" / "attention"
    attention.mkdir(parents=True)
    (attention / "extend_attention.py").write_text("from sglang.srt.utils import is_cuda\n"
                                                   "def extend_attention_fwd():\n    return 'extend'\n")
    (attention / "score_mod.py").write_text("def unpack_aux_tensors(*a):\n    return None\n")
    (attention / "decode_attention.py").write_text(
        "from sglang.kernels.ops.attention.score_mod import unpack_aux_tensors\n"
        "from sglang.srt.environ import envs\n"
        "from sglang.srt.utils import get_device_core_count, is_gfx95_supported, is_gfx1250_supported, is_hip\n"
        "def decode_attention_fwd():\n    return ('decode', envs, is_hip())\n")
    (tmp_path / "sglang" / "srt").mkdir()
    (tmp_path / "sglang" / "srt" / "environ.py").write_text("envs = 'environ'\n")
    for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    extend, decode, how = load_kernels()
    assert extend() == "extend" and decode() == ("decode", "environ", False)
    assert "package __init__s skipped" in how
    assert not [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]


@pytest.mark.skipif(not REAL_KERNELS, reason="runs SGLang's own extend kernel: test_bench_decode_triton_interpreted "
                                              "runs it here under Triton's interpreter, tests/integrations/"
                                              "test_sglang_gpu.py compiled on a GPU")
@pytest.mark.parametrize("lens,n,kind,mask_dtype,closed,padded", [
    ([40, 3], 8, "random", torch.bool, True, 0),
    ([0, 1, 90], 6, "chain", torch.uint8, True, 0),
    ([25, 60], 7, "random", torch.bool, False, 2),
])
def test_the_parity_gates_sglang_call_reads_sglangs_layout(lens, n, kind, mask_dtype, closed, padded):
    """Phase 2's parity reference (`sglang_triton_verify`, the call SGLang's Triton backend makes for
    target verify) on SGLang's real kernel equals attention read straight off SGLang's layout."""
    from kdtree.bench.decode_triton import load_kernels
    from kdtree.bench.sglang_batches import make_verify_batch, sglang_layout_reference
    from kdtree.bench.sglang_verify import sglang_triton_verify

    fx = make_verify_batch(4, lens, n, seed=sum(lens) + n, dtype=torch.float32, mask_dtype=mask_dtype, kind=kind,
                           ancestor_closed=closed, padded=padded)
    sg_fx = dict(fx, pool=fx["pool"].clone())
    sg_fx["pool"][fx["out_cache_loc"]] = fx["k_extend"]
    extend, _, _ = load_kernels()
    real = fx["real_requests"] * n
    got = sglang_triton_verify(sg_fx, extend)[:real].double()
    want = sglang_layout_reference(fx)[:real].double()
    assert (got - want).norm() / want.norm() < 1e-5
