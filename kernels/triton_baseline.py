"""The Triton baseline: tree verify the way engines run it today (docs/design.md section 3b).

Written in the style of SGLang's ``extend_attention_fwd`` target-verify path: one program per
(request, head, block of 32 tree nodes), 64-key tiles, 8 warps, one pipeline stage. Each program
streams the request's scattered prefix slots (slot ids from ``kv_indices``, rows gathered from
``kv_cache`` with int64 offsets) with an online softmax, then the tree slots under the packed
mask. The head dim is split 512 + 64 (two dot products per tile), the values are the first 512
dims, loaded again per tile. Every head re-reads the shared latent: this is the cost sm_120
users pay now, so it is kept as is rather than tuned.

The launch reads only shapes (the grid covers the largest possible tree; programs past a
request's T_b exit at once), so it can be captured in a CUDA graph. Triton is imported on the
first call: importing this module never needs it.
"""

from __future__ import annotations

import os
from typing import Optional

import torch

from kdtree.kernels.contract import LATENT_DIM, ROPE_DIM, allocate_outputs, validate

BLOCK_M = 32
BLOCK_N = 64
NUM_WARPS = 8
NUM_STAGES = 1

_kernels: dict = {}


def _build_kernel():
    try:
        import triton
        import triton.language as tl
    except ImportError as exc:
        raise ImportError("tree_verify_mla_triton needs triton (pip install triton); "
                          f"importing it failed: {exc}") from exc

    # DOT_F32 is set only under the interpreter: triton's interpreter (3.8 at least) multiplies
    # the raw uint16 bit patterns in a bf16 tl.dot, so operands are widened there first (exact:
    # bf16 products are representable in fp32). On a GPU the dots stay bf16 with fp32 accumulation.
    @triton.jit
    def _tree_verify_kernel(
        Q, KV, QO_INDPTR, KV_INDPTR, KV_INDICES, MASK, OUT, LSE, sm_scale,
        stride_qt, stride_qh, stride_kv, stride_ot, stride_oh, stride_lt, mask_words,
        HAS_LSE: tl.constexpr, DOT_F32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_DMODEL: tl.constexpr, BLOCK_DPE: tl.constexpr, BLOCK_DV: tl.constexpr,
    ):
        b = tl.program_id(0)
        h = tl.program_id(1)
        m_block = tl.program_id(2)
        q_start = tl.load(QO_INDPTR + b)
        T = tl.load(QO_INDPTR + b + 1) - q_start
        if m_block * BLOCK_M >= T:
            return
        kv_start = tl.load(KV_INDPTR + b)
        L = tl.load(KV_INDPTR + b + 1) - kv_start - T

        offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = offs_m < T
        rows = (q_start + offs_m).to(tl.int64)
        offs_d = tl.arange(0, BLOCK_DMODEL)
        offs_dpe = BLOCK_DMODEL + tl.arange(0, BLOCK_DPE)
        offs_dv = tl.arange(0, BLOCK_DV)
        offs_n = tl.arange(0, BLOCK_N)

        q_row = Q + rows[:, None] * stride_qt + h * stride_qh
        q = tl.load(q_row + offs_d[None, :], mask=row_ok[:, None], other=0.0)
        qpe = tl.load(q_row + offs_dpe[None, :], mask=row_ok[:, None], other=0.0)
        if DOT_F32:
            q = q.to(tl.float32)
            qpe = qpe.to(tl.float32)

        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

        # stage 1: the prefix, always visible
        for start_n in range(0, L, BLOCK_N):
            cols = start_n + offs_n
            col_ok = cols < L
            slot = tl.load(KV_INDICES + kv_start + cols, mask=col_ok, other=0).to(tl.int64)
            k_ptr = KV + slot[None, :] * stride_kv
            k = tl.load(k_ptr + offs_d[:, None], mask=col_ok[None, :], other=0.0)
            kpe = tl.load(k_ptr + offs_dpe[:, None], mask=col_ok[None, :], other=0.0)
            if DOT_F32:
                k = k.to(tl.float32)
                kpe = kpe.to(tl.float32)
            qk = tl.dot(q, k) + tl.dot(qpe, kpe)
            qk = qk * sm_scale
            qk = tl.where(col_ok[None, :], qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(qk - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            v = tl.load(KV + slot[:, None] * stride_kv + offs_dv[None, :], mask=col_ok[:, None], other=0.0)
            p_lo = p.to(KV.dtype.element_ty)
            if DOT_F32:
                v = v.to(tl.float32)
                p_lo = p_lo.to(tl.float32)
            acc = acc * alpha[:, None] + tl.dot(p_lo, v)
            l_i = l_i * alpha + tl.sum(p, 1)
            m_i = m_new

        # stage 2: the tree slots, visible where the packed mask has the node's bit
        mask_row = MASK + (q_start + offs_m) * mask_words
        for start_n in range(0, T, BLOCK_N):
            cols = start_n + offs_n
            col_ok = cols < T
            slot = tl.load(KV_INDICES + kv_start + L + cols, mask=col_ok, other=0).to(tl.int64)
            k_ptr = KV + slot[None, :] * stride_kv
            k = tl.load(k_ptr + offs_d[:, None], mask=col_ok[None, :], other=0.0)
            kpe = tl.load(k_ptr + offs_dpe[:, None], mask=col_ok[None, :], other=0.0)
            if DOT_F32:
                k = k.to(tl.float32)
                kpe = kpe.to(tl.float32)
            qk = tl.dot(q, k) + tl.dot(qpe, kpe)
            qk = qk * sm_scale
            words = tl.load(mask_row[:, None] + cols[None, :] // 32,
                            mask=row_ok[:, None] & col_ok[None, :], other=0)
            seen = ((words >> (cols[None, :] % 32)) & 1) != 0
            qk = tl.where(seen, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(qk - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            v = tl.load(KV + slot[:, None] * stride_kv + offs_dv[None, :], mask=col_ok[:, None], other=0.0)
            p_lo = p.to(KV.dtype.element_ty)
            if DOT_F32:
                v = v.to(tl.float32)
                p_lo = p_lo.to(tl.float32)
            acc = acc * alpha[:, None] + tl.dot(p_lo, v)
            l_i = l_i * alpha + tl.sum(p, 1)
            m_i = m_new

        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        o = acc / l_safe[:, None]
        tl.store(OUT + rows[:, None] * stride_ot + h * stride_oh + offs_dv[None, :],
                 o.to(OUT.dtype.element_ty), mask=row_ok[:, None])
        if HAS_LSE:
            tl.store(LSE + rows * stride_lt + h, m_i + tl.log(l_safe), mask=row_ok)

    return _tree_verify_kernel


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _kernel():
    # triton picks the interpreter when a kernel is decorated, so keep one kernel per mode.
    mode = _interpreting()
    if mode not in _kernels:
        _kernels[mode] = _build_kernel()
    return _kernels[mode]


def tree_verify_mla_triton(q: torch.Tensor, kv_cache: torch.Tensor, qo_indptr: torch.Tensor,
                           kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                           tree_mask: torch.Tensor, sm_scale: float, *,
                           out: Optional[torch.Tensor] = None,
                           lse: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The Triton baseline of the op contract (bf16/fp16 in and out, fp32 softmax and accumulation).

    No host sync on CUDA inputs (unless contract debug mode is on). On CPU tensors it runs only
    under ``TRITON_INTERPRET=1``.
    """
    problem = validate(q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale, out, lse,
                       float_dtypes=(torch.bfloat16, torch.float16))
    if q.device.type != "cuda" and not _interpreting():
        raise ValueError(f"q: tree_verify_mla_triton runs on CUDA tensors (or on CPU under "
                         f"TRITON_INTERPRET=1), got a tensor on {q.device}")
    out, lse = allocate_outputs(q, out, lse)
    kernel = _kernel()
    # W words hold up to 32*W nodes, and no request has more nodes than there are query rows.
    max_tree = min(problem.num_rows, 32 * problem.mask_words)
    grid = (problem.batch, problem.num_heads, (max_tree + BLOCK_M - 1) // BLOCK_M)
    kernel[grid](
        q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, out,
        lse if lse is not None else out, float(sm_scale),
        q.stride(0), q.stride(1), kv_cache.stride(0), out.stride(0), out.stride(1),
        lse.stride(0) if lse is not None else 0, problem.mask_words,
        HAS_LSE=lse is not None, DOT_F32=_interpreting(), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
        BLOCK_DMODEL=LATENT_DIM, BLOCK_DPE=ROPE_DIM, BLOCK_DV=LATENT_DIM,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return out

