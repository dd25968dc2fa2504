"""SGLang's Triton target-verify call and ours, on SGLang-format fixtures
(`kdtree.bench.sglang_batches.make_verify_batch`): the pair phase 2's parity gate and the
SGLang GPU tests compare; and what our converter costs against one kernel call (`converter_fraction`)."""

from __future__ import annotations

import statistics
from typing import Any

import torch

from kdtree.bench.sglang_batches import make_verify_batch
from kdtree.bench.timing import QueuedTimer
from kdtree.integrations.sglang.converter import VerifyConverter
from kdtree.integrations.sglang.sglang_kernels import load_extend_attention
from kdtree.kernels import tree_verify_mla


def sglang_extend_attention():
    """(SGLang's own ``extend_attention_fwd`` from the installed wheel, how it was loaded), or ImportError."""
    return load_extend_attention()


def sglang_triton_verify(fx: dict[str, Any], extend_attention_fwd) -> Any:
    """SGLang's Triton target-verify call on a fixture, exactly as ``TritonAttnBackend.forward_extend``
    makes it for an MLA layer (its pool already holds the prefix; k/v of the drafts passed in)."""
    q, k, v, pool = fx["q"], fx["k_extend"], fx["v_extend"], fx["pool"]
    o = torch.empty(q.shape[0], q.shape[1], 512, dtype=q.dtype, device=q.device)
    extend_attention_fwd(q, k.contiguous(), v.contiguous(), o, pool, pool[..., :512], fx["qo_indptr"],
                         fx["kv_indptr"], fx["kv_indices"], fx["custom_mask"], True, fx["mask_indptr"],
                         fx["num_draft_tokens"], 1.0, 1.0, fx["sm_scale"])
    return o


def kdtree_sglang_verify(fx: dict[str, Any], converter, op, out) -> None:
    """What the SGLang backend does on a target-verify MLA layer: write the drafts' KV into the
    pool, convert SGLang's metadata (`VerifyConverter`), run the op on the pool."""
    pool = fx["pool"]
    pool[fx["out_cache_loc"]] = fx["k_extend"]
    meta = converter.convert(fx["qo_indptr"], fx["kv_indptr"], fx["kv_indices"], fx["out_cache_loc"],
                             fx["custom_mask"], fx["mask_indptr"])
    op(fx["q"], pool.view(pool.shape[0], 576), meta.qo_indptr, meta.kv_indptr, meta.kv_indices, meta.tree_mask,
       fx["sm_scale"], out=out)


def converter_fraction(context: int, batch: int, heads: int = 16, tree: int = 64,
                       repeats: int = 20, device: str = "cuda") -> dict[str, float]:
    """The SGLang converter's GPU time against one kernel call's on the same verify batch (CUDA events,
    each call queued behind a busy-wait); the converter's eager time (host launch included) too."""
    fx = make_verify_batch(heads, [context] * batch, tree, seed=context, device=device)
    conv = VerifyConverter(batch, batch * tree, tree, batch * (context + tree), device)
    args = (fx["qo_indptr"], fx["kv_indptr"], fx["kv_indices"], fx["out_cache_loc"], fx["custom_mask"], fx["mask_indptr"])
    pool = fx["pool"].view(-1, 576)
    out = torch.empty(fx["q"].shape[0], heads, 512, dtype=torch.bfloat16, device=device)

    meta = conv.convert(*args)

    def run_kernel():
        tree_verify_mla(fx["q"], pool, meta.qo_indptr, meta.kv_indptr, meta.kv_indices, meta.tree_mask,
                        fx["sm_scale"], out=out)

    for _ in range(3):
        conv.convert(*args)
        run_kernel()
    gpu = QueuedTimer(lead_s=200e-6)  # GPU time: each call queued behind a busy-wait
    eager = QueuedTimer()  # host launch time included, as an eager step pays it
    conv_ms = statistics.median(gpu(lambda: conv.convert(*args)) for _ in range(repeats)) * 1e3
    kern_ms = statistics.median(gpu(run_kernel) for _ in range(repeats)) * 1e3
    conv_eager_ms = statistics.median(eager(lambda: conv.convert(*args)) for _ in range(repeats)) * 1e3
    return {"converter_ms": conv_ms, "kernel_ms": kern_ms, "fraction": conv_ms / kern_ms,
            "converter_eager_ms": conv_eager_ms, "eager_fraction": conv_eager_ms / kern_ms}
