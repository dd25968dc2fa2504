"""Input validation for the op contract (docs/design.md section 3), shared by every implementation.

Shape, dtype, device and contiguity checks are free and always run. Checks on index *values*
(indptr monotonicity, T_b bounds, every mask row holding its own node, slot ids in range) need
the indices on the host: they always run for CPU tensors and, for CUDA tensors, only in debug
mode (``KDTREE_DEBUG=1`` or `set_debug(True)`), since they synchronise the device and cannot run
inside CUDA-graph capture.
"""

from __future__ import annotations

import os
from typing import NamedTuple, NoReturn, Optional

import torch

LATENT_DIM = 512
ROPE_DIM = 64
QK_DIM = LATENT_DIM + ROPE_DIM  # 576
MAX_HEADS = 128
MAX_TREE_NODES = 1024
_INDEX_DTYPES = (torch.int32,)
_LSE_DTYPES = (torch.float32,)

_debug = os.environ.get("KDTREE_DEBUG", "") not in ("", "0")


def set_debug(enabled: bool) -> None:
    """Turn the value checks that synchronise the device on or off for CUDA inputs."""
    global _debug
    _debug = bool(enabled)


def debug_enabled() -> bool:
    return _debug


class Problem(NamedTuple):
    """The sizes of one call, read from shapes only (no device sync)."""

    num_rows: int  # Nq
    num_heads: int  # H
    batch: int  # B
    mask_words: int  # W
    pool_slots: int  # S


def _fail(arg: str, msg: str) -> NoReturn:
    raise ValueError(f"{arg}: {msg}")


def _need(cond: bool, arg: str, msg: str) -> None:
    if not cond:
        _fail(arg, msg)


