"""The implementations the shared accuracy suite runs, with the bounds each must meet.

Adding one is one line in IMPLS, e.g. the CUDA kernel:

    Impl("cuda", "kdtree.kernels:tree_verify_mla", torch.bfloat16, rel_l2=1e-2, max_abs=4e-2, lse_abs=1e-3, gpu=True),

Bounds are against the fp64 dense oracle of `kernel_cases.dense_truth` computed from the same
(rounded) inputs: ``rel_l2`` on ‖out − truth‖/‖truth‖, ``max_abs`` on max|out − truth| / max|truth|,
``lse_abs`` on max|lse − truth|.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Optional

import torch


@dataclass(frozen=True)
class Impl:
    name: str
    target: str  # "module:function", imported on first use
    dtype: torch.dtype  # the input dtype it is tested in
    rel_l2: float
    max_abs: float
    lse_abs: float
    gpu: bool = False  # needs a CUDA GPU: runs on CUDA tensors, skipped without one
    variant: Optional[str] = None  # a forced CUDA kernel variant: skipped on a GPU that cannot run it
    triton: bool = False  # CUDA when there is a GPU, else CPU under TRITON_INTERPRET=1 (tiny cases)

    def fn(self):
        module, attr = self.target.split(":")
        return getattr(importlib.import_module(module), attr)

    def device(self) -> Optional[str]:
        """Where it runs here, or None when it cannot run in this process."""
        if self.gpu:
            if not torch.cuda.is_available():
                return None
            if self.variant is not None:
                from kdtree.kernels.launch_plan import runnable_variants  # noqa: PLC0415

                if self.variant not in runnable_variants(torch.cuda.get_device_capability()):
                    return None
            return "cuda"
        if self.triton:
            if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
                return "cpu"
            return "cuda" if torch.cuda.is_available() else None
        return "cpu"

    def skip_reason(self) -> str:
        if self.gpu and self.variant is not None and torch.cuda.is_available():
            cap = torch.cuda.get_device_capability()
            return f"variant {self.variant} does not run on sm_{cap[0]}{cap[1]} (launch_plan.runnable_variants)"
        if self.gpu:
            return "needs a CUDA GPU"
        return ("triton without a GPU runs only under TRITON_INTERPRET=1 "
                "(test_kernel_triton_interpreted.py runs these cases in a child process)")

    def runs_case(self, case) -> bool:
        """The interpreter is slow: on CPU the Triton baseline gets the tiny cases only."""
        return not (self.triton and self.device() == "cpu" and not case.tiny)


IMPLS = [
    Impl("reference-fp32", "kdtree.kernels.reference:tree_verify_mla_reference", torch.float32,
         rel_l2=1e-5, max_abs=1e-5, lse_abs=1e-4),
    Impl("reference-bf16", "kdtree.kernels.reference:tree_verify_mla_reference", torch.bfloat16,
         rel_l2=4e-3, max_abs=8e-3, lse_abs=1e-6),
    Impl("naive-fp32", "kdtree.kernels.naive:tree_verify_mla_naive", torch.float32,
         rel_l2=1e-5, max_abs=1e-5, lse_abs=1e-4),
    # naive rounds the scores to bf16 before the softmax: measured up to 6.7e-3 rel-L2, so 1.5e-2
    Impl("naive-bf16", "kdtree.kernels.naive:tree_verify_mla_naive", torch.bfloat16,
         rel_l2=1.5e-2, max_abs=4e-2, lse_abs=4e-2),
    Impl("triton", "kdtree.kernels.triton_baseline:tree_verify_mla_triton", torch.bfloat16,
         rel_l2=1e-2, max_abs=4e-2, lse_abs=1e-3, triton=True),
    Impl("cuda", "kdtree.kernels:tree_verify_mla", torch.bfloat16, rel_l2=1e-2, max_abs=4e-2, lse_abs=1e-3, gpu=True),
    *(Impl(f"cuda-{v}", f"cuda_variants:tree_verify_mla_{v}", torch.bfloat16,
           rel_l2=1e-2, max_abs=4e-2, lse_abs=1e-3, gpu=True, variant=v) for v in ("base16", "base32", "ws", "wgmma")),
    *(Impl(f"cuda-{v}-split3", f"cuda_variants:tree_verify_mla_{v}_split3", torch.bfloat16,
           rel_l2=1e-2, max_abs=4e-2, lse_abs=1e-3, gpu=True, variant=v) for v in ("base16", "base32", "ws", "wgmma")),
    # the same kernels reading run-length KV metadata (kdtree.kernels.runs) instead of kv_indices;
    # the cases' slots are a random permutation, so nearly every key is its own run
    Impl("cuda-runs", "cuda_variants:tree_verify_mla_runs", torch.bfloat16,
         rel_l2=1e-2, max_abs=4e-2, lse_abs=1e-3, gpu=True),
    *(Impl(f"cuda-runs-{v}-split3", f"cuda_variants:tree_verify_mla_runs_{v}_split3", torch.bfloat16,
           rel_l2=1e-2, max_abs=4e-2, lse_abs=1e-3, gpu=True, variant=v) for v in ("base16", "base32", "ws", "wgmma")),
]

BY_NAME = {impl.name: impl for impl in IMPLS}
