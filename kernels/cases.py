"""Random test cases for the op contract, and the fp64 oracle that answers them.

A *case* is the dict of op-contract inputs (DESIGN section 3) for H heads and a list of requests
[(T_b, L_b)]: ``q`` [sum T_b, H, 576] bf16, a bf16 latent pool ``kv_cache`` [S, 576] (drawn, or
the caller's), ``qo_indptr``/``kv_indptr`` (int32, B+1), ``kv_indices`` (each request's L_b prefix
slots then its T_b tree slots, distinct, scattered over the pool or one contiguous run),
``tree_mask`` (the packed ancestor-or-self mask of a ``random``, ``chain`` or ``star`` tree per
request) and ``sm_scale`` = 1/sqrt(192). The keys are the op's parameter names, so
``call(fn, case)`` runs any implementation on it. Inputs follow from the seed alone.

`oracle(case)` returns ``(out, lse)``: ``out`` fp64 [Nq, H, 512] and ``lse`` fp32 [Nq, H], from
`kdtree.kernels.reference` run in fp64 on only the pool rows the case reads.

Shared by `kdtree.kernels.devcheck` (the GPU inner loop), the phase-1 accuracy gate and the
compute-sanitizer driver.
"""

from __future__ import annotations

import math

import torch

from kdtree.kernels.masks import pack_tree_masks


def random_parents(T: int, kind: str, gen: torch.Generator) -> list[int]:
    """Parent list of a T-node tree: ``chain``, ``star``, or (any other kind) random."""
    if kind == "chain":
        return [-1] + list(range(T - 1))
    if kind == "star":
        return [-1] + [0] * (T - 1)
    return [-1] + [int(torch.randint(0, t, (1,), generator=gen)) for t in range(1, T)]


def make_case(H: int, reqs: list[tuple[int, int]], kind: str, seed: int, pool: torch.Tensor | None = None,
              pool_slots: int | None = None, contiguous: bool = False, device: str = "cuda"):
    """Inputs of the op contract for requests [(T_b, L_b)], slots scattered over the pool."""
    gen = torch.Generator().manual_seed(seed)
    total = sum(t + l for t, l in reqs)
    if pool is None:
        slots_n = pool_slots or max(2 * total, 64)
        pool = (torch.randn(slots_n, 576, generator=gen) * 0.5).to(torch.bfloat16).to(device)
    S = pool.shape[0]
    if contiguous:
        start = int(torch.randint(0, S - total + 1, (1,), generator=gen))
        slots = torch.arange(start, start + total, dtype=torch.int32)
    else:
        slots = torch.randperm(S, generator=gen)[:total].to(torch.int32) if S <= 4 * total + 10**6 else \
            torch.unique(torch.randint(0, S, (int(total * 1.2) + 16,), generator=gen))[:total].to(torch.int32)
        slots = slots[torch.randperm(slots.numel(), generator=gen)]
    nq = sum(t for t, _ in reqs)
    q = (torch.randn(nq, H, 576, generator=gen)).to(torch.bfloat16).to(device)
    qo = torch.tensor([0] + list(torch.cumsum(torch.tensor([t for t, _ in reqs]), 0)), dtype=torch.int32)
    kvp = torch.tensor([0] + list(torch.cumsum(torch.tensor([t + l for t, l in reqs]), 0)), dtype=torch.int32)
    parents = [random_parents(t, kind, gen) for t, _ in reqs]
    mask = pack_tree_masks(parents)
    return dict(q=q, kv_cache=pool, qo_indptr=qo.to(device), kv_indptr=kvp.to(device),
                kv_indices=slots.to(device), tree_mask=mask.to(device), sm_scale=1.0 / math.sqrt(192.0))


def call(fn, case, out=None, lse=None):
    """``fn(q, kv_cache, ..., sm_scale, out=out, lse=lse)`` for any implementation of the op."""
    return fn(case["q"], case["kv_cache"], case["qo_indptr"], case["kv_indptr"], case["kv_indices"],
              case["tree_mask"], case["sm_scale"], out=out, lse=lse)


def oracle(case):
    """(out fp64 [Nq, H, 512], lse fp32 [Nq, H]) of the fp64 reference on `case`."""
    from kdtree.kernels.reference import tree_verify_mla_reference as ref

    c64 = dict(case)
    c64["q"] = case["q"].double()
    # gather only the rows used, to keep fp64 memory small
    used, inv = torch.unique(case["kv_indices"].long(), return_inverse=True)
    c64["kv_cache"] = case["kv_cache"][used].double()
    c64["kv_indices"] = inv.to(torch.int32)
    lse = torch.empty(case["q"].shape[0], case["q"].shape[1], dtype=torch.float32, device=case["q"].device)
    out = call(ref, c64, lse=lse)
    return out, lse
