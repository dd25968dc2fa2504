"""Input validation for the op contract (docs/design.md section 3), shared by every implementation.

Shape, dtype, device and contiguity checks are free and always run. Checks on index *values*
(indptr monotonicity, T_b bounds, every mask row holding its own node, slot ids in range) need
the indices on the host: they always run for CPU tensors and, for CUDA tensors, only in debug
mode (``KDTREE_DEBUG=1`` or `set_debug(True)`), since they synchronise the device and cannot run
inside CUDA-graph capture.
"""

from __future__ import annotations

from typing import NamedTuple, NoReturn, Optional

import torch

from kdtree import envvars

LATENT_DIM = 512
ROPE_DIM = 64
QK_DIM = LATENT_DIM + ROPE_DIM  # 576
MAX_HEADS = 128
MAX_TREE_NODES = 1024
_INDEX_DTYPES = (torch.int32,)
_LSE_DTYPES = (torch.float32,)

_debug = envvars.KDTREE_DEBUG.is_on()


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
             check_values: Optional[bool] = None, kv_runs=None) -> Problem:
    """Check the call against the contract; raise ValueError naming the argument on any breach.

    `check_values` forces the index-value checks on or off; by default they run for CPU inputs
    and, in debug mode, for CUDA ones (module docstring). `kv_runs` (a
    `kdtree.kernels.runs.KVRuns`) stands in for kv_indices, which must then be None.
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
    if kv_runs is None:
        _check_tensor(kv_indices, "kv_indices", _INDEX_DTYPES, 1, dev)
    else:
        if kv_indices is not None:
            _fail("kv_indices", "pass kv_indices or kv_runs, not both (kv_runs replaces the per-key slot ids)")
        _check_runs(kv_runs, dev)
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
    if kv_runs is not None and kv_runs.indptr.numel() != entries:
        _fail("kv_runs", f"indptr has {kv_runs.indptr.numel()} entries but qo_indptr has {entries} (both B+1)")
    if check_values:
        if kv_runs is None:
            validate_values(problem, qo_indptr, kv_indptr, kv_indices, tree_mask)
        else:
            validate_values(problem, qo_indptr, kv_indptr, None, tree_mask, num_kv=kv_runs.num_kv)
            validate_run_values(problem, kv_indptr, kv_runs)
    return problem


def _check_runs(kv_runs, dev: torch.device) -> None:
    if not (isinstance(kv_runs, tuple) and hasattr(kv_runs, "num_kv")):
        _fail("kv_runs", f"expected a kdtree.kernels.runs.KVRuns, got {type(kv_runs).__name__}")
    for name in ("indptr", "start", "pos"):
        _check_tensor(getattr(kv_runs, name), f"kv_runs.{name}", _INDEX_DTYPES, 1, dev)
    if kv_runs.start.numel() != kv_runs.pos.numel():
        _fail("kv_runs", f"start has {kv_runs.start.numel()} runs but pos has {kv_runs.pos.numel()}")
    if not (isinstance(kv_runs.num_kv, int) and kv_runs.num_kv >= 0):
        _fail("kv_runs", f"num_kv must be a non-negative int (kv_indptr[B]), got {kv_runs.num_kv!r}")


def validate_run_values(p: Problem, kv_indptr, kv_runs) -> None:
    """The value checks of run-length metadata (host copies; synchronises a CUDA device): every
    non-empty request has runs, each starting at its key 0 and then at increasing keys below its N,
    and every run's slots lie inside the pool."""
    n = kv_indptr.cpu().to(torch.int64)
    n = n[1:] - n[:-1]
    ri = kv_runs.indptr.cpu().to(torch.int64)
    start = kv_runs.start.cpu().to(torch.int64)
    pos = kv_runs.pos.cpu().to(torch.int64)
    _need(int(ri[0]) == 0 and bool((ri[1:] >= ri[:-1]).all()), "kv_runs",
          "indptr must start at 0 and be non-decreasing")
    _need(int(ri[-1]) == start.numel(), "kv_runs", f"indptr ends at {int(ri[-1])} but there are {start.numel()} runs")
    for b in range(n.numel()):
        lo, hi, nb = int(ri[b]), int(ri[b + 1]), int(n[b])
        _need((hi > lo) == (nb > 0), "kv_runs", f"request {b} has {nb} keys but {hi - lo} runs")
        if hi == lo:
            continue
        pb = pos[lo:hi]
        _need(int(pb[0]) == 0, "kv_runs", f"request {b}'s first run starts at key {int(pb[0])}, not 0")
        _need(bool((pb[1:] > pb[:-1]).all()) and int(pb[-1]) < nb, "kv_runs",
              f"request {b}'s run positions must increase and stay below its {nb} keys")
        length = torch.diff(pb, append=torch.tensor([nb]))
        sb = start[lo:hi]
        _need(bool((sb >= 0).all()) and bool((sb + length <= p.pool_slots).all()), "kv_runs",
              f"request {b} has a run outside the pool's {p.pool_slots} slots")


