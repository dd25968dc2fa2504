"""Shared pytest fixtures (the tiny engine model, a pool holding a verify batch, FlashMLA's stand-in,
a child process under Triton's interpreter) and the GPU skip marker."""

from __future__ import annotations

import pytest

from kdtree.checkout import unshadow

# `python -m pytest` from the repository root puts the root on sys.path, where our kernels/ folder
# would shadow PyPI's `kernels` that transformers >= 5.25 imports (the oracle tests need it).
unshadow()


def _cuda_reason():
    try:
        import torch
    except Exception:  # pragma: no cover - torch is a test dependency
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine (torch.cuda.is_available() is False)"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _cuda_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def fake_flash_mla(monkeypatch):
    """``install(wrong=False)`` puts a CPU stand-in for the ``flash_mla`` module (sgl-flash-mla
    1.0.0's API: get_mla_metadata, flash_mla_with_kvcache with use_legacy=True for dense decode,
    has_legacy) into sys.modules: causal attention over the paged cache in fp32 torch, holding the
    call to the layout FlashMLA documents. ``wrong=True`` returns 1.5x the right output.
    Returns the module; its ``calls`` counts the decode calls."""
    import sys
    import types

    import torch

    def install(wrong: bool = False):
        module = types.ModuleType("flash_mla")
        module.__version__ = "1.0.0"
        module.calls = 0

        def get_mla_metadata(*args, **kwargs):
            return types.SimpleNamespace(tile_scheduler_metadata=None, num_splits=None), None

        def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                                   num_splits=None, softmax_scale=None, causal=False, use_legacy=False, **kwargs):
            assert use_legacy and causal and head_dim_v == 512 and num_splits is None
            assert q.dim() == 4 and q.shape[-1] == 576 and q.dtype == torch.bfloat16
            assert k_cache.dim() == 4 and k_cache.shape[1] == 64 and k_cache.shape[2] == 1 and k_cache.shape[3] == 576
            assert block_table.dtype == torch.int32 and cache_seqlens.dtype == torch.int32
            module.calls += 1
            B, T, H, _ = q.shape
            out = torch.empty(B, T, H, 512, dtype=q.dtype)
            lse = torch.empty(B, H, T, dtype=torch.float32)
            for b in range(B):
                n = int(cache_seqlens[b])
                keys = k_cache[block_table[b].long()].reshape(-1, 576)[:n].float()
                scores = torch.einsum("thd,nd->thn", q[b].float(), keys) * softmax_scale
                visible = torch.arange(n)[None, :] <= (n - T + torch.arange(T))[:, None]
                scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
                lse[b] = torch.logsumexp(scores, -1).transpose(0, 1)
                out[b] = (torch.softmax(scores, -1) @ keys[:, :512] * (1.5 if wrong else 1.0)).to(q.dtype)
            return out, lse

        module.get_mla_metadata = get_mla_metadata
        module.flash_mla_with_kvcache = flash_mla_with_kvcache
        module.has_legacy = lambda: True
        monkeypatch.setitem(sys.modules, "flash_mla", module)
        return module

    return install


@pytest.fixture
def run_interpreted():
    """``run(args, env=None, timeout=600)``: ``python ARGS`` in a child process from the repository
    root with ``TRITON_INTERPRET=1`` (and ``env``) set before it imports anything; its
    CompletedProcess, output as text. Whether triton interprets a kernel is decided when triton
    builds it, and the variable leaks into everything after it: a child keeps this process as it is."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]

    def run(args, env=None, timeout=600):
        child_env = {**os.environ, "TRITON_INTERPRET": "1", **(env or {})}
        return subprocess.run([sys.executable, *args], cwd=root, env=child_env, capture_output=True, text=True,
                              timeout=timeout)

    return run


@pytest.fixture(scope="session")
def tiny_model():
    """The engine's tiny preset, seed 0 (CPU, fp32)."""
    from kdtree.engine import build_model, preset

    return build_model(preset("tiny"), seed=0)


@pytest.fixture(scope="session")
def tiny_cuda_model():
    """The engine's tiny preset, seed 0, on the GPU (for tests marked ``gpu``, skipped on the CPU)."""
    from kdtree.engine import build_model, preset

    return build_model(preset("tiny"), seed=0, device="cuda")


@pytest.fixture
def pool_batch(tiny_model):
    """``make(lens, sizes, rng)``: a KV pool of random rows (seed 1) holding request ``b`` with a
    prefix of ``lens[b]`` slots, a pending token and a random token tree of ``sizes[b]`` nodes
    (`kdtree.bench.sglang_batches.random_parents`); returns ``(pool, requests, trees, tree_slots,
    scratch)``, the tree slots allocated after every prefix and one spare slot last."""
    import torch

    from kdtree.bench.sglang_batches import random_parents
    from kdtree.engine import TokenTree
    from kdtree.engine.decode.speculative import Request
    from kdtree.engine.kv.kv_pool import KVPool

    def make(lens, sizes, rng):
        cfg = tiny_model.config
        pool = KVPool(cfg.num_layers, 256, dtype=tiny_model.dtype)
        gen = torch.Generator().manual_seed(1)
        for layer in pool.kv:
            layer.normal_(generator=gen)
        requests, trees = [], []
        for b, (n, size) in enumerate(zip(lens, sizes)):
            pool.add_request(b)
            pool.append(b, pool.alloc(n).tolist())
            r = Request(b, [1], 100, output=[rng.randrange(cfg.vocab_size)])
            requests.append(r)
            trees.append(TokenTree([r.pending] + rng.sample(range(cfg.vocab_size), size - 1),
                                   random_parents(rng, size)))
        tree_slots = [pool.alloc(len(t)).tolist() for t in trees]
        scratch = int(pool.alloc(1)[0])
        return pool, requests, trees, tree_slots, scratch

    return make
