"""Packed tree masks: the op contract's ``tree_mask`` layout and converters into it.

Bit ``s`` of row ``t`` (word ``s // 32``, bit ``s % 32``) is set iff tree node ``s`` is an
ancestor-or-self of node ``t``. Words are stored as int32 (bit 31 is the sign bit).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from kdtree.kernels.h2d import upload

MAX_TREE_NODES = 1024


def _validate_parents(parents: Sequence[int], where: str = "parents") -> list[int]:
    parents = [int(p) for p in parents]
    if not parents:
        raise ValueError(f"{where}: a tree needs at least its root (parents[0] = -1)")
    if len(parents) > MAX_TREE_NODES:
        raise ValueError(f"{where}: {len(parents)} nodes exceeds the supported maximum of {MAX_TREE_NODES}")
    if parents[0] != -1:
        raise ValueError(f"{where}: parents[0] must be -1 (node 0 is the root), got {parents[0]}")
    for t, p in enumerate(parents[1:], start=1):
        if not 0 <= p < t:
            raise ValueError(f"{where}: parents[{t}] = {p}, but a parent must satisfy 0 <= parents[t] < t")
    return parents


def _requests(parents_per_request) -> list:
    """The batch as a list of per-request parent lists; ValueError for anything else."""
    if isinstance(parents_per_request, (np.ndarray, torch.Tensor)):
        if parents_per_request.ndim != 2:
            raise ValueError(f"parents_per_request: expected one parents row per request (a 2-D array, or a list "
                             f"of lists such as [[-1, 0, 0]]), got a {parents_per_request.ndim}-D array; for one tree "
                             "use tree_mask_from_parents(parents)")
        parents_per_request = parents_per_request.tolist()
    if isinstance(parents_per_request, (str, bytes)) or not isinstance(parents_per_request, Sequence):
        raise ValueError(f"parents_per_request: expected a list with one parents list per request, got "
                         f"{type(parents_per_request).__name__}")
    if not parents_per_request:
        raise ValueError("parents_per_request: the batch is empty (one parents list per request, at least one)")
    for b, parents in enumerate(parents_per_request):
        if isinstance(parents, (int, np.integer)) or (isinstance(parents, (np.ndarray, torch.Tensor)) and parents.ndim != 1):
            raise ValueError(f"parents_per_request[{b}]: expected a list of parent indices, got {parents!r}: pass "
                             "one list per request (e.g. [[-1, 0, 0]]), or use tree_mask_from_parents for one tree")
    return list(parents_per_request)


def ancestor_matrix(parents: Sequence[int]) -> np.ndarray:
    """bool [T, T]: entry (t, s) is True iff s is an ancestor-or-self of t."""
    parents = _validate_parents(parents)
    T = len(parents)
    anc = np.zeros((T, T), dtype=bool)
    for t in range(T):
        anc[t, t] = True
        if parents[t] >= 0:
            anc[t] |= anc[parents[t]]
    return anc


def pack_bool_rows(rows: np.ndarray, words: int) -> np.ndarray:
    """bool [N, T] -> int32 [N, words] with bit s of row n = rows[n, s]."""
    n, t = rows.shape
    if t > 32 * words:
        raise ValueError(f"{t} columns do not fit in {words} 32-bit words")
    padded = np.zeros((n, 32 * words), dtype=np.uint64)
    padded[:, :t] = rows
    weights = (np.uint64(1) << np.arange(32, dtype=np.uint64))
    packed = (padded.reshape(n, words, 32) * weights).sum(axis=2).astype(np.uint32)
    return packed.view(np.int32)


def unpack_bool_rows(packed: torch.Tensor, columns: int) -> torch.Tensor:
    """int32 [N, W] -> bool [N, columns]; the inverse of `pack_bool_rows`."""
    words = packed.to(torch.int64) & 0xFFFFFFFF
    bit = torch.arange(columns, device=packed.device)
    return ((words[:, bit // 32] >> (bit % 32)) & 1).bool()


def tree_mask_from_parents(parents: Sequence[int], device: Optional[torch.device | str] = None) -> torch.Tensor:
    """int32 [T, ceil(T/32)] packed ancestor-or-self mask of one tree (parents[0] = -1, parents[t] < t)."""
    anc = ancestor_matrix(parents)
    T = anc.shape[0]
    return upload(torch.from_numpy(pack_bool_rows(anc, (T + 31) // 32)), device)


def pack_tree_masks(parents_per_request: Sequence[Sequence[int]],
                    device: Optional[torch.device | str] = None) -> torch.Tensor:
    """int32 [Nq, ceil(max T / 32)] for a batch: request b's rows follow request b-1's."""
    trees = [ancestor_matrix(_validate_parents(p, f"parents_per_request[{b}]"))
             for b, p in enumerate(_requests(parents_per_request))]
    words = (max(a.shape[0] for a in trees) + 31) // 32
    return upload(torch.from_numpy(np.concatenate([pack_bool_rows(a, words) for a in trees])), device)



def pack_sglang_custom_mask(custom_mask: torch.Tensor, mask_indptr: torch.Tensor,
                            qo_indptr: torch.Tensor, kv_indptr: torch.Tensor) -> torch.Tensor:
    """Convert SGLang's flattened bool ``custom_mask`` into the packed ``tree_mask``.

    SGLang stores, per request b, a row-major T_b x (L_b + T_b) block starting at
    ``mask_indptr[b]``, prefix columns all True. Returns int32 [Nq, ceil(max T_b / 32)] on the
    device of ``custom_mask``. Runs on the host (it reads the indptrs), so call it once per
    verify batch, outside graph capture.
    """
    for name, t in (("custom_mask", custom_mask), ("mask_indptr", mask_indptr), ("qo_indptr", qo_indptr),
                    ("kv_indptr", kv_indptr)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 1:
            raise ValueError(f"{name}: expected a flat (1-D) tensor, got shape {tuple(t.shape)}")
    qo = qo_indptr.detach().cpu().tolist()
    kv = kv_indptr.detach().cpu().tolist()
    mi = mask_indptr.detach().cpu().tolist()
    if not (len(qo) == len(kv) == len(mi)):
        raise ValueError(f"qo_indptr, kv_indptr and mask_indptr must have the same length, got "
                         f"{len(qo)}, {len(kv)}, {len(mi)}")
    if len(qo) < 2:
        raise ValueError(f"qo_indptr: the batch is empty ({len(qo)} entries; B+1 >= 2 needed, one request at least)")
    if mi[-1] > custom_mask.numel():
        raise ValueError(f"mask_indptr: ends at {mi[-1]} but custom_mask has {custom_mask.numel()} entries")
    flat = custom_mask.detach().to("cpu", torch.bool).numpy()
    t_max = max(qo[b + 1] - qo[b] for b in range(len(qo) - 1))
    words = max(1, (t_max + 31) // 32)
    blocks = []
    for b in range(len(qo) - 1):
        T = qo[b + 1] - qo[b]
        S = kv[b + 1] - kv[b]
        L = S - T
        if T < 0 or L < 0:
            raise ValueError(f"request {b}: T_b = {T}, L_b + T_b = {S}; need 0 <= T_b <= kv length")
        if mi[b + 1] - mi[b] != T * S:
            raise ValueError(f"mask_indptr: request {b} has {mi[b + 1] - mi[b]} entries, expected "
                             f"T_b * (L_b + T_b) = {T * S}")
        block = flat[mi[b]: mi[b + 1]].reshape(T, S)
        if L and not block[:, :L].all():
            raise ValueError(f"custom_mask: request {b} hides part of its prefix; the packed mask "
                             "assumes the prefix is always visible")
        blocks.append(pack_bool_rows(block[:, L:], words))
    return torch.from_numpy(np.concatenate(blocks)).to(custom_mask.device)
