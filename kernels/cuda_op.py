"""The owned CUDA kernel behind `kdtree.kernels.tree_verify_mla`: validation, launch plan, call.

The launch plan (how many KV splits, which row tile; `kdtree.kernels.launch_plan`) is chosen
from tensor *shapes* only, so a call never synchronises the device and can be captured in a CUDA
graph. Split partials go to a per-device workspace allocated once, on the first call for that device: warm up before capture.
Pass `out` (and `lse`) to make a call allocation-free.
"""

from __future__ import annotations

from typing import Optional

import torch

from kdtree.kernels.contract import LATENT_DIM, validate
from kdtree.kernels.launch_plan import VARIANTS, WORKSPACE_ROWS, LaunchPlan, plan_launch  # noqa: F401

_workspaces: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
_device_cache: dict[int, tuple[int, tuple[int, int]]] = {}  # index -> (SM count, capability)
_extensions: dict[tuple[int, int], object] = {}


def _device_facts(device: torch.device):
    index = device.index if device.index is not None else torch.cuda.current_device()
    facts = _device_cache.get(index)
    if facts is None:
        props = torch.cuda.get_device_properties(index)
        facts = _device_cache[index] = (props.multi_processor_count, (props.major, props.minor))
    return index, facts[0], facts[1]


def _extension(device_index: int):
    cap = _device_cache[device_index][1] if device_index in _device_cache else \
        torch.cuda.get_device_capability(device_index)
    if cap not in _extensions:
        if cap < (8, 0):
            raise RuntimeError(f"the tree-verify kernel needs sm_80 or newer (mma.sync bf16, cp.async); "
                               f"device {device_index} is sm_{cap[0]}{cap[1]}")
        from kdtree.kernels.jit import load_extension  # noqa: PLC0415

        _extensions[cap] = load_extension([f"sm_{cap[0]}{cap[1]}"])
    return _extensions[cap]


def _workspace(device_index: int, device: torch.device):
    if device_index not in _workspaces:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("tree_verify_mla: call it once before CUDA-graph capture so that its "
                               "split workspace exists (it is allocated on the first call per device)")
        _workspaces[device_index] = (
            torch.empty(WORKSPACE_ROWS, LATENT_DIM, dtype=torch.float32, device=device),
            torch.empty(WORKSPACE_ROWS, dtype=torch.float32, device=device),
        )
    return _workspaces[device_index]


def tree_verify_mla_cuda(q: torch.Tensor, kv_cache: torch.Tensor, qo_indptr: torch.Tensor,
                         kv_indptr: torch.Tensor, kv_indices: torch.Tensor, tree_mask: torch.Tensor,
                         sm_scale: float, *, out: Optional[torch.Tensor] = None,
                         lse: Optional[torch.Tensor] = None) -> torch.Tensor:
    """MLA tree-verify attention with the owned CUDA kernel (the op contract, bf16)."""
    problem = validate(q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale, out, lse)
    if q.device.type != "cuda":
        raise ValueError(f"q: the CUDA kernel needs CUDA tensors, got a tensor on {q.device} "
                         "(use kdtree.kernels.reference or .naive on the CPU)")
    index, sm_count, capability = _device_facts(q.device)
    ext = _extension(index)
    if out is None:
        out = torch.empty(problem.num_rows, problem.num_heads, LATENT_DIM, dtype=q.dtype, device=q.device)
    plan = plan_launch(problem.num_rows, problem.num_heads, problem.batch, problem.mask_words,
                       kv_indices.numel(), sm_count, capability)
    ws_o, ws_lse = _workspace(index, q.device)
    stream = torch.cuda.current_stream(q.device).cuda_stream
    args = (q.data_ptr(), kv_cache.data_ptr(), qo_indptr.data_ptr(), kv_indptr.data_ptr(),
            kv_indices.data_ptr(), tree_mask.data_ptr(), out.data_ptr(),
            lse.data_ptr() if lse is not None else 0, ws_o.data_ptr(), ws_lse.data_ptr(),
            problem.num_rows * problem.num_heads, problem.num_heads, problem.batch, problem.mask_words,
            plan.num_splits, plan.grid_y, plan.variant, float(sm_scale), stream)
    if index == torch.cuda.current_device():
        ext.run(*args)
    else:
        with torch.cuda.device(index):
            ext.run(*args)
    return out