def validate_values(p: Problem, qo_indptr, kv_indptr, kv_indices, tree_mask, num_kv: Optional[int] = None) -> None:
    """The checks that read index values (host copies; synchronises a CUDA device). With
    kv_indices None (run-length metadata), `num_kv` is what kv_indptr must end at."""
    qo = qo_indptr.cpu().to(torch.int64)
    kv = kv_indptr.cpu().to(torch.int64)
    _need(int(qo[0]) == 0, "qo_indptr", f"must start at 0, got {int(qo[0])}")
    _need(int(kv[0]) == 0, "kv_indptr", f"must start at 0, got {int(kv[0])}")
    t = qo[1:] - qo[:-1]
    n = kv[1:] - kv[:-1]
    _need(bool((t >= 1).all()), "qo_indptr", "must be strictly increasing (every request needs T_b >= 1)")
    _need(bool((n >= 0).all()), "kv_indptr", "must be non-decreasing")
    _need(int(qo[-1]) == p.num_rows, "qo_indptr", f"ends at {int(qo[-1])} but q has {p.num_rows} rows")
    total = kv_indices.numel() if kv_indices is not None else num_kv
    _need(int(kv[-1]) == total, "kv_indptr",
          f"ends at {int(kv[-1])} but kv_indices has {total} entries" if kv_indices is not None else
          f"ends at {int(kv[-1])} but kv_runs.num_kv is {total}")
    t_max = int(t.max())
    _need(t_max <= MAX_TREE_NODES, "qo_indptr", f"a request has T_b = {t_max} > the supported {MAX_TREE_NODES}")
    _need(t_max <= 32 * p.mask_words, "tree_mask",
          f"{p.mask_words} words per row hold {32 * p.mask_words} nodes but a request has T_b = {t_max}")
    bad = torch.nonzero(n < t).flatten()
    _need(bad.numel() == 0, "kv_indptr",
          f"request {int(bad[0]) if bad.numel() else -1} has fewer slots than tree nodes (need L_b + T_b >= T_b)")
    if kv_indices is not None and kv_indices.numel():
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
    # and no row may name a node past its request's tree (bits T_b.. of every row are zero)
    tb = torch.repeat_interleave(t, t)
    kept = (tb.unsqueeze(1) - 32 * torch.arange(p.mask_words).unsqueeze(0)).clamp(0, 32)
    stray = words & ~((torch.ones_like(kept) << kept) - 1) & 0xFFFFFFFF
    bad_rows = torch.nonzero(stray.any(dim=1)).flatten()
    if bad_rows.numel():
        row = int(bad_rows[0])
        word = int(torch.nonzero(stray[row]).flatten()[0])
        bit = 32 * word + (int(stray[row, word]) & -int(stray[row, word])).bit_length() - 1
        _fail("tree_mask", f"row {row} sets bit {bit}, past its request's {int(tb[row])} tree nodes "
                           "(bits T_b and above must be zero)")


def allocate_outputs(q: torch.Tensor, out: Optional[torch.Tensor], lse: Optional[torch.Tensor],
                     want_lse: bool = False):
    """Return (out, lse), allocating `out` when the caller passed none."""
    if out is None:
        out = torch.empty(q.shape[0], q.shape[1], LATENT_DIM, dtype=q.dtype, device=q.device)
    return out, lse
