"""Each CUDA kernel variant as its own callable, for the shared accuracy suite.

`kdtree.kernels.tree_verify_mla` picks a variant from the shapes; these force one through the
plan's ``variant`` (`kdtree.bench.forced`: ``plan(..., variant=)`` then ``launch(plan=)``), so every specialisation meets
the same bounds on every case, not only on the shapes the dispatcher would send it. The
``_split3`` ones also force three KV splits, so short cases go through the split-combine pass.
"""

from __future__ import annotations

from kdtree.bench.forced import forced_kernel
from kdtree.kernels.launch_plan import VARIANTS


def forcing(variant: str, num_splits: int | None = None):
    """The op-contract callable of the CUDA kernel with ``variant`` (and ``num_splits``) forced."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}: expected one of {sorted(VARIANTS)}")

    forced = forced_kernel(variant, num_splits)

    def call(*args, **kwargs):
        return forced(*args, **kwargs)

    call.__name__ = f"tree_verify_mla_{variant}" + (f"_split{num_splits}" if num_splits else "")
    return call


for _name in VARIANTS:
    globals()[f"tree_verify_mla_{_name}"] = forcing(_name)
    globals()[f"tree_verify_mla_{_name}_split3"] = forcing(_name, 3)


def reading_runs(variant: str | None = None, num_splits: int | None = None):
    """The CUDA kernel called with run-length KV metadata (`kdtree.kernels.runs`) built from the
    case's kv_indices, instead of the indices themselves (``variant`` / ``num_splits`` forced)."""
    forced = forced_kernel(variant, num_splits)

    def call(q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale, **kwargs):
        from kdtree.kernels.runs import runs_from_indices  # noqa: PLC0415

        return forced(q, kv_cache, qo_indptr, kv_indptr, None, tree_mask, sm_scale, **kwargs,
                      kv_runs=runs_from_indices(kv_indptr, kv_indices))

    call.__name__ = "tree_verify_mla_runs" + (f"_{variant}" if variant else "") + (
        f"_split{num_splits}" if num_splits else "")
    return call


tree_verify_mla_runs = reading_runs()
for _name in VARIANTS:
    globals()[f"tree_verify_mla_runs_{_name}_split3"] = reading_runs(_name, 3)
