"""Accuracy cases for the op contract and an fp64 dense oracle written independently of kernels/.

A case is a list of requests (tree shape, T_b, L_b) and a head count. `build` draws fresh random
inputs for it; `dense_truth` computes the answer from the parents with one dense softmax over the
whole batch's slots, sharing no code with `kdtree.kernels.reference`.
"""

from __future__ import annotations

import math
import os
import random
import zlib
from dataclasses import dataclass

import numpy as np
import torch

from kdtree.kernels.masks import pack_bool_rows

SHAPES = ("random", "chain", "star", "self")

# The session's base seed: fresh each run unless KDTREE_TEST_SEED pins it (failures print it).
BASE_SEED = int(os.environ.get("KDTREE_TEST_SEED", random.SystemRandom().randrange(2**31)))
os.environ["KDTREE_TEST_SEED"] = str(BASE_SEED)  # a child pytest (triton interpreter) reuses it


@dataclass(frozen=True)
class Case:
    """Requests as (shape, T_b, L_b); ``shared_prefix``: every request reads request 0's prefix slots."""

    name: str
    heads: int
    requests: tuple
    shared_prefix: bool = False

    @property
    def tiny(self) -> bool:
        """Small enough for the triton interpreter (H <= 4, T_b <= 80, L_b <= 130)."""
        return self.heads <= 4 and all(t <= 80 and ell <= 130 for _, t, ell in self.requests)


CASES = [
    Case("random-T7-L13-H1", 1, (("random", 7, 13),)),
    Case("chain-T12-L9-H2", 2, (("chain", 12, 9),)),
    Case("star-T17-L30-H2", 2, (("star", 17, 30),)),
    Case("T1-L25-H2", 2, (("random", 1, 25),)),
    Case("T1-L0-H1", 1, (("random", 1, 0),)),
    Case("L0-random-T20-H2", 2, (("random", 20, 0),)),
    # rows 64.. see nothing in the first 64-key tile: the online softmax starts from a fully masked tile
    Case("self-only-T70-L0-H1", 1, (("self", 70, 0),)),
    Case("random-T80-L0-H1", 1, (("random", 80, 0),)),
    Case("cross32-T40-L100-H2", 2, (("random", 40, 100),)),
    Case("mixed-B4-H3", 3, (("random", 5, 30), ("chain", 1, 0), ("star", 40, 7), ("random", 33, 64))),
    Case("odd-T33-L97-H3", 3, (("random", 33, 97),)),
    Case("shared-prefix-B3-H2", 2, (("random", 9, 50), ("chain", 16, 50), ("star", 3, 50)), True),
    Case("H16-T24-L50", 16, (("random", 24, 50),)),
    Case("H128-T8-L64", 128, (("random", 8, 64),)),
    Case("odd-H5-T65-L129", 5, (("random", 65, 129),)),
    Case("T1024-L16-H1", 1, (("random", 1024, 16),)),
    Case("mixed-B4-H8", 8, (("random", 300, 0), ("chain", 64, 500), ("random", 1, 1000), ("star", 129, 77))),
]


def parents_of(shape: str, T: int, rng: random.Random) -> list:
    """Parent list of a tree; "self" returns None (a mask where each node sees only itself)."""
    if shape == "random":
        return [-1] + [rng.randrange(t) for t in range(1, T)]
    if shape == "chain":
        return [-1] + list(range(T - 1))
    if shape == "star":
        return [-1] + [0] * (T - 1)
    if shape == "self":
        return None
    raise ValueError(shape)


def visibility(parents, T: int) -> np.ndarray:
    """bool [T, T]: (t, s) iff s is t or one of its ancestors, found by walking parent links."""
    vis = np.zeros((T, T), dtype=bool)
    for t in range(T):
        s = t
        while s >= 0:
            vis[t, s] = True
            s = parents[s] if parents is not None else -1
    return vis


@dataclass
class Inputs:
    q: torch.Tensor
    kv_cache: torch.Tensor
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    tree_mask: torch.Tensor
    sm_scale: float
    visible: list  # per request, bool [T_b, T_b]

    def args(self):
        return (self.q, self.kv_cache, self.qo_indptr, self.kv_indptr, self.kv_indices,
                self.tree_mask, self.sm_scale)

    def to(self, device) -> "Inputs":
        moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in vars(self).items()}
        return Inputs(**moved)


def case_seed(case: Case, salt: str = "") -> int:
    return (BASE_SEED + zlib.crc32(f"{case.name}/{salt}".encode())) % 2**31


def build(case: Case, dtype: torch.dtype, seed: int) -> Inputs:
    """Fresh random inputs for `case` on the CPU: scattered distinct slots in a pool with spare rows."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    Ts = [t for _, t, _ in case.requests]
    Ls = [ell for _, _, ell in case.requests]
    visible = [visibility(parents_of(shape, t, rng), t) for shape, t, _ in case.requests]
    words = (max(Ts) + 31) // 32
    tree_mask = torch.from_numpy(np.concatenate([pack_bool_rows(v, words) for v in visible]))
    total = sum(Ts) + sum(Ls)
    pool = 2 * total + 7
    perm = torch.randperm(pool, generator=gen).to(torch.int32)
    slots, used = [], 0
    for b, (T, L) in enumerate(zip(Ts, Ls)):
        if case.shared_prefix and b > 0:
            prefix = slots[0][:Ls[0]]
            assert L == Ls[0], "shared-prefix cases need equal L_b"
        else:
            prefix = perm[used: used + L]
            used += L
        slots.append(torch.cat([prefix, perm[used: used + T]]))
        used += T
    nq = sum(Ts)
    q = torch.randn(nq, case.heads, 576, generator=gen).to(dtype)
    kv_cache = torch.randn(pool, 576, generator=gen).to(dtype)
    qo = torch.tensor([0] + list(np.cumsum(Ts)), dtype=torch.int32)
    kv = torch.tensor([0] + list(np.cumsum([s.numel() for s in slots])), dtype=torch.int32)
    return Inputs(q, kv_cache, qo, kv, torch.cat(slots).contiguous(), tree_mask,
                  1.0 / math.sqrt(192.0), visible)


def dense_truth(inp: Inputs):
    """(out fp64 [Nq, H, 512], lse fp64 [Nq, H]): one masked softmax over every slot of the batch."""
    q = inp.q.double().cpu()
    keys = inp.kv_cache.double().cpu()[inp.kv_indices.long().cpu()]  # [N, 576]
    qo = inp.qo_indptr.tolist()
    kv = inp.kv_indptr.tolist()
    allowed = torch.zeros(q.shape[0], keys.shape[0], dtype=torch.bool)
    for b, vis in enumerate(inp.visible):
        T = qo[b + 1] - qo[b]
        L = kv[b + 1] - kv[b] - T
        allowed[qo[b]: qo[b + 1], kv[b]: kv[b] + L] = True
        allowed[qo[b]: qo[b + 1], kv[b] + L: kv[b + 1]] = torch.from_numpy(vis)
    scores = torch.einsum("nhd,cd->nhc", q, keys) * inp.sm_scale
    scores = scores.masked_fill(~allowed[:, None, :], -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("nhc,cd->nhd", torch.exp(scores - lse[..., None]), keys[:, :512])
    return out, lse
