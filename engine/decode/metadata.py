"""Attention metadata for a batch, in the op contract's layout (docs/design.md section 3).

For every mode, request b's query rows are ``qo_indptr[b]:qo_indptr[b+1]`` and its slots are
``kv_indices[kv_indptr[b]:kv_indptr[b+1]]``: the slots already holding KV, then the slots of this
forward's new tokens, in the order of the query rows.
- extend: new tokens form a causal chain after the prefix (prefill).
- decode: one new token per request (a one-node tree; ``tree_mask`` is all ones).
- verify: the new tokens are a token tree; ``tree_mask`` is the packed ancestor-or-self mask.

A request's prefix may be given as a host list or as an int32 device tensor (the engine passes
`kdtree.engine.kv.slot_mirror.SlotMirror` views, so long prefixes stay on the device).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, Sequence

import torch

from kdtree.engine.decode.h2d import to_device
from kdtree.kernels.masks import pack_tree_masks

Mode = Literal["extend", "decode", "verify"]


@dataclass
class AttentionMetadata:
    mode: Mode
    qo_indptr: torch.Tensor  # int32 [B+1]
    kv_indptr: torch.Tensor  # int32 [B+1]
    kv_indices: torch.Tensor  # int32 [sum(L_b + T_b)]
    tree_mask: Optional[torch.Tensor]  # int32 [Nq, W]; None for extend
    qo_lens: list[int]  # T_b, on the host
    kv_lens: list[int]  # L_b + T_b, on the host
    parents: Optional[list[list[int]]] = None  # verify only

    @property
    def batch_size(self) -> int:
        return len(self.qo_lens)

    @property
    def prefix_lens(self) -> list[int]:
        return [k - t for k, t in zip(self.kv_lens, self.qo_lens)]


def _indptr(lengths: Sequence[int], device) -> torch.Tensor:
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    out[1:] = torch.tensor(list(lengths), dtype=torch.int64).cumsum(0)
    return to_device(out, device)


def _flatten(prefix_slots, new_slots, device) -> torch.Tensor:
    """kv_indices: each request's prefix slots, then its new slots. A prefix given as a device
    tensor (`kdtree.engine.kv.slot_mirror.SlotMirror`) is concatenated on the device, so a long
    prefix never goes through a host list again."""
    if not any(isinstance(p, torch.Tensor) for p in prefix_slots):
        flat = [s for p, n in zip(prefix_slots, new_slots) for s in (*p, *n)]
        return to_device(flat, device, torch.int32)
    new_flat = to_device([s for n in new_slots for s in n], device, torch.int32)
    pieces, at = [], 0
    for p, n in zip(prefix_slots, new_slots):
        pieces.append(p if isinstance(p, torch.Tensor) else to_device(list(p), device, torch.int32))
        pieces.append(new_flat[at: at + len(n)])
        at += len(n)
    return torch.cat(pieces)


def _build(mode: Mode, prefix_slots, new_slots, tree_mask_fn, device, parents=None) -> AttentionMetadata:
    if len(prefix_slots) != len(new_slots) or not new_slots:
        raise ValueError(f"need one prefix and one new-slot list per request, got {len(prefix_slots)} "
                         f"and {len(new_slots)}")
    qo_lens = [len(s) for s in new_slots]
    if min(qo_lens) < 1:
        raise ValueError("every request needs at least one new token")
    kv_lens = [len(p) + len(s) for p, s in zip(prefix_slots, new_slots)]
    kv_indices = _flatten(prefix_slots, new_slots, device)
    return AttentionMetadata(mode, _indptr(qo_lens, device), _indptr(kv_lens, device), kv_indices,
                             tree_mask_fn(qo_lens), qo_lens, kv_lens, parents)


def extend_metadata(prefix_slots: Sequence[Sequence[int]], new_slots: Sequence[Sequence[int]],
                    device="cpu") -> AttentionMetadata:
    """Prefill: request b appends the chain new_slots[b] after prefix_slots[b]."""
    return _build("extend", prefix_slots, new_slots, lambda lens: None, device)


def decode_metadata(prefix_slots: Sequence[Sequence[int]], new_slots: Sequence[int],
                    device="cpu") -> AttentionMetadata:
    """Decode: request b adds one token in slot new_slots[b] after prefix_slots[b]."""
    ones = lambda lens: torch.ones(len(lens), 1, dtype=torch.int32, device=device)  # noqa: E731
    return _build("decode", prefix_slots, [[int(s)] for s in new_slots], ones, device)


def verify_metadata(prefix_slots: Sequence[Sequence[int]], tree_slots: Sequence[Sequence[int]],
                    parents: Sequence[Sequence[int]], device="cpu") -> AttentionMetadata:
    """Verify: request b's tree (parents[b], node order) lives in tree_slots[b] after its prefix."""
    for b, (slots, par) in enumerate(zip(tree_slots, parents)):
        if len(slots) != len(par):
            raise ValueError(f"request {b}: {len(slots)} tree slots for a tree of {len(par)} nodes")
    parents = [list(p) for p in parents]
    return _build("verify", prefix_slots, tree_slots, lambda lens: pack_tree_masks(parents, device=device),
                  device, parents)
