"""MLA tree-verify attention in plain vectorised torch: what a user writes without a kernel.

Per request: gather the slots, score all heads and tree nodes in one matmul in the input dtype,
hide the tree slots outside each node's ancestor set, softmax in fp32, one matmul with the
values (the first 512 latent dims) in the input dtype. It is the "naive torch" column of
docs/design.md section 3b; it materialises the full score matrix, so it is bandwidth-hungry on purpose.
"""

from __future__ import annotations

from typing import Optional

import torch

from kdtree.kernels.contract import LATENT_DIM, allocate_outputs, validate
from kdtree.kernels.masks import unpack_bool_rows

# Score elements materialised at once; larger requests are processed in groups of tree nodes,
# so the op fits cards with little memory (the work per element is unchanged).
_MAX_SCORE_ELEMENTS = 1 << 30


def tree_verify_mla_naive(q: torch.Tensor, kv_cache: torch.Tensor, qo_indptr: torch.Tensor,
                          kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                          tree_mask: torch.Tensor, sm_scale: float, *,
                          out: Optional[torch.Tensor] = None,
                          lse: Optional[torch.Tensor] = None) -> torch.Tensor:
    """softmax(q·Kᵀ·sm_scale, tree-masked) · V with torch ops; bf16/fp16/fp32 in, same dtype out.

    Matmuls run in the input dtype (fp32 accumulation inside bf16/fp16 GEMMs on GPU), the
    softmax and ``lse`` in fp32. Reads the indptrs on the host, so it cannot be graph-captured.
    """
    validate(q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale, out, lse,
             float_dtypes=(torch.bfloat16, torch.float16, torch.float32))
    out, lse = allocate_outputs(q, out, lse)
    heads = q.shape[1]
    qo = qo_indptr.tolist()
    kv = kv_indptr.tolist()
    for b in range(len(qo) - 1):
        q0, q1 = qo[b], qo[b + 1]
        T = q1 - q0
        keys = kv_cache[kv_indices[kv[b]: kv[b + 1]].long()]  # [L+T, 576]
        L = keys.shape[0] - T
        values = keys[:, :LATENT_DIM]
        visible = unpack_bool_rows(tree_mask[q0:q1], T)  # [T, T] over the tree slots
        step = max(1, _MAX_SCORE_ELEMENTS // (heads * keys.shape[0]))
        for t0 in range(0, T, step):
            t1 = min(T, t0 + step)
            rows = q[q0 + t0: q0 + t1]  # [t, H, 576]
            scores = torch.matmul(rows, keys.T).float().mul_(sm_scale)  # [t, H, L+T]
            scores[:, :, L:].masked_fill_(~visible[t0:t1, None, :], float("-inf"))
            row_lse = torch.logsumexp(scores, dim=-1)  # [t, H]
            probs = torch.exp_(scores.sub_(row_lse[..., None])).to(q.dtype)
            out[q0 + t0: q0 + t1] = torch.matmul(probs, values)
            if lse is not None:
                lse[q0 + t0: q0 + t1] = row_lse
    return out
