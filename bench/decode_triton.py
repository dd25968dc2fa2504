"""The Triton backend as SGLang 0.5.23 serves MLA: its own ``extend_attention_fwd`` for target
verify and prefill, its own ``decode_attention_fwd`` for decode (the draft model's passes), as an
engine attention backend (`SGLangTritonBackend`, registered as ``sglang-triton``).

The kernels are SGLang's, loaded from the installed wheel or its kernel files
(`kdtree.integrations.sglang.sglang_kernels`). What SGLang's backend hands them is rebuilt here
on the device from the engine's metadata (`sglang_verify_layout`), with no host sync, so the
backend runs eagerly and inside a CUDA graph alike:

- verify: the prefix slots alone (``kv_indptr`` / ``kv_indices`` without the tree), the tree's
  keys and values as contiguous ``k_extend`` / ``v_extend`` rows, and the boolean custom mask of
  SGLang's layout (per request a T_b x (L_b + T_b) row-major block, prefix columns True) with
  its int64 ``mask_indptr``. Its size is fixed by the host-side shapes of the metadata: inside a
  graph bucket that is SGLang's preallocated verify mask, ``batch x tree x (context + tree)``
  bytes. The prefix columns are filled with one memset and the tree columns scattered from the
  packed ancestor mask (B x T x T cells), as SGLang's tree builder writes them each step.
- decode: the pool as ``k_buffer`` [S, 1, 576] and its first 512 columns as ``v_buffer``,
  ``attn_logits`` / ``attn_lse`` scratch of ``max_kv_splits`` splits and ``num_kv_splits``
  filled with SGLang's default cap (`MAX_KV_SPLITS`, its ``--triton-attention-num-kv-splits``).

The conversion runs once per metadata object (every layer of a step shares it), as SGLang's
backend converts once per forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from kdtree.engine.decode.backends import AttentionBackend
from kdtree.engine.decode.metadata import AttentionMetadata
from kdtree.kernels.contract import LATENT_DIM

BACKEND_NAME = "sglang-triton"
MAX_KV_SPLITS = 8  # SGLang 0.5.23's default --triton-attention-num-kv-splits


@dataclass
class SGLangVerifyLayout:
    """SGLang's target-verify inputs for one batch, on the device (`sglang_verify_layout`)."""

    prefix_indptr: torch.Tensor  # int32 [B+1]: request b's prefix is prefix_indices[prefix_indptr[b]:[b+1]]
    prefix_indices: torch.Tensor  # int32 [sum L_b (host bound)]: prefix slots, compacted
    tree_slots: torch.Tensor  # int64 [rows]: the pool slot of each query row's own node
    custom_mask: Optional[torch.Tensor]  # bool [sum T_b (L_b + T_b) (host bound) + 1]; None: causal chain
    mask_indptr: Optional[torch.Tensor]  # int64 [B+1]


