"""Structured accuracy cases for phase 1: inputs in which every key that matters, matters a lot.

On i.i.d. random inputs a row's softmax spreads over all its keys, so an error confined to a few
keys (the last prefix key dropped past 8192 keys, one key lost at each KV-split boundary) moves
the output far less than bf16 rounding does, whatever the tolerance. Here chosen keys *dominate*
the rows that target them:
- per request, the marked key positions are the first key, the last prefix key (the tail), the
  first and the last tree slot, and both sides of every multiple of the kernel's key tile
  (`kdtree.kernels.launch_plan.BLOCK_N`, 32): the kernel cuts KV splits only there, so these are
  the split boundaries of every split count any SM count can choose;
- every marked key is the target of some (node, head) row that sees it; a row has
  ``targets`` keys, and its query is the least-norm solution of ``K_targets q = s 1``, so each
  target scores ``strength`` softmax units and the other keys score about
  ``strength * sqrt(targets) / 24`` as noise: the targets share the row's attention, about
  ``1/targets`` each, and each target's value (its latent row, random, so it identifies its slot)
  is a visible part of the output;
- some rows also target a tree slot they must *not* see (a non-ancestor): under the right mask it
  gets nothing, under a leaking one about ``1/targets`` of the row.

`row_scale` is what the gate's per-row tolerance is relative to: ``||ref_r|| + rho_r`` with
``rho_r^2 = sum_i p_i^2 ||v_i||^2``, the size of the rounding error that bf16 probabilities and
a bf16 output make (about ``2^-9 (||ref_r|| + rho_r)``): for a row spread over many keys it is
about ``2 ||ref_r||``, for a row held by a few keys about their values' norm.

torch and the kernels package are imported inside the functions.
"""

from __future__ import annotations

import math
import random
from typing import Any

import torch

from kdtree.bench.cases import make_case, random_parents
from kdtree.kernels.launch_plan import BLOCK_N
from kdtree.kernels.masks import pack_tree_masks, unpack_bool_rows


def marked_positions(L: int, T: int, tile: int) -> list[int]:
    """Key positions (0 .. L+T-1 in a request's slot list) that structured cases make dominant."""
    N = L + T
    marks = {0, L, N - 1}
    if L > 0:
        marks.add(L - 1)
    for edge in range(tile, N, tile):
        marks.update((edge - 1, edge))
    return sorted(m for m in marks if 0 <= m < N)


def _ancestors(parents: list[int], t: int) -> set[int]:
    seen = set()
    while t >= 0:
        seen.add(t)
        t = parents[t]
    return seen


def _assign_targets(L: int, T: int, H: int, parents: list[int], targets: int, rng: random.Random,
                    tile: int) -> list[tuple[int, int, list[int]]]:
    """(node, head, key positions) per structured row of one request; every mark is targeted by a
    row that sees it, plus one trap per tree node with a non-ancestor (a slot it must not see)."""
    rows: dict[tuple[int, int], list[int]] = {}
    cells = [(t, h) for t in range(T) for h in range(H)]
    rng.shuffle(cells)
    ancestors = [_ancestors(parents, t) for t in range(T)]
    prefix_cursor = 0
    for m in sorted(marked_positions(L, T, tile), key=lambda m: m < L):  # tree slots first
        if m < L:  # prefix: any row sees it
            for _ in range(len(cells)):
                cell = cells[prefix_cursor % len(cells)]
                prefix_cursor += 1
                if len(rows.setdefault(cell, [])) < targets:
                    rows[cell].append(m)
                    break
            else:
                raise ValueError(f"structured case: {T} nodes x {H} heads x {targets} targets cannot hold "
                                 f"the {len(marked_positions(L, T, tile))} marked keys of L={L}, T={T}")
        else:  # tree slot s = m - L: its own node sees it, on a head with room
            s = m - L
            for h in rng.sample(range(H), H):
                if len(rows.setdefault((s, h), [])) < targets - 1:  # keep room for a trap
                    rows[(s, h)].append(m)
                    break
            else:
                raise ValueError(f"structured case: no head of node {s} has room for its own slot")
    for t in range(T):  # traps: a slot the node must not see, on a head with room
        hidden = [s for s in range(T) if s not in ancestors[t]]
        roomy = [h for h in range(H) if len(rows.get((t, h), [])) < targets - 1]
        if hidden and roomy:
            rows.setdefault((t, rng.choice(roomy)), []).append(L + rng.choice(hidden))
    out = []
    for (t, h), keys in rows.items():
        seen = list(ancestors[t])
        for _ in range(16 * targets):  # top up with keys the row sees: the prefix, else its ancestors
            if len(keys) >= targets:
                break
            extra = rng.randrange(L) if L > 0 and rng.random() < 0.9 else L + rng.choice(seen)
            if extra not in keys:
                keys.append(extra)
        out.append((t, h, keys))
    return out


