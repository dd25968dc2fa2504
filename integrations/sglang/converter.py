"""SGLang 0.5.23's target-verify metadata -> the op contract, on the device, into preallocated buffers.

SGLang's Triton backend describes a target-verify batch of B requests (request b: a prefix of
L_b tokens and T_b draft tokens) with

- ``qo_indptr``   [B+1] int32 (eager) or int64 (CUDA-graph runs): draft rows of request b;
- ``kv_indptr``   [B+1] int32 and ``kv_indices`` int64: the *prefix* slots only;
- ``out_cache_loc`` [sum T_b] int64: the slots the draft tokens' KV is written to (their KV is
  in the pool before attention runs, since ``forward_extend`` saves it first);
- ``custom_mask`` (bool or uint8, flat) and ``mask_indptr`` [B+1] int64: per request a row-major
  T_b x (L_b + T_b) block from ``mask_indptr[b]``; the prefix columns are ignored
  (``skip_prefix_custom_mask``), tree column s of row t says whether draft t sees draft s.

The op contract wants int32 ``kv_indices`` = each request's prefix slots followed by its draft
slots, ``kv_indptr`` of L_b + T_b per request, int32 ``qo_indptr`` and the packed tree mask (bit s
of row t = custom_mask tree column s). `VerifyConverter.convert` builds exactly that with two
Triton kernels on the GPU, writing into buffers allocated once, reading only shapes on the host:
no host sync, no allocation, so it can be captured in a CUDA graph (phase 3). The packed mask
carries every bit as SGLang's mask has it: the kernel applies the mask bit by bit, so a mask
that is not ancestor-closed gives the same answer as SGLang's kernel, never a silently different
one. The one bit it adds is each row's own (the diagonal), which every SGLang tree mask sets: a
padded row's stale cells then still satisfy the op contract (a row sees its own node). Reads are bounded by the input tensors' sizes, so padded rows of a graph replay (seq_len 1,
out_cache_loc 0, stale mask cells) read nothing out of range and give finite output (their
prefix is visible). Slot ids must fit int32: the backend checks the pool size once, up front
(`kdtree.integrations.sglang.backend`).

`convert_reference` is the same conversion in plain torch (host loops): the oracle of the tests
and the path on the CPU.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kdtree.kernels.contract import MAX_TREE_NODES

INT32_MAX = 2 ** 31 - 1
_INDEX_BLOCK = 1024
_INDEX_PROGRAMS = 16  # programs per request of the index kernel (each strides over the request)


class OpMetadata(NamedTuple):
    """The op contract's index arguments for one verify batch (views into the converter's buffers)."""

    qo_indptr: torch.Tensor  # int32 [B+1]
    kv_indptr: torch.Tensor  # int32 [B+1]: L_b + T_b per request
    kv_indices: torch.Tensor  # int32 [>= sum(L_b + T_b)]
    tree_mask: torch.Tensor  # int32 [Nq, W]


def convert_reference(qo_indptr, kv_indptr, kv_indices, out_cache_loc, custom_mask, mask_indptr,
                      mask_words: int | None = None) -> OpMetadata:
    """The conversion in plain torch, reading the indptrs on the host (tests, CPU)."""
    qo = [int(x) for x in qo_indptr.tolist()]
    kvp = [int(x) for x in kv_indptr.tolist()]
    mi = [int(x) for x in mask_indptr.tolist()]
    dev = out_cache_loc.device
    t_max = max(qo[b + 1] - qo[b] for b in range(len(qo) - 1))
    words = mask_words or max(1, (t_max + 31) // 32)
    flat = custom_mask.reshape(-1).to(torch.bool).cpu()
    indices, lens, rows = [], [0], []
    for b in range(len(qo) - 1):
        T, L = qo[b + 1] - qo[b], kvp[b + 1] - kvp[b]
        indices += [kv_indices[kvp[b]: kvp[b + 1]].cpu(), out_cache_loc[qo[b]: qo[b + 1]].cpu()]
        lens.append(lens[-1] + L + T)
        block = flat[mi[b]: mi[b] + T * (L + T)].reshape(T, L + T)[:, L:]
        bits = torch.zeros(T, 32 * words, dtype=torch.int64)
        bits[:, :T] = block.to(torch.int64) | torch.eye(T, dtype=torch.int64)
        packed = (bits.view(T, words, 32) << torch.arange(32)).sum(-1)
        rows.append(torch.where(packed > INT32_MAX, packed - 2 ** 32, packed))
    all_slots = torch.cat(indices)
    if all_slots.numel() and int(all_slots.max()) > INT32_MAX:
        raise ValueError(f"slot id {int(all_slots.max())} does not fit int32; the op contract's kv_indices are int32")
    return OpMetadata(torch.tensor(qo, dtype=torch.int32, device=dev), torch.tensor(lens, dtype=torch.int32, device=dev),
                      all_slots.to(torch.int32).to(dev), torch.cat(rows).to(torch.int32).to(dev))


_kernels: dict[str, object] = {}


def _triton_kernels():
    if _kernels:
        return _kernels["index"], _kernels["mask"]
    import triton  # noqa: PLC0415 - only on the GPU path
    import triton.language as tl  # noqa: PLC0415

    @triton.jit
    def _index_kernel(QO, KVP, KVI, OCL, QO_OUT, KVP_OUT, KVI_OUT, n_kvi, n_ocl,
                      PROGRAMS: tl.constexpr, BLOCK: tl.constexpr):
        b = tl.program_id(0)
        p = tl.program_id(1)
        qo0 = tl.load(QO + b).to(tl.int64)
        qo1 = tl.load(QO + b + 1).to(tl.int64)
        p0 = tl.load(KVP + b).to(tl.int64)
        p1 = tl.load(KVP + b + 1).to(tl.int64)
        prefix = p1 - p0
        total = prefix + (qo1 - qo0)
        if p == 0:
            tl.store(QO_OUT + b + 1, qo1.to(tl.int32))
            tl.store(KVP_OUT + b + 1, (p1 + qo1).to(tl.int32))
            if b == 0:
                tl.store(QO_OUT, qo0.to(tl.int32))
                tl.store(KVP_OUT, (p0 + qo0).to(tl.int32))
        out0 = p0 + qo0
        offs = tl.arange(0, BLOCK)
        for start in range(p.to(tl.int64) * BLOCK, total, PROGRAMS * BLOCK):
            o = start + offs
            live = o < total
            in_prefix = o < prefix
            src_p = p0 + o
            src_t = qo0 + o - prefix
            from_prefix = tl.load(KVI + src_p, mask=live & in_prefix & (src_p < n_kvi), other=0)
            from_tree = tl.load(OCL + src_t, mask=live & (~in_prefix) & (src_t >= 0) & (src_t < n_ocl), other=0)
            tl.store(KVI_OUT + out0 + o, tl.where(in_prefix, from_prefix, from_tree).to(tl.int32), mask=live)

    @triton.jit
    def _mask_kernel(QO, KVP, CM, MI, MASK_OUT, n_cm, n_rows, WORDS: tl.constexpr):
        b = tl.program_id(0)
        t = tl.program_id(1)
        qo0 = tl.load(QO + b).to(tl.int64)
        T = tl.load(QO + b + 1).to(tl.int64) - qo0
        if t < T:
            prefix = tl.load(KVP + b + 1).to(tl.int64) - tl.load(KVP + b).to(tl.int64)
            base = tl.load(MI + b).to(tl.int64) + t * (prefix + T) + prefix
            row = qo0 + t
            lanes = tl.arange(0, 32)
            for w in tl.static_range(WORDS):
                s = w * 32 + lanes
                src = base + s
                bit = tl.load(CM + src, mask=(s < T) & (src >= 0) & (src < n_cm), other=0)
                seen = (bit != 0) | (s == t)
                word = tl.sum(seen.to(tl.int64) << lanes.to(tl.int64), axis=0)
                word = tl.where(word > 2147483647, word - 4294967296, word)
                tl.store(MASK_OUT + row * WORDS + w, word.to(tl.int32), mask=row < n_rows)

    _kernels["index"], _kernels["mask"] = _index_kernel, _mask_kernel
    return _index_kernel, _mask_kernel


class VerifyConverter:
    """Converts SGLang target-verify metadata into preallocated op-contract buffers.

    max_batch: requests per batch; max_rows: draft rows per batch (sum T_b); max_tree: T_b at
    most (SGLang's ``speculative_num_draft_tokens``); max_slots: prefix + draft slots per batch
    (the longest ``kv_indices`` SGLang may pass, plus max_rows). Everything is allocated here;
    `convert` allocates nothing and never synchronises (on CUDA).
    """

    def __init__(self, max_batch: int, max_rows: int, max_tree: int, max_slots: int, device):
        if not 1 <= max_tree <= MAX_TREE_NODES:
            raise ValueError(f"max_tree must be in [1, {MAX_TREE_NODES}] (the kernel's largest tree), got {max_tree}")
        if min(max_batch, max_rows, max_slots) < 1:
            raise ValueError(f"max_batch, max_rows and max_slots must be >= 1, got {max_batch}, {max_rows}, {max_slots}")
        self.device = torch.device(device)
        self.max_batch, self.max_rows, self.max_tree, self.max_slots = max_batch, max_rows, max_tree, max_slots
        self.mask_words = (max_tree + 31) // 32
        i32 = dict(dtype=torch.int32, device=self.device)
        self.qo_indptr = torch.zeros(max_batch + 1, **i32)
        self.kv_indptr = torch.zeros(max_batch + 1, **i32)
        self.kv_indices = torch.zeros(max_slots, **i32)
        self.tree_mask = torch.zeros(max_rows * self.mask_words, **i32)

    @property
    def buffer_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qo_indptr, self.kv_indptr, self.kv_indices, self.tree_mask))

    def check_shapes(self, qo_indptr, kv_indptr, kv_indices, out_cache_loc, custom_mask, mask_indptr) -> None:
        """ValueError naming what does not fit (shapes only: no sync)."""
        batch = qo_indptr.numel() - 1
        rows = out_cache_loc.numel()
        slots = kv_indices.numel() + rows
        problems = []
        if not 1 <= batch <= self.max_batch:
            problems.append(f"batch of {batch} requests (converter sized for 1..{self.max_batch})")
        if kv_indptr.numel() != batch + 1 or mask_indptr.numel() != batch + 1:
            problems.append(f"kv_indptr has {kv_indptr.numel()} and mask_indptr {mask_indptr.numel()} entries, "
                            f"qo_indptr {batch + 1}")
        if rows > batch * self.max_tree:
            problems.append(f"{rows} draft rows for {batch} requests: more than {self.max_tree} per request")
        if rows > self.max_rows:
            problems.append(f"{rows} draft rows (sized for {self.max_rows})")
        if slots > self.max_slots:
            problems.append(f"{slots} prefix + draft slots (sized for {self.max_slots})")
        if kv_indices.dtype not in (torch.int32, torch.int64) or out_cache_loc.dtype not in (torch.int32, torch.int64):
            problems.append(f"kv_indices / out_cache_loc dtypes {kv_indices.dtype} / {out_cache_loc.dtype} (need int32 or int64)")
        if custom_mask.dtype not in (torch.bool, torch.uint8, torch.int8):
            problems.append(f"custom_mask dtype {custom_mask.dtype} (need bool or uint8)")
        if problems:
            raise ValueError("SGLang verify metadata the converter cannot take: " + "; ".join(problems))

    def convert(self, qo_indptr, kv_indptr, kv_indices, out_cache_loc, custom_mask, mask_indptr) -> OpMetadata:
        """The op contract's (qo_indptr, kv_indptr, kv_indices, tree_mask) for this batch (buffer views)."""
        self.check_shapes(qo_indptr, kv_indptr, kv_indices, out_cache_loc, custom_mask, mask_indptr)
        batch, rows = qo_indptr.numel() - 1, out_cache_loc.numel()
        slots = kv_indices.numel() + rows
        words = self.mask_words
        mask = self.tree_mask[: rows * words].view(rows, words)
        out = OpMetadata(self.qo_indptr[: batch + 1], self.kv_indptr[: batch + 1], self.kv_indices[:slots], mask)
        if self.device.type != "cuda":
            ref = convert_reference(qo_indptr, kv_indptr, kv_indices, out_cache_loc, custom_mask, mask_indptr, words)
            out.qo_indptr.copy_(ref.qo_indptr)
            out.kv_indptr.copy_(ref.kv_indptr)
            out.kv_indices[: ref.kv_indices.numel()].copy_(ref.kv_indices)
            mask.copy_(ref.tree_mask)
            return out
        self.launch(qo_indptr, kv_indptr, kv_indices, out_cache_loc, custom_mask, mask_indptr, out)
        return out

    def launch(self, qo_indptr, kv_indptr, kv_indices, out_cache_loc, custom_mask, mask_indptr, out: OpMetadata) -> None:
        """The two Triton kernels (any device Triton runs on, the interpreter included)."""
        index_kernel, mask_kernel = _triton_kernels()
        batch, rows = qo_indptr.numel() - 1, out_cache_loc.numel()
        cm = custom_mask.view(torch.uint8) if custom_mask.dtype == torch.bool else custom_mask
        index_kernel[(batch, _INDEX_PROGRAMS)](
            qo_indptr, kv_indptr, kv_indices, out_cache_loc, out.qo_indptr, out.kv_indptr, out.kv_indices,
            kv_indices.numel(), out_cache_loc.numel(), PROGRAMS=_INDEX_PROGRAMS, BLOCK=_INDEX_BLOCK)
        mask_kernel[(batch, self.max_tree)](
            qo_indptr, kv_indptr, cm, mask_indptr, out.tree_mask, cm.numel(), rows, WORDS=self.mask_words)
