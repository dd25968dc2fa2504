"""MLA tree-verify attention: the op contract (docs/design.md section 3) and its implementations.

    tree_verify_mla(q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale,
                    *, out=None, lse=None) -> out

The kernel's launch is chosen by a plan: ``p = plan(...)`` (or `plan_bucket` for a CUDA-graph
bucket; ``variant=`` / ``num_splits=`` force its choices) then ``tree_verify_mla(..., plan=p)``;
without ``plan=`` the kernel plans the call from its shapes.

Implementations, all with that signature: `tree_verify_mla` (the owned CUDA kernel, built on
first call by `kdtree.kernels.jit`), `reference.tree_verify_mla_reference` (the oracle),
`naive.tree_verify_mla_naive` (plain torch) and `triton_baseline.tree_verify_mla_triton`.
The kernel is also the PyTorch operator ``torch.ops.kdtree.tree_verify_mla``
(`kdtree.kernels.torch_op`), which is what torch.compile records when it traces a call.
`plan` / `plan_bucket` return the `LaunchPlan` of a call or a CUDA-graph bucket, which
``tree_verify_mla(..., plan=plan)`` runs as it is (`cuda_op.launch` adds the graph path's
padded rows and run-length KV metadata).
Importing this package needs no GPU, nvcc or triton, nor torch (without torch its names say
which extra to install; `jit`, `build` and `info` work). The measurement tools (benchmark, roofline,
devcheck, ...) live in `kdtree.tools`; this package is the op and its build.
"""

from __future__ import annotations

from typing import Optional

try:
    import torch
except ModuleNotFoundError as _missing:  # a CPU-only install: the build and info commands need no torch
    if _missing.name != "torch":
        raise
    torch = None

if torch is not None:
    from kdtree.kernels.contract import LATENT_DIM, set_debug
    from kdtree.kernels.launch_plan import LaunchPlan, plan, plan_bucket
    from kdtree.kernels.masks import pack_sglang_custom_mask, pack_tree_masks, tree_mask_from_parents
    from kdtree.kernels.torch_op import tree_verify_mla_op
else:
    def __getattr__(name: str):
        if name in __all__:
            from kdtree.extras import missing  # noqa: PLC0415

            raise missing("torch", f"kdtree.kernels.{name}")
        raise AttributeError(f"module 'kdtree.kernels' has no attribute {name!r}")

__all__ = ["LaunchPlan", "pack_sglang_custom_mask", "pack_tree_masks", "plan", "plan_bucket", "set_debug",
           "tree_mask_from_parents", "tree_verify_mla"]


def tree_verify_mla(q: torch.Tensor, kv_cache: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                    kv_indices: torch.Tensor, tree_mask: torch.Tensor, sm_scale: float, *,
                    out: Optional[torch.Tensor] = None, lse: Optional[torch.Tensor] = None,
                    plan: Optional[LaunchPlan] = None) -> torch.Tensor:
    """The owned CUDA kernel: tree-verify MLA attention of ``q`` over the pool rows each request
    names (bf16 in and out, fp32 accumulation), returned in ``out`` (allocated when None), with
    the log-sum-exp written to ``lse`` when given. Shapes and rules: docs/design.md section 3; a
    breach raises ValueError naming the argument. ``plan`` (`plan` / `plan_bucket`) is launched
    as it is once it is checked against the call's shapes and device; None: planned from the
    shapes. Builds the extension on first call."""
    if torch.compiler.is_compiling():
        if plan is not None:
            raise ValueError("plan: torch.compile traces the operator kdtree::tree_verify_mla, which plans "
                             "its launch from the shapes; call without plan= inside a compiled region")
        if out is None:  # a q of the wrong rank gets the contract's message from the fake implementation
            out = q.new_empty(q.shape[0], q.shape[1], LATENT_DIM) if q.dim() == 3 else q.new_empty(0)
        tree_verify_mla_op(q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale, out, lse)
        return out
    from kdtree.kernels.cuda_op import launch  # noqa: PLC0415 - lazy: needs nvcc + GPU

    return launch(q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale, out=out, lse=lse, plan=plan)