def dominant_key_case(H: int, reqs: list[tuple[int, int]], kind: str, seed: int, device: str = "cuda",
                      targets: int = 8, strength: float = 20.0) -> dict[str, Any]:
    """A `kdtree.bench.cases.make_case` case whose queries make the marked keys dominate (module
    docstring). L and T are as given; the rest follows from the seed."""


    case = make_case(H, reqs, kind, seed, device="cpu")
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed ^ 0xD0)
    parents_all = [random_parents(t, kind, gen) for t, _ in reqs]
    # make_case drew its own trees; rebuild the mask from ours so both agree

    case["tree_mask"] = pack_tree_masks(parents_all)
    q = case["q"].double()
    pool, idx = case["kv_cache"], case["kv_indices"].long()
    qo, kvp = case["qo_indptr"].tolist(), case["kv_indptr"].tolist()
    s = strength / case["sm_scale"]
    for b, ((T, L), parents) in enumerate(zip(reqs, parents_all)):
        slots = idx[kvp[b]: kvp[b + 1]]
        plan = _assign_targets(L, T, H, parents, targets, rng, BLOCK_N)
        if not plan:
            continue
        by_k: dict[int, list[tuple[int, int, list[int]]]] = {}
        for row in plan:
            by_k.setdefault(len(set(row[2])), []).append(row)
        for k, rows in by_k.items():
            keys = torch.stack([pool[slots[torch.tensor(sorted(set(r[2])))].long()].double() for r in rows])
            gram = keys @ keys.transpose(1, 2)  # [R, k, k]
            coef = torch.linalg.solve(gram, torch.full((len(rows), k, 1), s, dtype=torch.float64))
            qs = (keys.transpose(1, 2) @ coef).squeeze(-1)  # [R, 576]
            for (t, h, _), qv in zip(rows, qs):
                q[qo[b] + t, h] = qv
    case["q"] = q.to(torch.bfloat16)
    return {k: (v.to(device) if hasattr(v, "to") else v) for k, v in case.items()}


def row_scale(case: dict[str, Any]):
    """``||ref_r|| + rho_r`` per (node, head) row, fp64 [Nq, H] (module docstring)."""


    q = case["q"]
    out = torch.empty(q.shape[0], q.shape[1], dtype=torch.float64, device=q.device)
    qo, kvp = case["qo_indptr"].tolist(), case["kv_indptr"].tolist()
    for b in range(len(qo) - 1):
        q0, q1 = qo[b], qo[b + 1]
        T = q1 - q0
        slots = case["kv_indices"][kvp[b]: kvp[b + 1]].long()
        L = slots.numel() - T
        keys = case["kv_cache"][slots].double()
        values = keys[:, :512]
        scores = torch.einsum("thd,sd->ths", q[q0:q1].double(), keys) * case["sm_scale"]
        visible = torch.ones(T, L + T, dtype=torch.bool, device=q.device)
        visible[:, L:] = unpack_bool_rows(case["tree_mask"][q0:q1], T)
        scores = scores.masked_fill(~visible[:, None, :], -math.inf)
        p = torch.softmax(scores, dim=-1)
        ref = torch.einsum("ths,sd->thd", p, values)
        rho = (p.pow(2) @ values.pow(2).sum(-1)).sqrt()
        out[q0:q1] = torch.linalg.vector_norm(ref, dim=-1) + rho
    return out
