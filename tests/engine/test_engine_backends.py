"""Attention backends: torch agrees with the op contract's oracle in every mode; lookup errors are clear."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
import torch

from kdtree.engine.decode.backends import OpBackend, get_backend, known_backends
from kdtree.engine.decode.metadata import decode_metadata, extend_metadata, verify_metadata
from kdtree.bench.sglang_batches import random_parents

SCALE = 1 / 192 ** 0.5


def scattered_slots(rng: random.Random, total: int, pool: int) -> list[list[int]]:
    return rng.sample(range(pool), total)


def make_case(mode: str, seed: int, heads: int = 4):
    rng = random.Random(seed)
    batch = rng.randint(1, 4)
    prefix_lens = [rng.choice([0, 1, rng.randint(2, 60)]) for _ in range(batch)]
    new_lens = [1 if mode == "decode" else rng.randint(1, 40) for _ in range(batch)]
    pool_size = sum(prefix_lens) + sum(new_lens) + 17
    flat = scattered_slots(rng, sum(prefix_lens) + sum(new_lens), pool_size)
    prefix, new, i = [], [], 0
    for p, n in zip(prefix_lens, new_lens):
        prefix.append(flat[i: i + p])
        new.append(flat[i + p: i + p + n])
        i += p + n
    if mode == "extend":
        meta = extend_metadata(prefix, new)
    elif mode == "decode":
        meta = decode_metadata(prefix, [s[0] for s in new])
    else:
        meta = verify_metadata(prefix, new, [random_parents(rng, n) for n in new_lens])
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(new_lens), heads, 576, generator=gen)
    kv = torch.randn(pool_size, 576, generator=gen)
    return q, kv, meta


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["extend", "decode", "verify"])
@pytest.mark.parametrize("seed", range(6))
def test_torch_backend_matches_the_oracle(mode, seed):
    q, kv, meta = make_case(mode, seed)
    ref = get_backend("reference").forward(q, kv, meta, SCALE)
    out = get_backend("torch").forward(q, kv, meta, SCALE)
    assert out.shape == (q.shape[0], q.shape[1], 512)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_verify_mask_hides_siblings_but_not_the_prefix():
    # two children of the root: node 2 must not see node 1, so moving node 1's key changes only node 1
    q, kv, _ = make_case("verify", 0, heads=2)
    meta = verify_metadata([[0, 1, 2]], [[3, 4, 5]], [[-1, 0, 0]])
    q = q[:3].contiguous()
    base = get_backend("torch").forward(q, kv, meta, SCALE)
    kv2 = kv.clone()
    kv2[4] += 3.0
    moved = get_backend("torch").forward(q, kv2, meta, SCALE)
    assert torch.equal(moved[0], base[0]) and torch.equal(moved[2], base[2])
    assert not torch.allclose(moved[1], base[1])
    kv3 = kv.clone()
    kv3[1] += 3.0  # a prefix slot: every node sees it
    prefix_moved = get_backend("torch").forward(q, kv3, meta, SCALE)
    assert all(not torch.allclose(prefix_moved[i], base[i]) for i in range(3))


@pytest.mark.slow
def test_reference_prefill_longer_than_one_tree_runs_in_chunks():
    gen = torch.Generator().manual_seed(1)
    n = 1100  # > 1024 nodes, the op contract's largest tree
    meta = extend_metadata([[1100, 1101]], [list(range(n))])
    q = torch.randn(n, 1, 576, generator=gen)
    kv = torch.randn(n + 2, 576, generator=gen)
    torch.testing.assert_close(get_backend("reference").forward(q, kv, meta, SCALE),
                               get_backend("torch").forward(q, kv, meta, SCALE), rtol=1e-5, atol=1e-5)


def test_torch_backend_chunks_large_batches_identically(monkeypatch):
    import kdtree.engine.decode.backends as backends

    q, kv, meta = make_case("verify", 3)
    whole = backends.dense_attention(q, kv, meta, SCALE)
    monkeypatch.setattr(backends, "_DENSE_ELEMENT_BUDGET", 1)  # one request per chunk
    torch.testing.assert_close(backends.dense_attention(q, kv, meta, SCALE), whole, rtol=1e-6, atol=1e-6)


def test_unknown_backend_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown attention backend 'flash'.*cuda.*reference.*torch.*triton"):
        get_backend("flash")
    assert {"reference", "torch", "cuda", "triton"} <= set(known_backends())


def test_kernel_backends_import_lazily_and_fail_clearly_when_used():
    q, kv, meta = make_case("verify", 2)
    missing = OpBackend("later", "kdtree.kernels.not_written_yet", "tree_verify_mla_later")
    with pytest.raises(RuntimeError, match="'later' needs kdtree.kernels.not_written_yet.tree_verify_mla_later"):
        missing.forward_verify(q, kv, meta, SCALE)
    with pytest.raises(RuntimeError, match="'later' needs"):  # prefill goes through the op too (chains)
        missing.forward_extend(q, kv, extend_metadata([[]], [list(range(q.shape[0]))]), SCALE)
    for name in ("kernel", "cuda", "triton"):
        backend = get_backend(name)  # building one imports nothing
        assert backend.name == name


@pytest.mark.slow
def test_importing_the_engine_imports_no_triton():
    code = "import sys, kdtree.engine; kdtree.engine.get_backend('triton'); print('triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
