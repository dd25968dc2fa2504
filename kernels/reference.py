"""The oracle of the op contract: MLA tree-verify attention written for clarity, not speed.

Per request: gather the request's slots from the pool, score every tree node against every
slot, hide the tree slots that are not ancestors-or-self of the node (the prefix is always
visible), softmax, and sum the values (the first 512 latent dims). bf16 inputs are computed in
fp64 and returned as bf16; fp32/fp64 inputs are computed and returned in their own dtype.
"""

from __future__ import annotations

from typing import Optional

import torch

from kdtree.kernels.contract import LATENT_DIM, allocate_outputs, validate
from kdtree.kernels.masks import unpack_bool_rows


def tree_verify_mla_reference(q: torch.Tensor, kv_cache: torch.Tensor, qo_indptr: torch.Tensor,
                              kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                              tree_mask: torch.Tensor, sm_scale: float, *,
                              out: Optional[torch.Tensor] = None,
                              lse: Optional[torch.Tensor] = None) -> torch.Tensor:
    """softmax(q·Kᵀ·sm_scale, tree-masked) · V for every request; see docs/design.md section 3."""
    validate(q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale, out, lse,
             float_dtypes=(torch.bfloat16, torch.float16, torch.float32, torch.float64))
    out, lse = allocate_outputs(q, out, lse)
    work = torch.float64 if q.dtype != torch.float32 else torch.float32
    qo = qo_indptr.tolist()
    kv = kv_indptr.tolist()
    for b in range(len(qo) - 1):
        q0, q1 = qo[b], qo[b + 1]
        T = q1 - q0
        slots = kv_indices[kv[b]: kv[b + 1]].long()
        L = slots.numel() - T
        keys = kv_cache[slots].to(work)  # [L+T, 576]
        values = keys[:, :LATENT_DIM]  # [L+T, 512]
        queries = q[q0:q1].to(work)  # [T, H, 576]
        scores = torch.einsum("thd,sd->ths", queries, keys) * sm_scale
        visible = torch.ones(T, L + T, dtype=torch.bool, device=q.device)
        visible[:, L:] = unpack_bool_rows(tree_mask[q0:q1], T)
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
        row_lse = torch.logsumexp(scores, dim=-1)  # [T, H]
        probs = torch.exp(scores - row_lse[..., None])
        out[q0:q1] = torch.einsum("ths,sd->thd", probs, values).to(out.dtype)
        if lse is not None:
            lse[q0:q1] = row_lse.to(lse.dtype)
    return out
