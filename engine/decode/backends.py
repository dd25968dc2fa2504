"""Attention backends: one interface, looked up by name.

Every backend answers ``forward(q, kv_cache, meta, sm_scale)`` by the metadata's mode:
``forward_extend`` (prefill, causal), ``forward_decode`` (one token: plain decoding and the
drafter's passes over the prefix) and ``forward_verify`` (a token tree). q is [Nq, H, 576],
kv_cache one layer's pool [S, 576]; out is [Nq, H, 512] in q's dtype. Prefill always runs as
chain trees (`kdtree.engine.decode.chunked`), so its memory is bounded for any prompt length.

- ``reference``: the oracle `kdtree.kernels.reference.tree_verify_mla_reference` for every mode.
- ``torch``: a vectorised dense torch path (fp32 math), the engine's default on the CPU.
- ``kernel`` (alias ``cuda``): `kdtree.kernels.tree_verify_mla`, the owned CUDA kernel, for
  every mode: verify, the drafter's and plain decoding's passes over the prefix, and prefill in
  1024-row chain chunks.
- ``triton``: what engines run today: `kdtree.kernels.triton_baseline.tree_verify_mla_triton`
  (SGLang's ``extend_attention_fwd`` style) for verify and prefill chunks, and for decode the
  bf16 torch gather + matmul path (`kdtree.kernels.naive`), standing in for SGLang's split-KV
  decode kernel (both are bandwidth-bound at T=1).

The op-wrapping backends need CUDA tensors (``requires_cuda``); `kdtree.engine.generate`
refuses them on the CPU with a message saying so. Ops are imported on first use.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from typing import Callable

import torch

from kdtree.engine.decode.chunked import extend_in_chunks
from kdtree.engine.decode.metadata import AttentionMetadata
from kdtree.kernels.contract import LATENT_DIM, MAX_TREE_NODES
from kdtree.kernels.masks import unpack_bool_rows

_DENSE_ELEMENT_BUDGET = 1 << 25  # scores held at once by the torch path (fp32 elements)


class AttentionBackend(ABC):
    name: str = "?"
    #: the backend's ops take CUDA tensors only
    requires_cuda: bool = False

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
                 tree_rows, probs_hook=None) -> torch.Tensor:
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
    if probs_hook is not None:
        probs = probs_hook(probs)
    out = torch.einsum("bhtk,bkd->bthd", probs, keys[..., :LATENT_DIM])
    return out[q_valid]


def dense_attention(q, kv_cache, meta: AttentionMetadata, sm_scale: float, probs_hook=None) -> torch.Tensor:
    """Masked attention for every mode with padded batched einsums, chunked to bound memory.
    ``probs_hook`` (fp32 softmax weights [b, H, T, K] -> same) perturbs the weights before PV."""
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
        outs.append(_dense_chunk(q, kv_cache, meta, b0, b1, sm_scale, tree_rows, probs_hook))
        b0 = b1
    return torch.cat(outs).to(q.dtype)


def _dense_chunk_rows(q, meta: AttentionMetadata) -> int:
    """Chain-chunk rows that keep one request's scores within the dense path's budget."""
    return max(1, min(MAX_TREE_NODES, _DENSE_ELEMENT_BUDGET // (q.shape[1] * max(meta.kv_lens))))


class TorchBackend(AttentionBackend):
    name = "torch"

    def forward_extend(self, q, kv_cache, meta, sm_scale):
        return extend_in_chunks(dense_attention, q, kv_cache, meta, sm_scale, _dense_chunk_rows(q, meta))

    def forward_decode(self, q, kv_cache, meta, sm_scale):
        return dense_attention(q, kv_cache, meta, sm_scale)

    def forward_verify(self, q, kv_cache, meta, sm_scale):
        return dense_attention(q, kv_cache, meta, sm_scale)


# -- op-contract backends ------------------------------------------------------------------------
def _load(backend: str, module: str, attr: str) -> Callable:
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise RuntimeError(f"attention backend {backend!r} needs {module}.{attr}, which could not be "
                           f"imported: {err}") from err


class OpBackend(AttentionBackend):
    """Every mode through ops with the contract's signature: `verify_op` for verify and prefill
    chains (chunks of `prefill_rows` rows), `decode_op` (default: the same op) for decode."""

    requires_cuda = True

    def __init__(self, name: str, module: str, attr: str, decode: tuple[str, str] | None = None,
                 prefill_rows: int = MAX_TREE_NODES):
        self.name, self._where, self._decode_where = name, (module, attr), decode
        self.prefill_rows = prefill_rows
        self._ops: dict[str, Callable] = {}

    def _op(self, which: str) -> Callable:
        if which not in self._ops:
            where = self._decode_where if which == "decode" and self._decode_where else self._where
            self._ops[which] = _load(self.name, *where)
        return self._ops[which]

    @property
    def op(self) -> Callable:
        return self._op("verify")

    def _call(self, op: Callable, q, kv_cache, meta, sm_scale):
        try:
            return op(q, kv_cache, meta.qo_indptr, meta.kv_indptr, meta.kv_indices, meta.tree_mask,
                      float(sm_scale))
        except ImportError as err:  # the op builds or imports its extension on first call
            raise RuntimeError(f"attention backend {self.name!r} could not load its kernel: {err}") from err

    def forward_extend(self, q, kv_cache, meta, sm_scale):
        return extend_in_chunks(self.forward_verify, q, kv_cache, meta, sm_scale, self.prefill_rows)

    def forward_decode(self, q, kv_cache, meta, sm_scale):
        return self._call(self._op("decode"), q, kv_cache, meta, sm_scale)

    def forward_verify(self, q, kv_cache, meta, sm_scale):
        return self._call(self._op("verify"), q, kv_cache, meta, sm_scale)


class ReferenceBackend(OpBackend):
    """The oracle for every mode (fp64 math for bf16 inputs; runs on the CPU too)."""

    requires_cuda = False

    def __init__(self):
        super().__init__("reference", "kdtree.kernels.reference", "tree_verify_mla_reference")


def kernel_backend() -> OpBackend:
    """The owned CUDA kernel for verify, decode/draft and prefill chunks."""
    return OpBackend("kernel", "kdtree.kernels", "tree_verify_mla")


def triton_backend() -> OpBackend:
    """Today's engines: the Triton tree-verify kernel; decode through bf16 torch (see module docstring)."""
    return OpBackend("triton", "kdtree.kernels.triton_baseline", "tree_verify_mla_triton",
                     decode=("kdtree.kernels.naive", "tree_verify_mla_naive"))


def _cuda_alias() -> OpBackend:
    backend = kernel_backend()
    backend.name = "cuda"
    return backend


_FACTORIES: dict[str, Callable[[], AttentionBackend]] = {
    "reference": ReferenceBackend,
    "torch": TorchBackend,
    "kernel": kernel_backend,
    "cuda": _cuda_alias,  # the phase-1 name of the kernel backend
    "triton": triton_backend,
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
