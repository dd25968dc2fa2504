"""SGLang's Triton attention backend with the MLA target-verify path on the kernel.

`KdtreeVerifyMixin` holds everything this backend adds; `backend_class()` puts it in front of
SGLang 0.5.23's ``TritonAttnBackend`` (resolved when the plugin's registered factory first builds a
backend, so importing this module imports no SGLang), and `make_backend_class(parent)` in front of
any class with that interface (the CPU tests' stand-in). The mixin overrides only:

- ``init_forward_metadata``: the parent's eager body, then, for a target-verify batch the kernel
  can serve, the conversion of its metadata (`VerifyConverter`, on the GPU, into buffers
  allocated on first use; no host sync);
- ``forward_extend``: for that batch and an absorbed-MLA layer (q ``[T, H, 576]``, one 576-wide
  latent head, v the ``[..., :512]`` view of the same pool), write the draft tokens' KV into
  the pool exactly as the parent does, then launch the kernel over the pool's prefix and draft
  slots with the batch's `LaunchPlan` (`kdtree.kernels.plan` of its shapes, the plan that runs).
  Any other call (prefill, draft extend, decode, non-MLA layers, FP8 or scaled KV, logit caps,
  sinks, sliding windows) goes to the parent, with its arguments unchanged;
- the CUDA-graph API of SGLang 0.5.23 (its decode CUDA-graph runner, and the attention kit):
  ``init_cuda_graph_state(max_bs, max_num_tokens, ...)`` runs the parent's, then allocates a
  second `VerifyConverter` sized for the graph buckets (max_bs requests, max_num_tokens rows,
  max_bs x max_context_len prefix slots: int32 per token, never T x L);
  ``init_forward_metadata_out_graph(forward_batch, in_capture)`` is the parent's (it fills
  SGLang's static graph buffers, at capture and before every replay) and forgets the eager
  conversion; ``init_forward_metadata_in_graph(forward_batch)`` (recorded into the graph)
  converts those static buffers into the graph converter's, on the device, allocation-free;
  ``get_cuda_graph_seq_len_fill_value`` is the parent's 1 (a padded request then has one prefix
  key, so its rows are finite). In a graph batch ``forward_extend`` launches the kernel with the
  bucket's fixed plan (`kdtree.kernels.plan_bucket` for (bs, N, max_context_len)), whose split
  ranges the kernel cuts from kv_indptr on the device, so one capture serves every length up to
  max_context_len.

Whether a batch is served is decided from shapes, dtypes and layer attributes on the host, never
from values on the device; `kd_last_route` says which path the last call took and why. The
``kdtree.integrations.sglang`` logger says, once per process, on the first target-verify batch
the kernel serves, the plan that runs it (variant, KV splits), the GPU and its compute
capability; and each distinct reason a target-verify batch goes to SGLang's own path.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Optional

import torch

from kdtree.integrations.sglang.converter import INT32_MAX, VerifyConverter
from kdtree.kernels.contract import LATENT_DIM, MAX_HEADS, MAX_TREE_NODES, QK_DIM
from kdtree.kernels.device_facts import DeviceFacts

log = logging.getLogger("kdtree.integrations.sglang")

#: what plans are made for when the pool is not on a CUDA device (CPU tests: an H200's SMs and
#: capability; a plan is only shapes)
CPU_PLAN_DEVICE = DeviceFacts(132, (9, 0))


class KdtreeVerifyMixin:
    """SGLang's Triton backend; MLA target verify on the kdtree kernel (module docstring). Put in
    front of the backend class by `make_backend_class`; every other call goes to that class."""

    #: the launch, the op contract plus ``plan`` (default `kdtree.kernels.cuda_op.launch`); tests
    #: on the CPU swap in a wrapper of the reference
    launch_op = None
    #: layer calls served by the kernel, over all instances (the GPU kit test reads it)
    kd_kernel_calls = 0
    #: what the class has logged ("kernel" after the first served batch, and each reason a
    #: target-verify batch went to the parent); `make_backend_class` gives each class its own
    kd_logged: set = set()
    #: the module of the backend class the mixin extends (its ``KVWriteLoc``)
    kd_parent_module: Any = None

    def __init__(self, model_runner, *args, **kwargs):
        super().__init__(model_runner, *args, **kwargs)
        self._kd_runner = model_runner
        self._kd_meta = None
        self._kd_converter: Optional[VerifyConverter] = None
        self._kd_graph_converter: Optional[VerifyConverter] = None
        self._kd_graph_bs: Optional[int] = None  # set while the metadata is a graph batch's
        self._kd_graph_context = 0  # max_context_len the graph converter is sized for
        self._kd_plans: dict[tuple[int, int], Any] = {}  # (bs, heads) -> the bucket's LaunchPlan
        self._kd_eager: Optional[tuple] = None  # (shapes and device, LaunchPlan) of the last eager batch
        self.kd_unservable = _unservable_backend(self)
        self.kd_last_route: tuple[str, str] = ("none", "no call yet")
        self._kd_verify_skip: Optional[str] = None  # why the last target-verify batch was not converted

    # -- metadata ------------------------------------------------------------------------------
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
        self._kd_meta, self._kd_graph_bs = None, None
        self._kd_verify_skip = self.kd_unservable
        if self.kd_unservable is not None or not forward_batch.forward_mode.is_target_verify():
            return
        md = self.forward_metadata
        if md.custom_mask is None:
            self._kd_verify_skip = "the batch has no custom (tree) mask"
            return
        try:
            self._kd_meta = self._kd_converter_for(forward_batch, md).convert(
                md.qo_indptr, md.kv_indptr, md.kv_indices, forward_batch.out_cache_loc, md.custom_mask, md.mask_indptr)
        except ValueError as err:  # a batch the buffers were not sized for: the parent serves it
            self._kd_meta = None
            self.kd_last_route = ("parent", f"converter: {err}")
            self._kd_verify_skip = f"converter: {err}"

    # -- CUDA graphs (SGLang's decode CUDA-graph runner) ---------------------------------------
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, *args, **kwargs):
        result = super().init_cuda_graph_state(max_bs, max_num_tokens, *args, **kwargs)
        self._kd_graph_converter, self._kd_plans = None, {}
        if self.kd_unservable is None:
            tree = self._kd_tokens_per_request()
            context = int(getattr(self, "max_context_len", 0) or 0)
            if tree is not None and context > 0 and max_num_tokens >= 1:
                device = getattr(self, "device", None) or self.token_to_kv_pool.get_key_buffer(0).device
                self._kd_graph_context = context
                self._kd_graph_converter = VerifyConverter(
                    max_batch=max_bs, max_rows=max_num_tokens, max_tree=tree,
                    max_slots=max_bs * context + max_num_tokens, device=device)
        return result

    def _kd_tokens_per_request(self) -> Optional[int]:
        n = int(getattr(self, "target_verify_num_tokens_per_req", 0) or getattr(self, "num_draft_tokens", 0) or 0)
        return n if 1 <= n <= MAX_TREE_NODES else None

    def get_cuda_graph_seq_len_fill_value(self):
        return super().get_cuda_graph_seq_len_fill_value()

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        self._kd_meta, self._kd_graph_bs = None, None
        return super().init_forward_metadata_out_graph(forward_batch, in_capture)

    def init_forward_metadata_in_graph(self, forward_batch):
        result = super().init_forward_metadata_in_graph(forward_batch)
        self._kd_meta, self._kd_graph_bs = None, None
        self._kd_verify_skip = self.kd_unservable
        conv = self._kd_graph_converter
        if conv is None or not forward_batch.forward_mode.is_target_verify():
            return result
        md = self.forward_metadata
        if md is None or getattr(md, "custom_mask", None) is None or getattr(md, "qo_indptr", None) is None:
            self.kd_last_route = ("parent", "graph batch without a custom mask")
            self._kd_verify_skip = "graph batch without a custom mask"
            return result
        bs = md.qo_indptr.numel() - 1
        # SGLang packs the prefixes from index 0 of its (max_num_tokens x max_context_len) buffer:
        # bs x max_context_len entries hold every prefix of a bs-request batch
        prefix = md.kv_indices[: min(md.kv_indices.numel(), bs * self._kd_graph_context)]
        try:
            self._kd_meta = conv.convert(md.qo_indptr, md.kv_indptr, prefix, forward_batch.out_cache_loc,
                                         md.custom_mask, md.mask_indptr)
            self._kd_graph_bs = bs
        except ValueError as err:
            self.kd_last_route = ("parent", f"graph converter: {err}")
            self._kd_verify_skip = f"graph converter: {err}"
        return result

    # -- launch plans --------------------------------------------------------------------------
    def _kd_plan_device(self, device):
        return device if getattr(device, "type", "cpu") == "cuda" else CPU_PLAN_DEVICE

    def kd_graph_plan(self, bs: int, heads: int):
        """The `LaunchPlan` of a graph batch of `bs` requests: the bucket's fixed plan."""
        key = (bs, heads)
        if key not in self._kd_plans:
            from kdtree.kernels import plan_bucket  # noqa: PLC0415

            device = self._kd_plan_device(self.token_to_kv_pool.get_key_buffer(0).device)
            self._kd_plans[key] = plan_bucket(bs, self._kd_graph_converter.max_tree, self._kd_graph_context, heads,
                                              device)
        return self._kd_plans[key]

    def kd_eager_plan(self, meta, heads: int, device):
        """The `LaunchPlan` of an eager batch: `kdtree.kernels.plan` of the shapes the launch gets,
        made once per batch shape (every layer of a step has the same)."""
        shapes = (meta.tree_mask.shape[0], heads, meta.qo_indptr.numel() - 1, meta.tree_mask.shape[1],
                  meta.kv_indices.numel())
        key = (shapes, str(device))
        if self._kd_eager is None or self._kd_eager[0] != key:
            from kdtree.kernels import plan  # noqa: PLC0415

            self._kd_eager = (key, plan(*shapes, self._kd_plan_device(device)))
        return self._kd_eager[1]

    # -- attention -----------------------------------------------------------------------------
    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, sinks=None, score_mod=None,
                       aux_tensors=None):
        why = _unservable_call(self, q, k, v, layer, forward_batch, sinks, score_mod, aux_tensors)
        if why is not None:
            self.kd_last_route = ("parent", why)
            if forward_batch.forward_mode.is_target_verify():
                self._kd_log_fallback((self._kd_verify_skip or why) if self._kd_meta is None else why)
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache,
                                          sinks=sinks, score_mod=score_mod, aux_tensors=aux_tensors)
        self.kd_last_route = ("kernel", "MLA target verify")
        type(self).kd_kernel_calls += 1
        # k and v None: the caller wrote the draft tokens' latent into the pool already (the
        # kernel reads every slot from the pool either way)
        if save_kv_cache and k is not None:  # the draft latent goes into the pool first, as the parent writes it
            loc = self.kd_parent_module.KVWriteLoc.for_batch(
                forward_batch, swa_loc=getattr(self.forward_metadata, "swa_out_cache_loc", None))
            self._set_kv_buffer(forward_batch, layer, loc, k, v)
        heads = layer.tp_q_head_num
        buf = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
        out = getattr(forward_batch, "_attn_output", None)
        if out is None:
            out = q.new_empty((q.shape[0], heads * LATENT_DIM))
        meta = self._kd_meta
        args = (q.reshape(-1, heads, QK_DIM).contiguous(), buf.view(buf.shape[0], QK_DIM), meta.qo_indptr,
                meta.kv_indptr, meta.kv_indices, meta.tree_mask, float(layer.scaling))
        if self._kd_graph_bs is None and self.launch_op is None and torch.compiler.is_compiling():
            from kdtree.kernels import tree_verify_mla  # noqa: PLC0415 - the torch op, which plans the same

            tree_verify_mla(*args, out=out.view(-1, heads, LATENT_DIM))
            return out
        graph = self._kd_graph_bs is not None
        plan = self.kd_graph_plan(self._kd_graph_bs, heads) if graph else self.kd_eager_plan(meta, heads, q.device)
        if "kernel" not in self.kd_logged:
            self._kd_log_kernel(q.device, meta, heads, plan, graph)
        (self.launch_op or _kernel_launch())(*args, out=out.view(-1, heads, LATENT_DIM), plan=plan)
        return out

    # -- what the server log says --------------------------------------------------------------
    def _kd_log_kernel(self, device, meta, heads: int, plan, graph: bool) -> None:
        type(self).kd_logged.add("kernel")
        capability = plan.device.capability
        how = f"{plan.variant_name} ({'CUDA graph, ' if graph else ''}{plan.num_splits} KV split"
        how += "s)" if plan.num_splits != 1 else ")"
        log.info("kdtree kernel serves MLA target verify: variant %s on %s (compute capability %d.%d); "
                 "first batch %d requests, %d draft tokens, %d heads", how, _device_name(device),
                 capability[0], capability[1], meta.qo_indptr.numel() - 1, meta.tree_mask.shape[0], heads)

    def _kd_log_fallback(self, why: str) -> None:
        if why not in self.kd_logged:
            type(self).kd_logged.add(why)
            log.info("kdtree: a target-verify batch goes to SGLang's Triton path: %s "
                     "(logged once per reason)", why)


