"""The host part of a kernel call, measured without a GPU: `host_call` does on CPU tensors what
`kdtree.kernels.cuda_op.launch` does on the host (validation, the memoised plan, the argument
tuple) against a fake extension, stream and device facts (`fake_state`); `time_calls` times it.
"""

from __future__ import annotations

import time

import torch

from kdtree.kernels import cuda_op
from kdtree.kernels.contract import LATENT_DIM, validate


class FakeExtension:
    """Stands in for the compiled extension: `run` takes the launch arguments and does nothing."""

    def run(self, *args) -> None:
        pass


def fake_state(sm_count: int = 132, capability: tuple[int, int] = (9, 0)) -> cuda_op.DeviceState:
    """A `DeviceState` for CPU runs: fake extension, stream 0, made-up workspace pointers."""
    return cuda_op.DeviceState(index=0, sm_count=sm_count, capability=capability, ext=FakeExtension(),
                               workspace_ptrs=(0x1000, 0x2000), stream=lambda index: 0)


def host_call(case: dict, state: cuda_op.DeviceState, out=None, lse=None) -> torch.Tensor:
    """What `cuda_op.launch` does on the host, for CPU tensors; returns `out`."""
    q = case["q"]
    problem = validate(q, case["kv_cache"], case["qo_indptr"], case["kv_indptr"], case["kv_indices"],
                       case["tree_mask"], case["sm_scale"], out, lse, check_values=False)
    if out is None:
        out = torch.empty(problem.num_rows, problem.num_heads, LATENT_DIM, dtype=q.dtype, device=q.device)
    state.ext.run(cuda_op.launch_args(problem, q, case["kv_cache"], case["qo_indptr"], case["kv_indptr"],
                                       case["kv_indices"], case["tree_mask"], case["sm_scale"], out, lse,
                                       state))
    return out


def time_calls(fn, calls: int, repeats: int = 5) -> float:
    """Best of `repeats` runs of `calls` calls of fn(), in microseconds per call."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6
