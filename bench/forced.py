"""The CUDA kernel with its launch choices forced, as an op-contract callable: what the tests,
the tools' ``--variant`` / ``--splits`` and the sm_120 path of phase 1 time and check.

A forced choice is a plan's: each call plans its shapes with ``kdtree.kernels.plan(...,
variant=, num_splits=)`` on q's device (memoised per shapes and device) and launches that plan.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

PLAN_CACHE_SIZE = 1024


def forced_kernel(variant: Optional[str] = None, num_splits: Optional[int] = None) -> Callable[..., Any]:
    """``fn(q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale, *, out=None,
    lse=None, kv_runs=None, padded_rows=False)``: the CUDA kernel launched with the plan of the
    call's shapes, ``variant`` (a name of `kdtree.kernels.launch_plan.VARIANTS`) and ``num_splits``
    forced (kept as its attributes ``variant`` / ``num_splits``); both None: the default dispatch. A variant the device cannot run is refused with the
    planner's ValueError."""
    from kdtree.kernels.launch_plan import VARIANTS  # noqa: PLC0415

    if variant is not None and variant not in VARIANTS:
        raise ValueError(f"variant {variant!r}: expected one of {sorted(VARIANTS)}")
    plans: dict[tuple, Any] = {}

    def call(q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale, *, out=None, lse=None,
             kv_runs=None, padded_rows: bool = False):
        from kdtree.kernels import plan as make_plan  # noqa: PLC0415
        from kdtree.kernels.cuda_op import launch  # noqa: PLC0415

        held = None
        key = _shapes(q, qo_indptr, kv_indices, tree_mask, kv_runs) if (
            variant is not None or num_splits is not None) else None
        if key is not None:  # None: not a CUDA call of the contract's shapes, which launch refuses by name
            held = plans.get(key)
            if held is None:
                if len(plans) >= PLAN_CACHE_SIZE:
                    plans.clear()
                held = plans[key] = make_plan(*key[:5], key[5], variant=variant, num_splits=num_splits)
        return launch(q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale, out=out, lse=lse,
                      plan=held, kv_runs=kv_runs, padded_rows=padded_rows)

    call.variant, call.num_splits = variant, num_splits  # type: ignore[attr-defined]
    call.__name__ = "tree_verify_mla" + (f"_{variant}" if variant else "") + (
        f"_split{num_splits}" if num_splits else "")
    return call


def _shapes(q, qo_indptr, kv_indices, tree_mask, kv_runs) -> Optional[tuple]:
    """(rows, heads, requests, mask words, keys, device index) of a CUDA call, or None."""
    try:
        if not q.is_cuda or q.dim() != 3 or tree_mask.dim() != 2 or qo_indptr.numel() < 2:
            return None
        num_kv = kv_indices.numel() if kv_runs is None else kv_runs.num_kv
        return q.shape[0], q.shape[1], qo_indptr.numel() - 1, tree_mask.shape[1], num_kv, q.get_device()
    except (AttributeError, TypeError):
        return None


SM120_CAPABILITY = (12, 0)
_SM120: dict[str, Callable[..., Any]] = {}  # variant -> its forced kernel


def sm120_variant(num_rows: int, num_heads: int, batch: int) -> str:
    """The variant name compute capability 12.0 dispatches for these shapes (`launch_plan.choose_variant`)."""
    from kdtree.kernels.launch_plan import choose_variant, variant_name  # noqa: PLC0415

    return variant_name(choose_variant(num_rows * num_heads / max(batch, 1), SM120_CAPABILITY))


def sm120_path(q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale, *, out=None, lse=None):
    """The sm_120 path: the op contract launched, on this device, with the variant an sm_120 device
    picks for these shapes (`sm120_variant`), through its plan."""
    variant = sm120_variant(q.shape[0], q.shape[1], qo_indptr.shape[0] - 1)
    if variant not in _SM120:
        _SM120[variant] = forced_kernel(variant)
    return _SM120[variant](q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale, out=out, lse=lse)
