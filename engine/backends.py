"""Attention backends: one interface, looked up by name.

Every backend answers ``forward(q, kv_cache, meta, sm_scale)`` by the metadata's mode:
``forward_extend`` (prefill, causal), ``forward_decode`` (one token) and ``forward_verify`` (a
token tree). q is [Nq, H, 576], kv_cache one layer's pool [S, 576]; out is [Nq, H, 512] in q's
dtype. Verify and decode go through the op contract (DESIGN section 3) for every backend that
wraps a kernel:

- ``reference``: the oracle `kdtree.kernels.reference.tree_verify_mla_reference` for all three
  modes (prefill as chain trees of at most 1024 nodes).
- ``torch``: a vectorised dense torch path (fp32 math), the engine's default.
- ``cuda``: `kdtree.kernels.tree_verify_mla`; ``triton``:
  `kdtree.kernels.triton_baseline.tree_verify_mla_triton`. Imported on first use; prefill uses
  the torch path.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from typing import Callable

import torch

from kdtree.engine.metadata import AttentionMetadata
from kdtree.kernels.contract import LATENT_DIM, MAX_TREE_NODES
from kdtree.kernels.masks import pack_tree_masks, unpack_bool_rows

_DENSE_ELEMENT_BUDGET = 1 << 25  # scores held at once by the torch path (fp32 elements)


class AttentionBackend(ABC):
    name: str = "?"

    def forward(self, q, kv_cache, meta: AttentionMetadata, sm_scale: float) -> torch.Tensor:
        if meta.mode == "extend":
            return self.forward_extend(q, kv_cache, meta, sm_scale)
        if meta.mode == "decode":
            return self.forward_decode(q, kv_cache, meta, sm_scale)
        if meta.mode == "verify":
            return self.forward_verify(q, kv_cache, meta, sm_scale)
        raise ValueError(f"unknown attention mode {meta.mode!r}")

    @abstractmethod
    def forward_extend(self, q, kv_cache, meta: AttentionMetadata, sm_scale: float) -> torch.Tensor:
        """Prefill: new tokens attend to the prefix and causally to each other."""

    @abstractmethod
    def forward_decode(self, q, kv_cache, meta: AttentionMetadata, sm_scale: float) -> torch.Tensor:
        """One new token per request attends to its prefix and itself."""

    @abstractmethod
    def forward_verify(self, q, kv_cache, meta: AttentionMetadata, sm_scale: float) -> torch.Tensor:
        """Tree nodes attend to the prefix and to their ancestors-or-self (meta.tree_mask)."""


# -- torch ---------------------------------------------------------------------------------------
def _dense_chunk(q, kv_cache, meta: AttentionMetadata, b0: int, b1: int, sm_scale: float,
                 tree_rows) -> torch.Tensor:
    dev = q.device
    qo_len = torch.tensor(meta.qo_lens[b0:b1], device=dev)
    kv_len = torch.tensor(meta.kv_lens[b0:b1], device=dev)
    prefix = kv_len - qo_len
    q_start = meta.qo_indptr[b0:b1].to(dev).long()
    kv_start = meta.kv_indptr[b0:b1].to(dev).long()
    t_max, k_max = int(qo_len.max()), int(kv_len.max())
    t = torch.arange(t_max, device=dev)
    k = torch.arange(k_max, device=dev)
    q_valid = t[None, :] < qo_len[:, None]  # [b, T]
    k_valid = k[None, :] < kv_len[:, None]  # [b, K]
    q_rows = (q_start[:, None] + t[None, :]).clamp(max=q.shape[0] - 1)
    k_pos = (kv_start[:, None] + k[None, :]).clamp(max=max(meta.kv_indices.numel() - 1, 0))
    slots = torch.where(k_valid, meta.kv_indices.to(dev).long()[k_pos], 0)
    keys = kv_cache[slots].float()  # [b, K, 576]
    queries = q[q_rows].float()  # [b, T, H, 576]

    node = k[None, :] - prefix[:, None]  # tree node of each key, < 0 for the prefix
    visible = k_valid[:, None, :] & (node[:, None, :] < 0)
    in_tree = k_valid & (node >= 0)
    if tree_rows is None:  # causal chain / single token
        sees_node = node[:, None, :] <= t[None, :, None]
    else:  # tree_rows: bool [Nq, T_max] ancestor-or-self
        anc = tree_rows[q_rows]  # [b, T, T_max]
        idx = node.clamp(0, anc.shape[-1] - 1)[:, None, :].expand(-1, t_max, -1)
        sees_node = anc.gather(2, idx)
    visible = visible | (in_tree[:, None, :] & sees_node)
    visible = visible | ~q_valid[:, :, None]  # padded query rows: anything finite, dropped below

    scores = torch.einsum("bthd,bkd->bhtk", queries, keys) * sm_scale
    scores = scores.masked_fill(~visible[:, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("bhtk,bkd->bthd", probs, keys[..., :LATENT_DIM])
    return out[q_valid]


def dense_attention(q, kv_cache, meta: AttentionMetadata, sm_scale: float) -> torch.Tensor:
    """Masked attention for every mode with padded batched einsums, chunked to bound memory."""
    tree_rows = None
    if meta.mode == "verify":
        tree_rows = unpack_bool_rows(meta.tree_mask, max(meta.qo_lens)).to(q.device)
    heads = q.shape[1]
    outs, b0 = [], 0
    while b0 < meta.batch_size:
        b1 = b0 + 1
        t_max, k_max = meta.qo_lens[b0], meta.kv_lens[b0]
        while b1 < meta.batch_size:
            t2, k2 = max(t_max, meta.qo_lens[b1]), max(k_max, meta.kv_lens[b1])
            if (b1 + 1 - b0) * heads * t2 * k2 > _DENSE_ELEMENT_BUDGET:
                break
            t_max, k_max, b1 = t2, k2, b1 + 1
        outs.append(_dense_chunk(q, kv_cache, meta, b0, b1, sm_scale, tree_rows))
        b0 = b1
    return torch.cat(outs).to(q.dtype)


class TorchBackend(AttentionBackend):
    name = "torch"

    def forward_extend(self, q, kv_cache, meta, sm_scale):
        return dense_attention(q, kv_cache, meta, sm_scale)

    def forward_decode(self, q, kv_cache, meta, sm_scale):
        return dense_attention(q, kv_cache, meta, sm_scale)

    def forward_verify(self, q, kv_cache, meta, sm_scale):
        return dense_attention(q, kv_cache, meta, sm_scale)


# -- op-contract backends ------------------------------------------------------------------------
class OpBackend(AttentionBackend):
    """Routes verify and decode through an op with the contract's signature; prefill via torch."""

    def __init__(self, name: str, module: str, attr: str):
        self.name, self._module, self._attr = name, module, attr
        self._op: Callable | None = None

    @property
    def op(self) -> Callable:
        if self._op is None:
            try:
                self._op = getattr(importlib.import_module(self._module), self._attr)
            except (ImportError, AttributeError) as err:
                raise RuntimeError(f"attention backend {self.name!r} needs {self._module}.{self._attr}, "
                                   f"which could not be imported: {err}") from err
        return self._op

    def _call(self, q, kv_cache, meta, sm_scale):
        op = self.op
        try:
            return op(q, kv_cache, meta.qo_indptr, meta.kv_indptr, meta.kv_indices, meta.tree_mask,
                      float(sm_scale))
        except ImportError as err:  # the op builds or imports its extension on first call
            raise RuntimeError(f"attention backend {self.name!r} could not load its kernel: {err}") from err

    def forward_extend(self, q, kv_cache, meta, sm_scale):
        return dense_attention(q, kv_cache, meta, sm_scale)

    def forward_decode(self, q, kv_cache, meta, sm_scale):
        return self._call(q, kv_cache, meta, sm_scale)

    def forward_verify(self, q, kv_cache, meta, sm_scale):
        return self._call(q, kv_cache, meta, sm_scale)


