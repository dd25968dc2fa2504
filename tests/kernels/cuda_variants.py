"""Each CUDA kernel variant as its own callable, for the shared accuracy suite.

`kdtree.kernels.tree_verify_mla` picks a variant from the shapes; these force one through the
launch's ``variant`` argument (`kdtree.kernels.cuda_op.launch`), so every specialisation meets
the same bounds on every case, not only on the shapes the dispatcher would send it. The
``_split3`` ones also force three KV splits, so short cases go through the split-combine pass.
"""

from __future__ import annotations

from kdtree.kernels.launch_plan import VARIANTS


def forcing(variant: str, num_splits: int | None = None):
    """The op-contract callable of the CUDA kernel with ``variant`` (and ``num_splits``) forced."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}: expected one of {sorted(VARIANTS)}")

    def call(*args, **kwargs):
        from kdtree.kernels.cuda_op import launch  # noqa: PLC0415

        return launch(*args, **kwargs, variant=variant, num_splits=num_splits)

    call.__name__ = f"tree_verify_mla_{variant}" + (f"_split{num_splits}" if num_splits else "")
    return call


for _name in VARIANTS:
    globals()[f"tree_verify_mla_{_name}"] = forcing(_name)
    globals()[f"tree_verify_mla_{_name}_split3"] = forcing(_name, 3)