# The checks on every call format their message only when they fail: building the f-strings
# eagerly cost more host time than the kernel launch itself.
def _check_tensor(t: torch.Tensor, arg: str, dtypes: tuple, ndim: int, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor):
        _fail(arg, f"expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        _fail(arg, f"dtype must be one of {[str(d) for d in dtypes]}, got {t.dtype}")
    if t.dim() != ndim:
        _fail(arg, f"expected {ndim} dimensions, got shape {tuple(t.shape)}")
    if t.device != device:
        _fail(arg, f"is on {t.device}, but q is on {device}")
    if not t.is_contiguous():
        _fail(arg, "must be contiguous (call .contiguous())")


def validate(q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale,
             out=None, lse=None, *, float_dtypes=(torch.bfloat16,),
             check_values: Optional[bool] = None) -> Problem:
    """Check the call against the contract; raise ValueError naming the argument on any breach.

    `check_values` forces the index-value checks on or off; by default they run for CPU inputs
    and, in debug mode, for CUDA ones (module docstring).
    """
    if not isinstance(q, torch.Tensor):
        _fail("q", f"expected a torch.Tensor, got {type(q).__name__}")
    dev = q.device
    _check_tensor(q, "q", float_dtypes, 3, dev)
    nq, h, d = q.shape
    if d != QK_DIM:
        _fail("q", f"last dimension must be {QK_DIM} (512 latent + 64 rope), got {d}")
    if not 1 <= h <= MAX_HEADS:
        _fail("q", f"number of heads must be in [1, {MAX_HEADS}], got {h}")
    if nq < 1:
        _fail("q", "needs at least one query row")
    _check_tensor(kv_cache, "kv_cache", (q.dtype,), 2, dev)
    if kv_cache.shape[1] != QK_DIM:
        _fail("kv_cache", f"rows must be {QK_DIM} wide, got {kv_cache.shape[1]}")
    _check_tensor(qo_indptr, "qo_indptr", _INDEX_DTYPES, 1, dev)
    _check_tensor(kv_indptr, "kv_indptr", _INDEX_DTYPES, 1, dev)
    _check_tensor(kv_indices, "kv_indices", _INDEX_DTYPES, 1, dev)
    _check_tensor(tree_mask, "tree_mask", _INDEX_DTYPES, 2, dev)
    entries = qo_indptr.numel()
    if entries < 2:
        _fail("qo_indptr", "needs B+1 >= 2 entries")
    if kv_indptr.numel() != entries:
        _fail("kv_indptr", f"has {kv_indptr.numel()} entries but qo_indptr has {entries} (both B+1)")
    rows, w = tree_mask.shape
    if rows != nq:
        _fail("tree_mask", f"has {rows} rows, q has {nq}")
    if not 1 <= w <= MAX_TREE_NODES // 32:
        _fail("tree_mask", f"needs 1..{MAX_TREE_NODES // 32} words per row, got {w}")
    if not (isinstance(sm_scale, (float, int)) and float(sm_scale) > 0):
        _fail("sm_scale", f"must be a positive float, got {sm_scale!r}")
    if out is not None:
        _check_tensor(out, "out", (q.dtype,), 3, dev)
        if out.shape != (nq, h, LATENT_DIM):
            _fail("out", f"expected shape {(nq, h, LATENT_DIM)}, got {tuple(out.shape)}")
    if lse is not None:
        _check_tensor(lse, "lse", _LSE_DTYPES, 2, dev)
        if lse.shape != (nq, h):
            _fail("lse", f"expected shape {(nq, h)}, got {tuple(lse.shape)}")
    problem = Problem(nq, h, entries - 1, w, kv_cache.shape[0])
    if check_values is None:
        check_values = dev.type == "cpu" or _debug
    if check_values:
        validate_values(problem, qo_indptr, kv_indptr, kv_indices, tree_mask)
    return problem


def validate_values(p: Problem, qo_indptr, kv_indptr, kv_indices, tree_mask) -> None:
    """The checks that read index values (host copies; synchronises a CUDA device)."""
    qo = qo_indptr.cpu().to(torch.int64)
    kv = kv_indptr.cpu().to(torch.int64)
    _need(int(qo[0]) == 0, "qo_indptr", f"must start at 0, got {int(qo[0])}")
    _need(int(kv[0]) == 0, "kv_indptr", f"must start at 0, got {int(kv[0])}")
    t = qo[1:] - qo[:-1]
    n = kv[1:] - kv[:-1]
    _need(bool((t >= 1).all()), "qo_indptr", "must be strictly increasing (every request needs T_b >= 1)")
    _need(bool((n >= 0).all()), "kv_indptr", "must be non-decreasing")
    _need(int(qo[-1]) == p.num_rows, "qo_indptr", f"ends at {int(qo[-1])} but q has {p.num_rows} rows")
    _need(int(kv[-1]) == kv_indices.numel(), "kv_indptr",
          f"ends at {int(kv[-1])} but kv_indices has {kv_indices.numel()} entries")
    t_max = int(t.max())
    _need(t_max <= MAX_TREE_NODES, "qo_indptr", f"a request has T_b = {t_max} > the supported {MAX_TREE_NODES}")
    _need(t_max <= 32 * p.mask_words, "tree_mask",
          f"{p.mask_words} words per row hold {32 * p.mask_words} nodes but a request has T_b = {t_max}")
    bad = torch.nonzero(n < t).flatten()
    _need(bad.numel() == 0, "kv_indptr",
          f"request {int(bad[0]) if bad.numel() else -1} has fewer slots than tree nodes (need L_b + T_b >= T_b)")
    if kv_indices.numel():
        idx = kv_indices.cpu()
        lo, hi = int(idx.min()), int(idx.max())
        _need(lo >= 0 and hi < p.pool_slots, "kv_indices",
              f"slot ids span [{lo}, {hi}] but kv_cache has {p.pool_slots} slots")
    # every row must see its own node
    node = torch.cat([torch.arange(int(tb)) for tb in t])
    words = tree_mask.cpu().to(torch.int64)
    own = (words.gather(1, (node // 32).unsqueeze(1)).squeeze(1) >> (node % 32)) & 1
    missing = torch.nonzero(own == 0).flatten()
    _need(missing.numel() == 0, "tree_mask",
          f"row {int(missing[0]) if missing.numel() else -1} does not include its own node "
          "(bit t of node t must be set)")


def allocate_outputs(q: torch.Tensor, out: Optional[torch.Tensor], lse: Optional[torch.Tensor],
                     want_lse: bool = False):
    """Return (out, lse), allocating `out` when the caller passed none."""
    if out is None:
        out = torch.empty(q.shape[0], q.shape[1], LATENT_DIM, dtype=q.dtype, device=q.device)
    return out, lse
