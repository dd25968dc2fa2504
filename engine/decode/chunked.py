"""Prefill attention as chain trees: bounded memory for any prompt length.

A causal prefill of T tokens after a prefix of L is the tree-verify problem for a chain: chunk k
(rows c0..c1 of each request) attends to the request's L + c0 earlier slots as its prefix and to
itself under a lower-triangular mask. `chain_chunks` cuts an extend batch into such verify
batches of at most `max_rows` rows per request, built on the device from slices of the batch's
kv_indices (no host lists, no O(T*L) mask), so every verify implementation serves prefill too:
the CUDA kernel in chunks of 1024 rows (its largest tree), the dense torch path in chunks sized
to its score budget.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple

import torch

from kdtree.engine.decode.metadata import AttentionMetadata, _indptr
from kdtree.kernels.contract import MAX_TREE_NODES

_chain_masks: dict[torch.device, torch.Tensor] = {}


def chain_mask(device: torch.device) -> torch.Tensor:
    """int32 [1024, 32]: row t has bits 0..t set (the packed mask of a 1024-node chain), cached per device."""
    device = torch.device(device)
    mask = _chain_masks.get(device)
    if mask is None:
        t = torch.arange(MAX_TREE_NODES, dtype=torch.int64)[:, None]
        w = torch.arange(MAX_TREE_NODES // 32, dtype=torch.int64)[None, :]
        bits = (t - 32 * w + 1).clamp(0, 32)  # how many low bits of word w row t sets
        words = torch.where(bits >= 32, torch.full_like(bits, 0xFFFFFFFF), (1 << bits) - 1)
        words = torch.where(words >= 1 << 31, words - (1 << 32), words)  # as int32 bit patterns
        mask = _chain_masks[device] = words.to(torch.int32).to(device)
    return mask


class Chunk(NamedTuple):
    """One verify batch of an extend batch: its query rows and its chain-tree metadata."""

    row_start: int  # when `rows` is None, the chunk's rows are q[row_start : row_start + num_rows]
    rows: torch.Tensor | None  # long [n] row ids into the extend batch's q, for a batch of several requests
    num_rows: int
    meta: AttentionMetadata


def chain_chunks(meta: AttentionMetadata, max_rows: int) -> Iterator[Chunk]:
    """The extend batch `meta` as chain-tree verify batches of at most `max_rows` rows per request."""
    if meta.mode != "extend":
        raise ValueError(f"chain_chunks: needs extend metadata, got {meta.mode!r}")
    if not 1 <= max_rows <= MAX_TREE_NODES:
        raise ValueError(f"chain_chunks: max_rows must be in [1, {MAX_TREE_NODES}], got {max_rows}")
    dev = meta.kv_indices.device
    masks = chain_mask(dev)
    q_starts = [0]
    kv_starts = [0]
    for t, n in zip(meta.qo_lens, meta.kv_lens):
        q_starts.append(q_starts[-1] + t)
        kv_starts.append(kv_starts[-1] + n)
    for c0 in range(0, max(meta.qo_lens), max_rows):
        rows, slots, masks_b, lens_q, lens_kv = [], [], [], [], []
        for b, (t_b, n_b) in enumerate(zip(meta.qo_lens, meta.kv_lens)):
            if t_b <= c0:
                continue
            c1 = min(t_b, c0 + max_rows)
            prefix = n_b - t_b
            rows.append((q_starts[b] + c0, q_starts[b] + c1))
            slots.append(meta.kv_indices[kv_starts[b]: kv_starts[b] + prefix + c1])
            lens_q.append(c1 - c0)
            lens_kv.append(prefix + c1)
        words = (max(lens_q) + 31) // 32
        mask = torch.cat([masks[:n, :words] for n in lens_q]).contiguous()
        kv_indices = slots[0] if len(slots) == 1 else torch.cat(slots)
        chunk_meta = AttentionMetadata("verify", _indptr(lens_q, dev), _indptr(lens_kv, dev),
                                       kv_indices.contiguous(), mask, lens_q, lens_kv)
        if len(rows) == 1:
            yield Chunk(rows[0][0], None, lens_q[0], chunk_meta)
        else:
            ids = torch.cat([torch.arange(a, b) for a, b in rows]).to(dev)
            yield Chunk(-1, ids, int(ids.numel()), chunk_meta)


def extend_in_chunks(verify, q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, sm_scale: float,
                     max_rows: int, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Prefill attention through ``verify(q_chunk, kv_cache, chunk_meta, sm_scale) -> [n, H, 512]``."""
    out = torch.empty(q.shape[0], q.shape[1], 512, dtype=out_dtype or q.dtype, device=q.device)
    for chunk in chain_chunks(meta, max_rows):
        if chunk.rows is None:
            a, b = chunk.row_start, chunk.row_start + chunk.num_rows
            out[a:b] = verify(q[a:b], kv_cache, chunk.meta, sm_scale)
        else:
            out[chunk.rows] = verify(q[chunk.rows].contiguous(), kv_cache, chunk.meta, sm_scale)
    return out