class ReferenceBackend(OpBackend):
    """The oracle for every mode; prefill runs as chain trees of at most 1024 nodes per call."""

    def __init__(self):
        super().__init__("reference", "kdtree.kernels.reference", "tree_verify_mla_reference")

    def forward_extend(self, q, kv_cache, meta, sm_scale):
        out = torch.empty(q.shape[0], q.shape[1], LATENT_DIM, dtype=q.dtype, device=q.device)
        kv_host = meta.kv_indices.cpu().tolist()
        q_starts = meta.qo_indptr.cpu().tolist()
        kv_starts = meta.kv_indptr.cpu().tolist()
        for c0 in range(0, max(meta.qo_lens), MAX_TREE_NODES):
            rows, slots, lens_q, lens_kv, parents = [], [], [], [], []
            for b, (t_b, n_b) in enumerate(zip(meta.qo_lens, meta.kv_lens)):
                if t_b <= c0:
                    continue
                c1 = min(t_b, c0 + MAX_TREE_NODES)
                prefix = n_b - t_b
                rows.extend(range(q_starts[b] + c0, q_starts[b] + c1))
                slots.extend(kv_host[kv_starts[b]: kv_starts[b] + prefix + c1])
                lens_q.append(c1 - c0)
                lens_kv.append(prefix + c1)
                parents.append(list(range(-1, c1 - c0 - 1)))
            dev = q.device
            idx = torch.tensor(rows, device=dev)
            qo = torch.tensor([0] + lens_q, dtype=torch.int64).cumsum(0).to(torch.int32).to(dev)
            kv = torch.tensor([0] + lens_kv, dtype=torch.int64).cumsum(0).to(torch.int32).to(dev)
            out[idx] = self.op(q[idx].contiguous(), kv_cache, qo, kv,
                               torch.tensor(slots, dtype=torch.int32, device=dev),
                               pack_tree_masks(parents, device=dev), float(sm_scale))
        return out


_FACTORIES: dict[str, Callable[[], AttentionBackend]] = {
    "reference": ReferenceBackend,
    "torch": TorchBackend,
    "cuda": lambda: OpBackend("cuda", "kdtree.kernels", "tree_verify_mla"),
    "triton": lambda: OpBackend("triton", "kdtree.kernels.triton_baseline", "tree_verify_mla_triton"),
}


def known_backends() -> list[str]:
    return sorted(_FACTORIES)


def register_backend(name: str, factory: Callable[[], AttentionBackend]) -> None:
    """Make `get_backend(name)` build backends with `factory` (replaces an existing name)."""
    _FACTORIES[name] = factory


def get_backend(name: str) -> AttentionBackend:
    """A fresh backend by name; ValueError listing the known names for an unknown one."""
    if name not in _FACTORIES:
        raise ValueError(f"unknown attention backend {name!r}; known: {known_backends()}")
    return _FACTORIES[name]()
