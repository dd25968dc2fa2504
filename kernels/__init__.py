"""MLA tree-verify attention: the op contract (docs/design.md section 3) and its implementations.

    tree_verify_mla(q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale,
                    *, out=None, lse=None) -> out

Implementations, all with that signature: `tree_verify_mla` (the owned CUDA kernel, built on
first call by `kdtree.kernels.jit`), `reference.tree_verify_mla_reference` (the oracle),
`naive.tree_verify_mla_naive` (plain torch) and `triton_baseline.tree_verify_mla_triton`.
`cuda_op.launch` is the kernel's call with its variant and KV split count open (tests, tools);
`plan` / `plan_bucket` return the `LaunchPlan` of a call or a CUDA-graph bucket, which
``launch(..., plan=plan)`` runs as it is.
Importing this package needs no GPU, nvcc or triton. The measurement tools (benchmark, roofline,
devcheck, ...) live in `kdtree.tools`; this package is the op and its build.
"""

from kdtree.kernels.contract import set_debug  # noqa: F401
from kdtree.kernels.launch_plan import LaunchPlan, plan, plan_bucket  # noqa: F401
from kdtree.kernels.masks import pack_sglang_custom_mask, pack_tree_masks, tree_mask_from_parents  # noqa: F401


def tree_verify_mla(q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale, *,
                    out=None, lse=None):
    """The owned CUDA kernel (bf16 in/out, fp32 accumulation). Builds the extension on first call."""
    from kdtree.kernels.cuda_op import launch  # noqa: PLC0415 - lazy: needs nvcc + GPU

    return launch(q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale, out=out, lse=lse)