# -- what the kernel serves (host facts only) ------------------------------------------------------
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
        return "not a target-verify batch the converter took"
    if not forward_batch.forward_mode.is_target_verify():
        return f"forward mode {forward_batch.forward_mode}"
    if (k is None) != (v is None):
        return "only one of k, v given (the parent raises)"
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


def _device_name(device) -> str:
    if getattr(device, "type", "cpu") != "cuda":
        return "the CPU (no GPU)"
    return torch.cuda.get_device_name(device)


def _kernel_launch():
    from kdtree.kernels.cuda_op import launch  # noqa: PLC0415 - needs the GPU and the extension

    return launch


# -- the class SGLang builds ------------------------------------------------------------------------
def make_backend_class(parent: type) -> type:
    """`KdtreeVerifyMixin` in front of `parent` (SGLang's ``TritonAttnBackend``, or a stand-in with
    its interface), with its own log memory and call count."""
    return type("KdtreeTritonAttnBackend", (KdtreeVerifyMixin, parent), {
        "__module__": __name__, "__doc__": KdtreeVerifyMixin.__doc__, "kd_logged": set(), "kd_kernel_calls": 0,
        "kd_parent_module": sys.modules[parent.__module__]})


_class_cache: dict[type, type] = {}


def backend_class() -> type:
    """The backend class over SGLang's installed ``TritonAttnBackend`` (imports SGLang)."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend  # noqa: PLC0415

    if TritonAttnBackend not in _class_cache:
        _class_cache[TritonAttnBackend] = make_backend_class(TritonAttnBackend)
    return _class_cache[TritonAttnBackend]