def sglang_verify_layout(meta: AttentionMetadata, rows: int, with_mask: bool = True) -> SGLangVerifyLayout:
    """SGLang's extend-kernel layout of an engine batch (verify or chain), built on the device.

    Sizes come from the host-side ``meta.qo_lens`` / ``meta.kv_lens`` (inside a graph bucket: the
    bucket's maxima), values from the device tensors (the real lengths), so the result is the same
    whether the lengths are exact or a bucket's bound. ``rows``: q's row count (rows past the
    batch's last node map to a junk slot nobody reads)."""
    dev = meta.kv_indices.device
    qo, kv = meta.qo_indptr.long(), meta.kv_indptr.long()
    batch = meta.batch_size
    prefix_indptr = kv - qo
    prefix_cap = max(1, sum(meta.kv_lens) - sum(meta.qo_lens))
    last = max(meta.kv_indices.numel() - 1, 0)

    e = torch.arange(prefix_cap, device=dev)
    owner = torch.searchsorted(prefix_indptr[1:].contiguous(), e, right=True).clamp(max=batch - 1)
    prefix_indices = meta.kv_indices[(e + qo[owner]).clamp(max=last)]

    r = torch.arange(rows, device=dev)
    row_owner = torch.searchsorted(qo[1:].contiguous(), r, right=True).clamp(max=batch - 1)
    # request b's node t sits right after its prefix: kv_indices[kv[b+1] - T_b + t] = [kv[b+1] - qo[b+1] + r]
    tree_slots = meta.kv_indices[(kv[row_owner + 1] - qo[row_owner + 1] + r).clamp(0, last)].long()

    if not with_mask:
        return SGLangVerifyLayout(prefix_indptr.to(torch.int32), prefix_indices, tree_slots, None, None)
    t_len = qo[1:] - qo[:-1]
    l_len = (kv[1:] - kv[:-1]) - t_len
    mask_indptr = torch.zeros(batch + 1, dtype=torch.int64, device=dev)
    mask_indptr[1:] = torch.cumsum(t_len * (l_len + t_len), 0)
    cap = sum(t * k for t, k in zip(meta.qo_lens, meta.kv_lens)) + 1  # + one junk cell
    mask = torch.ones(cap, dtype=torch.bool, device=dev)  # prefix columns: always visible
    t_max = max(meta.qo_lens)
    b_i = torch.arange(batch, device=dev).view(-1, 1, 1)
    t_i = torch.arange(t_max, device=dev).view(1, -1, 1)
    s_i = torch.arange(t_max, device=dev).view(1, 1, -1)
    tb, lb = t_len[b_i], l_len[b_i]
    valid = (t_i < tb) & (s_i < tb)
    cell = mask_indptr[b_i] + t_i * (lb + tb) + lb + s_i
    cell = torch.where(valid, cell, torch.full_like(cell, cap - 1))
    row = (qo[b_i] + t_i).clamp(max=max(meta.tree_mask.shape[0] - 1, 0))
    words = meta.tree_mask[row.expand_as(cell), (s_i // 32).expand_as(cell)]
    bits = torch.bitwise_and(torch.bitwise_right_shift(words, (s_i % 32).to(words.dtype)), 1).bool() & valid
    mask[cell.reshape(-1)] = bits.reshape(-1)
    mask[cap - 1:].zero_()  # a Python scalar written by index would be a host-to-device copy
    return SGLangVerifyLayout(prefix_indptr.to(torch.int32), prefix_indices, tree_slots, mask, mask_indptr)


def load_kernels() -> tuple[Callable, Callable, str]:
    """(extend_attention_fwd, decode_attention_fwd, how they were loaded) from SGLang's wheel."""
    from kdtree.integrations.sglang.sglang_kernels import load_decode_attention, load_extend_attention  # noqa: PLC0415

    extend, how = load_extend_attention()
    decode, _ = load_decode_attention()
    return extend, decode, how


class SGLangTritonBackend(AttentionBackend):
    """SGLang's Triton MLA attention as an engine backend (module docstring): capturable, so
    ``VerifyGraphs(..., backend_factory=lambda bucket: SGLangTritonBackend())`` captures it with
    static buffers sized for each bucket."""

    name = BACKEND_NAME
    requires_cuda = True

    def __init__(self, max_kv_splits: int = MAX_KV_SPLITS, kernels: Optional[tuple[Callable, Callable]] = None):
        if max_kv_splits < 1:
            raise ValueError(f"max_kv_splits must be >= 1, got {max_kv_splits}")
        self.max_kv_splits = max_kv_splits
        self._kernels = kernels
        self._layout_of: Optional[tuple[AttentionMetadata, SGLangVerifyLayout]] = None

    def kernels(self) -> tuple[Callable, Callable]:
        if self._kernels is None:
            try:
                extend, decode, _ = load_kernels()
            except ImportError as err:
                raise RuntimeError(f"attention backend {self.name!r} needs SGLang 0.5.23's Triton kernels: {err}; "
                                   "install the sglang extra or put its kernel files on the path") from err
            self._kernels = (extend, decode)
        return self._kernels

    def layout(self, meta: AttentionMetadata, rows: int, with_mask: bool) -> SGLangVerifyLayout:
        if self._layout_of is None or self._layout_of[0] is not meta:
            self._layout_of = (meta, sglang_verify_layout(meta, rows, with_mask))
        return self._layout_of[1]

    def _extend(self, q, kv_cache, meta, sm_scale, with_mask: bool):
        extend, _ = self.kernels()
        lay = self.layout(meta, q.shape[0], with_mask)
        k_extend = kv_cache[lay.tree_slots].unsqueeze(1)  # the model wrote the new tokens' KV first
        v_extend = k_extend[..., :LATENT_DIM].contiguous()
        out = torch.zeros(q.shape[0], q.shape[1], LATENT_DIM, dtype=q.dtype, device=q.device)
        extend(q, k_extend, v_extend, out, kv_cache.unsqueeze(1), kv_cache[:, :LATENT_DIM].unsqueeze(1),
               meta.qo_indptr, lay.prefix_indptr, lay.prefix_indices, lay.custom_mask, True, lay.mask_indptr,
               max(meta.qo_lens), 1.0, 1.0, float(sm_scale))
        return out

    def forward_verify(self, q, kv_cache, meta, sm_scale):
        return self._extend(q, kv_cache, meta, sm_scale, with_mask=True)

    def forward_extend(self, q, kv_cache, meta, sm_scale):
        return self._extend(q, kv_cache, meta, sm_scale, with_mask=False)  # causal, no mask: SGLang's prefill

    def forward_decode(self, q, kv_cache, meta, sm_scale):
        _, decode = self.kernels()
        batch, heads = q.shape[0], q.shape[1]
        splits = self.max_kv_splits
        out = torch.empty(batch, heads, LATENT_DIM, dtype=q.dtype, device=q.device)
        logits = torch.empty(batch, heads, splits, LATENT_DIM, dtype=torch.float32, device=q.device)
        lse = torch.empty(batch, heads, splits, dtype=torch.float32, device=q.device)
        num_splits = torch.full((batch,), splits, dtype=torch.int32, device=q.device)
        decode(q, kv_cache.unsqueeze(1), kv_cache[:, :LATENT_DIM].unsqueeze(1), out, meta.kv_indptr, meta.kv_indices,
               logits, lse, num_splits, splits, float(sm_scale), 1.0, 1.0)
        keys = (meta.kv_indptr[1:] - meta.kv_indptr[:-1]).view(-1, 1, 1)
        return torch.where(keys > 0, out, torch.zeros_like(out))  # graph-padding requests own no keys


def graph_factory(max_kv_splits: int = MAX_KV_SPLITS):
    """A `VerifyGraphs` / `DraftGraphs` backend factory: one SGLang Triton backend per bucket, its
    buffers allocated during capture at the bucket's sizes."""
    return lambda bucket: SGLangTritonBackend(max_kv_splits)
