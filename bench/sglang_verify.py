"""SGLang's Triton target-verify call and ours, on SGLang-format fixtures
(`kdtree.bench.sglang_batches.make_verify_batch`): the pair phase 2's parity gate and the
SGLang GPU tests compare."""

from __future__ import annotations

from typing import Any

import torch

from kdtree.integrations.sglang.sglang_kernels import load_extend_attention


def sglang_extend_attention():
    """(SGLang's own ``extend_attention_fwd`` from the installed wheel, how it was loaded), or ImportError."""
    return load_extend_attention()


def sglang_triton_verify(fx: dict[str, Any], extend_attention_fwd) -> Any:
    """SGLang's Triton target-verify call on a fixture, exactly as ``TritonAttnBackend.forward_extend``
    makes it for an MLA layer (its pool already holds the prefix; k/v of the drafts passed in)."""
    q, k, v, pool = fx["q"], fx["k_extend"], fx["v_extend"], fx["pool"]
    o = torch.empty(q.shape[0], q.shape[1], 512, dtype=q.dtype, device=q.device)
    extend_attention_fwd(q, k.contiguous(), v.contiguous(), o, pool, pool[..., :512], fx["qo_indptr"],
                         fx["kv_indptr"], fx["kv_indices"], fx["custom_mask"], True, fx["mask_indptr"],
                         fx["num_draft_tokens"], 1.0, 1.0, fx["sm_scale"])
    return o


def kdtree_sglang_verify(fx: dict[str, Any], converter, op, out) -> None:
    """What the SGLang backend does on a target-verify MLA layer: write the drafts' KV into the
    pool, convert SGLang's metadata (`VerifyConverter`), run the op on the pool."""
    pool = fx["pool"]
    pool[fx["out_cache_loc"]] = fx["k_extend"]
    meta = converter.convert(fx["qo_indptr"], fx["kv_indptr"], fx["kv_indices"], fx["out_cache_loc"],
                             fx["custom_mask"], fx["mask_indptr"])
    op(fx["q"], pool.view(pool.shape[0], 576), meta.qo_indptr, meta.kv_indptr, meta.kv_indices, meta.tree_mask,
       fx["sm_scale"], out=out)
