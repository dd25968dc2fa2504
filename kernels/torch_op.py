"""The kernel as a PyTorch operator: ``torch.ops.kdtree.tree_verify_mla``.

    torch.ops.kdtree.tree_verify_mla(q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask,
                                     sm_scale, out, lse) -> None

The schema is the op contract (docs/design.md section 3) with ``out`` required and both
``out`` and ``lse`` (optional) written in place, declared as mutated (``Tensor(a!) out,
Tensor(b!)? lse``), so functionalization keeps the writes and re-inplaces them. The fake
implementation checks shapes and dtypes with the contract's own messages and writes nothing;
the CUDA implementation is `kdtree.kernels.cuda_op.launch`.

`kdtree.kernels.tree_verify_mla` calls the operator while torch.compile traces it (Dynamo then
records one opaque node that Inductor and CUDA graphs keep whole) and the launcher directly
otherwise, which saves the dispatcher's host time on every eager call. Under
``torch.compile(mode="reduce-overhead")``, let the compiled region allocate ``out`` (pass
none): CUDA graph trees skip a graph that writes into one of its inputs.
"""

from __future__ import annotations

from typing import Optional

import torch

from kdtree.kernels.contract import validate

__all__ = ["OP_NAME", "tree_verify_mla_op"]

OP_NAME = "kdtree::tree_verify_mla"


@torch.library.custom_op(OP_NAME, mutates_args=("out", "lse"))
def tree_verify_mla_op(q: torch.Tensor, kv_cache: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                       kv_indices: torch.Tensor, tree_mask: torch.Tensor, sm_scale: float, out: torch.Tensor,
                       lse: Optional[torch.Tensor]) -> None:
    """Write the tree-verify attention of the call into ``out`` (and ``lse``); see the module docstring."""
    from kdtree.kernels.cuda_op import launch  # noqa: PLC0415 - needs nvcc and a GPU on first call

    launch(q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale, out=out, lse=lse)


@tree_verify_mla_op.register_fake
def _fake(q: torch.Tensor, kv_cache: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
          kv_indices: torch.Tensor, tree_mask: torch.Tensor, sm_scale: float, out: torch.Tensor,
          lse: Optional[torch.Tensor]) -> None:
    validate(q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, float(sm_scale), out, lse,
             check_values=False)
