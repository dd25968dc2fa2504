"""Inputs for the op contract, the one generator every tool, test and gate draws them from, and
the fp64 oracle that answers them.

A *case* is the dict of op-contract inputs (docs/design.md section 3), keyed by the op's parameter
names, for H heads and a list of requests [(T_b, L_b)]: ``q`` [sum T_b, H, 576] bf16, a bf16
latent pool ``kv_cache`` [S, 576] (drawn, or the caller's), ``qo_indptr`` / ``kv_indptr``
(int32, B+1), ``kv_indices`` (each request's L_b prefix slots then its T_b tree slots, distinct,
scattered over the pool or one contiguous run), ``tree_mask`` (the packed ancestor-or-self mask
of a ``random``, ``chain`` or ``star`` tree per request) and ``sm_scale`` = 1/sqrt(192).
``call(fn, case)`` runs any implementation on it, ``case_args(case)`` gives its positional
arguments. Inputs follow from the seed alone and are drawn on the target device.

`uniform_case` is the benchmark's shape (B equal requests of a `roofline.Shape`), `make_pool`
a large random pool, `oracle(case)` the fp64 answer ``(out, lse)``.
"""

from __future__ import annotations

import math

import torch

from kdtree.kernels.masks import pack_tree_masks

SM_SCALE = 1.0 / math.sqrt(192.0)  # DeepSeek-V3's qk_head_dim
ROW_BYTES = 576 * 2
LAYOUTS = ("scattered", "contiguous")
KINDS = ("random", "chain", "star")
_ARGS = ("q", "kv_cache", "qo_indptr", "kv_indptr", "kv_indices", "tree_mask", "sm_scale")


def random_parents(T: int, kind: str, gen: torch.Generator) -> list[int]:
    """Parent list of a T-node tree: ``chain``, ``star``, or (``random``) each node's parent drawn
    uniformly from the nodes before it."""
    if kind == "chain":
        return [-1] + list(range(T - 1))
    if kind == "star":
        return [-1] + [0] * (T - 1)
    if kind != "random":
        raise ValueError(f"tree kind {kind!r}: expected one of {KINDS}")
    if T <= 1:
        return [-1][:T]
    draws = (torch.rand(T - 1, generator=gen, dtype=torch.float64) * torch.arange(1, T, dtype=torch.float64))
    return [-1] + draws.long().tolist()


def make_pool(slots: int, device="cuda", seed: int = 0) -> torch.Tensor:
    """kv_cache [slots, 576] bf16 of random normal rows (never zeros), filled in chunks so that no
    kernel touches more than 2^31 elements at once."""
    gen = torch.Generator(device=device).manual_seed(seed)
    pool = torch.empty(slots, 576, dtype=torch.bfloat16, device=device)
    for start in range(0, slots, 1 << 20):
        pool[start: start + (1 << 20)].normal_(generator=gen)
    return pool


def pool_slots_for(gb: float) -> int:
    """Rows of a pool of ``gb`` GiB."""
    return int(gb * 2**30) // ROW_BYTES


def _slots(total: int, S: int, min_slot: int, contiguous: bool, gen: torch.Generator, device) -> torch.Tensor:
    span = S - min_slot
    if total > span:
        raise ValueError(f"pool: {span} slots from slot {min_slot} on cannot hold {total} distinct ones")
    if contiguous:
        start = min_slot + int(torch.randint(0, span - total + 1, (1,), generator=gen, device=device))
        return torch.arange(start, start + total, dtype=torch.int32, device=device)
    if span <= 4 * total + (1 << 20):
        picked = torch.randperm(span, generator=gen, device=device)[:total]
    else:  # a large pool: draw with room to spare, drop repeats, keep a random order
        drawn = torch.randint(0, span, (int(total * 1.2) + 16,), generator=gen, device=device).unique()
        picked = drawn[torch.randperm(drawn.numel(), generator=gen, device=device)][:total]
        if picked.numel() < total:
            raise RuntimeError(f"drew only {picked.numel()} distinct slots of {total}")
    return (picked + min_slot).to(torch.int32)


def make_case(H: int, reqs: list[tuple[int, int]], kind: str, seed: int, pool: torch.Tensor | None = None,
              pool_slots: int | None = None, contiguous: bool = False, device="cuda",
              min_slot: int = 0) -> dict:
    """Inputs of the op contract for requests [(T_b, L_b)] over the given ``pool`` (or a drawn one
    of ``pool_slots`` rows, default twice what the case reads), slots scattered (or one
    contiguous run) among the pool's rows from ``min_slot`` on."""
    if pool is not None:
        device = pool.device
    gen = torch.Generator(device=device).manual_seed(seed)
    cpu_gen = torch.Generator().manual_seed(seed)
    total = sum(t + ell for t, ell in reqs)
    if pool is None:
        slots_n = pool_slots or max(2 * total, 64) + min_slot
        pool = (torch.randn(slots_n, 576, generator=gen, device=device) * 0.5).to(torch.bfloat16)
    kv_indices = _slots(total, pool.shape[0], min_slot, contiguous, gen, device)
    nq = sum(t for t, _ in reqs)
    q = torch.randn(nq, H, 576, generator=gen, device=device).to(torch.bfloat16)
    cum_q, cum_kv = [0], [0]
    for t, ell in reqs:
        cum_q.append(cum_q[-1] + t)
        cum_kv.append(cum_kv[-1] + t + ell)
    mask = pack_tree_masks([random_parents(t, kind, cpu_gen) for t, _ in reqs])
    return dict(q=q, kv_cache=pool, qo_indptr=torch.tensor(cum_q, dtype=torch.int32, device=device),
                kv_indptr=torch.tensor(cum_kv, dtype=torch.int32, device=device), kv_indices=kv_indices,
                tree_mask=mask.to(device), sm_scale=SM_SCALE)


def uniform_case(H: int, T: int, B: int, L: int, layout: str, pool: torch.Tensor, seed: int) -> dict:
    """B requests, each a random tree of T nodes over L prefix slots, in ``pool``: slots
    ``scattered`` over it or ``contiguous`` (one run, request after request, prefix then tree)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
    return make_case(H, [(T, L)] * B, "random", seed, pool=pool, contiguous=layout == "contiguous")


def case_args(case: dict) -> tuple:
    """The contract's positional arguments of a case."""
    return tuple(case[k] for k in _ARGS)


def call(fn, case, out=None, lse=None):
    """``fn(q, kv_cache, ..., sm_scale, out=out, lse=lse)`` for any implementation of the op."""
    return fn(*case_args(case), out=out, lse=lse)


def oracle(case):
    """(out fp64 [Nq, H, 512], lse fp32 [Nq, H]) of the fp64 reference on `case`."""
    from kdtree.kernels.reference import tree_verify_mla_reference as ref  # noqa: PLC0415

    c64 = dict(case)
    c64["q"] = case["q"].double()
    # gather only the rows used, to keep fp64 memory small
    used, inv = torch.unique(case["kv_indices"].long(), return_inverse=True)
    c64["kv_cache"] = case["kv_cache"][used].double()
    c64["kv_indices"] = inv.to(torch.int32)
    lse = torch.empty(case["q"].shape[0], case["q"].shape[1], dtype=torch.float32, device=case["q"].device)
    out = call(ref, c64, lse=lse)
    return out, lse
