"""Target-verify batches in SGLang 0.5.23's layout, with random trees, and an oracle that reads that layout.

Used by the tests (CPU: against fakes of SGLang's classes; GPU: against SGLang's own Triton
kernel) and by phase 2's ``sglang_parity`` gate. The layout is the one `kdtree.integrations.sglang.converter` documents:
an MLA pool ``[S + 1, 1, 576]`` whose slot 0 is SGLang's dummy slot, int32 prefix ``kv_indptr``
with int64 ``kv_indices``, int64 ``out_cache_loc`` for the draft tokens, a flat bool/uint8
``custom_mask`` with one T_b x (L_b + T_b) row-major block per request (prefix columns True),
int64 ``mask_indptr``. The draft tokens' KV is in ``k_extend`` only: the pool rows at
``out_cache_loc`` hold a poison value until a backend writes them (as ``forward_extend`` must).
"""

from __future__ import annotations

import random
from typing import Any, Optional, Sequence

import torch

from kdtree.kernels.masks import ancestor_matrix


def random_parents(rng: random.Random, n: int, kind: str = "random") -> list[int]:
    if kind == "chain":
        return list(range(-1, n - 1))
    if kind == "star":
        return [-1] + [0] * (n - 1)
    return [-1] + [rng.randrange(t) for t in range(1, n)]


def make_verify_batch(heads: int, prefix_lens: Sequence[int], tree_size: int, seed: int, device="cpu",
                      dtype=torch.bfloat16, mask_dtype=torch.bool, qo_dtype=torch.int32, kind: str = "random",
                      ancestor_closed: bool = True, pool_extra: int = 64, padded: int = 0) -> dict[str, Any]:
    """One target-verify batch: len(prefix_lens) requests of `tree_size` draft tokens each.

    ancestor_closed=False flips random tree-mask cells (a mask no tree has: the answer must still
    be what the mask says). padded: extra requests shaped like a CUDA-graph replay's padding
    (seq_len 1, out_cache_loc 0, stale mask cells).
    """
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    real = len(prefix_lens)
    lens = list(prefix_lens) + [1] * padded
    batch, N = len(lens), tree_size
    slots_needed = sum(prefix_lens) + real * N
    pool_slots = slots_needed + pool_extra
    order = rng.sample(range(1, pool_slots + 1), slots_needed)  # slot 0 stays SGLang's dummy slot
    pool = torch.randn(pool_slots + 1, 1, 576, generator=gen).to(dtype)
    kv_indices, out_cache_loc, blocks, parents_all = [], [], [], []
    at = 0
    for b in range(batch):
        L = lens[b]
        if b < real:
            kv_indices += order[at: at + L]
            at += L
            out_cache_loc += order[at: at + N]
            at += N
            parents = random_parents(rng, N, kind)
            tree = torch.from_numpy(ancestor_matrix(parents))
            if not ancestor_closed:
                flips = torch.rand(N, N, generator=gen) < 0.2
                tree = tree ^ flips
                tree |= torch.eye(N, dtype=torch.bool)
        else:  # graph padding: a one-token prefix in the dummy slot, draft slots 0, stale mask
            kv_indices += [0]
            out_cache_loc += [0] * N
            parents = [-1] + [0] * (N - 1)
            tree = torch.rand(N, N, generator=gen) < 0.5
        parents_all.append(parents)
        block = torch.ones(N, L + N, dtype=torch.bool)
        block[:, L:] = tree
        blocks.append(block.reshape(-1))
    nq = batch * N
    k_extend = torch.randn(nq, 1, 576, generator=gen).to(dtype)
    ocl = torch.tensor(out_cache_loc, dtype=torch.int64)
    poison = torch.full((1, 576), 1e4).to(dtype)
    pool[ocl[: real * N]] = poison  # the draft KV is not in the pool until the backend writes it
    kvp = torch.tensor([0] + lens, dtype=torch.int64).cumsum(0)
    mask_lens = torch.tensor([N * (L + N) for L in lens], dtype=torch.int64)
    mask = torch.cat(blocks)
    if mask_dtype != torch.bool:
        mask = mask.to(mask_dtype)
    to = lambda t: t.to(device)  # noqa: E731
    return {
        "q": to(torch.randn(nq, heads, 576, generator=gen).to(dtype)),
        "k_extend": to(k_extend),
        "v_extend": to(k_extend[..., :512]),  # a view of k, as in SGLang's MLA forward
        "pool": to(pool),
        "qo_indptr": to(torch.arange(0, nq + 1, N, dtype=qo_dtype)),
        "kv_indptr": to(kvp.to(torch.int32)),
        "kv_indices": to(torch.tensor(kv_indices, dtype=torch.int64)),
        "out_cache_loc": to(ocl),
        "custom_mask": to(mask),
        "mask_indptr": to(torch.cat([torch.zeros(1, dtype=torch.int64), mask_lens.cumsum(0)])),
        "num_draft_tokens": N,
        "sm_scale": 1.0 / (192 ** 0.5),
        "parents": parents_all,
        "real_requests": real,
    }


def sglang_layout_reference(batch: dict[str, Any], rows: Optional[int] = None) -> torch.Tensor:
    """fp64 attention read straight off SGLang's layout: [Nq, H, 512] in q's dtype.

    Request b's keys: the pool rows of its prefix slots, then its draft tokens' ``k_extend``;
    row t sees the whole prefix and the tree columns its custom_mask row sets. Independent of
    the converter (no packed mask, no op contract).
    """
    q, pool = batch["q"], batch["pool"]
    qo = batch["qo_indptr"].tolist()
    kvp = batch["kv_indptr"].tolist()
    mi = batch["mask_indptr"].tolist()
    flat = batch["custom_mask"].to(torch.bool)
    out = torch.empty(q.shape[0], q.shape[1], 512, dtype=torch.float64, device=q.device)
    for b in range(len(qo) - 1):
        q0, q1 = qo[b], qo[b + 1]
        T, L = q1 - q0, kvp[b + 1] - kvp[b]
        prefix = pool[batch["kv_indices"][kvp[b]: kvp[b + 1]], 0]
        keys = torch.cat([prefix, batch["k_extend"][q0:q1, 0]]).to(torch.float64)
        visible = flat[mi[b]: mi[b] + T * (L + T)].reshape(T, L + T).clone()
        visible[:, :L] = True  # skip_prefix_custom_mask
        scores = torch.einsum("thd,sd->ths", q[q0:q1].to(torch.float64), keys) * batch["sm_scale"]
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
        out[q0:q1] = torch.einsum("ths,sd->thd", torch.softmax(scores, dim=-1), keys[:, :512])
    return out.to(q.dtype)
