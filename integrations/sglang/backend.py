"""SGLang's Triton attention backend with the MLA target-verify path on the kernel.

`make_backend_class(TritonAttnBackend)` subclasses SGLang 0.5.23's backend and overrides only:

- ``init_forward_metadata``: the parent's eager body, then, for a target-verify batch the kernel
  can serve, the conversion of its metadata (`VerifyConverter`, on the GPU, into buffers
  allocated on first use; no host sync);
- ``forward_extend``: for that batch and an absorbed-MLA layer (q ``[T, H, 576]``, one 576-wide
  latent head, v the ``[..., :512]`` view of the same pool), write the draft tokens' KV into
  the pool exactly as the parent does, then run `kdtree.kernels.tree_verify_mla` over the pool's
  prefix and draft slots. Any other call (prefill, draft extend, decode, non-MLA layers, FP8 or
  scaled KV, logit caps, sinks, sliding windows, CUDA-graph batches) goes to the parent, with its
  arguments unchanged;
- ``init_forward_metadata_out_graph`` / ``_in_graph``: forget the eager conversion, then the
  parent (graph batches take the parent's path until phase 3 implements capture).

Whether a batch is served is decided from shapes, dtypes and layer attributes on the host, never
from values on the device; `kd_last_route` says which path the last call took and why.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

import torch

from kdtree.integrations.sglang.converter import INT32_MAX, VerifyConverter
from kdtree.kernels.contract import LATENT_DIM, MAX_HEADS, MAX_TREE_NODES, QK_DIM


def _unservable_backend(backend: Any) -> Optional[str]:
    """Why this backend instance can never take the kernel path (None: it can)."""
    if not getattr(backend, "use_mla", False):
        return "the model is not MLA"
    checks = [
        (getattr(backend, "page_size", 1) != 1, "page_size != 1"),
        (getattr(backend, "dcp_size", 1) > 1, "decode context parallelism"),
        (getattr(backend, "enable_deterministic", False), "deterministic inference"),
        (getattr(backend, "dllm_attention", None) is not None, "dLLM attention"),
        (getattr(backend, "skip_prefill", False), "a backend built without prefill (draft decode)"),
        (getattr(backend, "sliding_window_size", None) is not None, "a sliding-window model"),
        (getattr(backend, "use_sliding_window_kv_pool", False), "a sliding-window KV pool"),
    ]
    for failed, why in checks:
        if failed:
            return why
    pool = getattr(backend, "token_to_kv_pool", None)
    size = getattr(pool, "size", 0) + getattr(pool, "page_size", 1)
    if size - 1 > INT32_MAX:
        return f"the KV pool has {size} slots: slot ids do not fit the kernel's int32 kv_indices"
    return None


def _unservable_call(backend: Any, q, k, v, layer, forward_batch, sinks, score_mod, aux_tensors) -> Optional[str]:
    """Why this forward_extend call goes to the parent (None: the kernel serves it). Host facts only."""
    if backend._kd_meta is None:
        return "not an eager target-verify batch the converter took"
    if not forward_batch.forward_mode.is_target_verify():
        return f"forward mode {forward_batch.forward_mode}"
    if k is None or v is None:
        return "no new k/v given"
    if sinks is not None or score_mod is not None or aux_tensors is not None:
        return "sinks / score_mod / aux_tensors"
    if getattr(layer, "qk_head_dim", None) != QK_DIM or getattr(layer, "v_head_dim", None) != LATENT_DIM \
            or getattr(layer, "tp_k_head_num", None) != 1:
        return (f"not the absorbed MLA shape (qk {getattr(layer, 'qk_head_dim', None)}, v "
                f"{getattr(layer, 'v_head_dim', None)}, kv heads {getattr(layer, 'tp_k_head_num', None)})")
    heads = getattr(layer, "tp_q_head_num", 0)
    if not 1 <= heads <= MAX_HEADS:
        return f"{heads} heads (the kernel takes 1..{MAX_HEADS})"
    if getattr(layer, "k_scale", None) is not None or getattr(layer, "v_scale", None) is not None:
        return "scaled (quantised) KV"
    if (getattr(layer, "logit_cap", 0) or 0) > 0 or (getattr(layer, "xai_temperature_len", -1) or -1) > 0:
        return "logit capping / temperature"
    window = getattr(layer, "sliding_window_size", None)
    if window is not None and window > -1:
        return "a sliding-window layer"
    if getattr(layer, "is_cross_attention", False):
        return "cross attention"
    if q.dtype != torch.bfloat16:
        return f"q is {q.dtype} (the kernel takes bf16)"
    buf = backend.token_to_kv_pool.get_key_buffer(layer.layer_id)
    if buf.dtype != torch.bfloat16 or buf.shape[-1] != QK_DIM or buf.numel() != buf.shape[0] * QK_DIM \
            or not buf.is_contiguous():
        return f"KV buffer {tuple(buf.shape)} {buf.dtype} is not a contiguous bf16 [S, 1, 576] pool"
    if q.numel() != backend._kd_meta.tree_mask.shape[0] * heads * QK_DIM:
        return f"q has {q.numel() // max(1, heads * QK_DIM)} rows, the verify batch {backend._kd_meta.tree_mask.shape[0]}"
    return None


def make_backend_class(parent: type) -> type:
    """The subclass of `parent` (SGLang's ``TritonAttnBackend``, or a stand-in with its interface)."""
    parent_module = sys.modules[parent.__module__]

    class KdtreeTritonAttnBackend(parent):
        """SGLang's Triton backend; MLA target verify on `kdtree.kernels.tree_verify_mla` (module docstring)."""

        #: the op; tests on the CPU swap in the reference (same signature)
        verify_op = None
        #: layer calls served by the kernel, over all instances (the GPU kit test reads it)
        kd_kernel_calls = 0

        def __init__(self, model_runner, *args, **kwargs):
            super().__init__(model_runner, *args, **kwargs)
            self._kd_runner = model_runner
            self._kd_meta = None
            self._kd_converter: Optional[VerifyConverter] = None
            self.kd_unservable = _unservable_backend(self)
            self.kd_last_route: tuple[str, str] = ("none", "no call yet")

        # -- metadata ------------------------------------------------------------------------
        def _kd_converter_for(self, forward_batch, md) -> VerifyConverter:
            """The converter, (re)built with room to spare when this batch does not fit (eager only:
            phase 3 sizes it per graph bucket instead)."""
            batch = md.qo_indptr.numel() - 1
            rows = forward_batch.out_cache_loc.numel()
            slots = md.kv_indices.numel() + rows
            tree = min(MAX_TREE_NODES, max(1, int(getattr(self, "num_draft_tokens", 0) or 0), -(-rows // batch)))
            conv = self._kd_converter
            if conv is None or batch > conv.max_batch or rows > conv.max_rows or slots > conv.max_slots \
                    or tree > conv.max_tree:
                conv = self._kd_converter = VerifyConverter(
                    max_batch=max(batch, conv.max_batch if conv else 0, 8),
                    max_rows=max(rows, conv.max_rows if conv else 0, 8 * tree), max_tree=tree,
                    max_slots=2 * max(slots, conv.max_slots if conv else 0), device=forward_batch.out_cache_loc.device)
            return conv

        def init_forward_metadata(self, forward_batch):
            super().init_forward_metadata(forward_batch)
            self._kd_meta = None
            if self.kd_unservable is not None or not forward_batch.forward_mode.is_target_verify():
                return
            md = self.forward_metadata
            if md.custom_mask is None:
                return
            try:
                self._kd_meta = self._kd_converter_for(forward_batch, md).convert(md.qo_indptr, md.kv_indptr, md.kv_indices,
                                                           forward_batch.out_cache_loc, md.custom_mask, md.mask_indptr)
            except ValueError as err:  # a batch the buffers were not sized for: the parent serves it
                self._kd_meta = None
                self.kd_last_route = ("parent", f"converter: {err}")

        def init_forward_metadata_out_graph(self, forward_batch, *args, **kwargs):
            self._kd_meta = None
            return super().init_forward_metadata_out_graph(forward_batch, *args, **kwargs)

        def init_forward_metadata_in_graph(self, forward_batch, *args, **kwargs):
            self._kd_meta = None
            return super().init_forward_metadata_in_graph(forward_batch, *args, **kwargs)

        # -- attention -----------------------------------------------------------------------
        def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, sinks=None, score_mod=None,
                           aux_tensors=None):
            why = _unservable_call(self, q, k, v, layer, forward_batch, sinks, score_mod, aux_tensors)
            if why is not None:
                self.kd_last_route = ("parent", why)
                return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache,
                                              sinks=sinks, score_mod=score_mod, aux_tensors=aux_tensors)
            self.kd_last_route = ("kernel", "MLA target verify")
            type(self).kd_kernel_calls += 1
            if save_kv_cache:  # the draft tokens' latent goes into the pool first, as the parent writes it
                loc = parent_module.KVWriteLoc.for_batch(
                    forward_batch, swa_loc=getattr(self.forward_metadata, "swa_out_cache_loc", None))
                self._set_kv_buffer(forward_batch, layer, loc, k, v)
            heads = layer.tp_q_head_num
            buf = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
            out = getattr(forward_batch, "_attn_output", None)
            if out is None:
                out = q.new_empty((q.shape[0], heads * LATENT_DIM))
            meta = self._kd_meta
            op = self.verify_op or _kernel_op()
            op(q.reshape(-1, heads, QK_DIM).contiguous(), buf.view(buf.shape[0], QK_DIM), meta.qo_indptr,
               meta.kv_indptr, meta.kv_indices, meta.tree_mask, float(layer.scaling),
               out=out.view(-1, heads, LATENT_DIM))
            return out

    KdtreeTritonAttnBackend.__qualname__ = KdtreeTritonAttnBackend.__name__
    return KdtreeTritonAttnBackend


def _kernel_op():
    from kdtree.kernels import tree_verify_mla  # noqa: PLC0415

    return tree_verify_mla


_class_cache: dict[type, type] = {}


def backend_class() -> type:
    """The subclass of SGLang's installed ``TritonAttnBackend`` (imports SGLang)."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend  # noqa: PLC0415

    if TritonAttnBackend not in _class_cache:
        _class_cache[TritonAttnBackend] = make_backend_class(TritonAttnBackend)
    return _class_cache[TritonAttnBackend]
