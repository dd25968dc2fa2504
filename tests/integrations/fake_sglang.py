"""Stand-ins for the parts of SGLang 0.5.23 the backend touches (SGLang cannot be installed on CPU CI).

They have the interface `kdtree.integrations.sglang.backend` relies on, taken from SGLang's
source: ``TritonAttnBackend.__init__(model_runner, ...)`` / ``init_forward_metadata`` /
``init_cuda_graph_state(max_bs, max_num_tokens, kv_indices_buf=None, cuda_graph_num_kv_splits_buf=None)`` /
``init_forward_metadata_out_graph(forward_batch, in_capture=False)`` (fills the graph's static
buffers as SGLang's ``_update_target_verify_buffers`` does: int32 qo/kv indptr, the prefixes packed
from index 0 of an int64 ``max_num_tokens x max_context_len`` kv_indices buffer, the masks from
index 0 of a uint8 ``max_bs x N x (max_context_len + N)`` buffer, int64 mask_indptr; it sets
``forward_metadata`` at capture only, a replay reuses it) / ``init_forward_metadata_in_graph`` /
``get_cuda_graph_seq_len_fill_value`` (1) / ``_set_kv_buffer`` /
``forward_extend(q, k, v, layer, forward_batch, save_kv_cache, sinks, score_mod, aux_tensors)``,
``forward_metadata`` fields, ``KVWriteLoc.for_batch``, ``ForwardMode.is_target_verify``,
``MLATokenToKVPool.get_key_buffer`` ([S + 1, 1, 576]) and ``RadixAttention``'s attributes.
The fake parent records every call it gets, so a test can assert what reached it, unchanged.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from kdtree.kernels.reference import tree_verify_mla_reference

PARENT_RESULT = object()


class RecordingLaunch:
    """`cuda_op.launch`'s signature on the oracle; records the plan each call was given, which must
    fit the call's shapes. A graph batch's kv_indices is the bucket's buffer; the kernel reads only
    up to kv_indptr[-1] of it, the oracle's value checks want exactly that much."""

    def __init__(self, op=tree_verify_mla_reference):
        self.op = op
        self.plans = []

    def __call__(self, q, kv, qo, kvp, idx, mask, scale, *, out=None, lse=None, plan=None):
        self.plans.append(plan)
        assert plan is not None and plan.mismatch(q.shape[0], q.shape[1], qo.numel() - 1, mask.shape[1],
                                                  plan.device) is None
        idx = idx[: int(kvp[-1])]
        return self.op(q, kv, qo, kvp, idx, mask, scale, out=out, lse=lse)


class ForwardMode:
    def __init__(self, name: str):
        self.name = name

    def is_target_verify(self) -> bool:
        return self.name == "target_verify"

    def __str__(self) -> str:
        return self.name


class KVWriteLoc:
    def __init__(self, loc, swa_loc=None):
        self.loc, self.swa_loc = loc, swa_loc

    @classmethod
    def for_batch(cls, forward_batch, *, swa_loc=None, full_loc=None):
        return cls(forward_batch.out_cache_loc, swa_loc)


class MLAPool:
    def __init__(self, buffers: list[torch.Tensor]):
        self.kv_buffer = buffers
        self.size = buffers[0].shape[0] - 1
        self.page_size = 1

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.kv_buffer[layer_id]


class TritonAttnBackend:
    def __init__(self, model_runner, skip_prefill: bool = False, kv_indptr_buf=None):
        self.use_mla = model_runner.use_mla
        self.page_size = 1
        self.dcp_size = 1
        self.enable_deterministic = False
        self.dllm_attention = None
        self.skip_prefill = skip_prefill
        self.sliding_window_size = None
        self.use_sliding_window_kv_pool = False
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.num_draft_tokens = model_runner.num_draft_tokens
        self.target_verify_num_tokens_per_req = model_runner.num_draft_tokens
        self.max_context_len = 4096
        self.graph_state = None
        self.forward_metadata = None
        self.calls: list[tuple] = []

    def init_forward_metadata(self, forward_batch):
        self.calls.append(("init_forward_metadata", forward_batch))
        fx = forward_batch.fixture
        verify = forward_batch.forward_mode.is_target_verify()
        self.forward_metadata = SimpleNamespace(
            qo_indptr=fx["qo_indptr"], kv_indptr=fx["kv_indptr"], kv_indices=fx["kv_indices"],
            custom_mask=fx["custom_mask"] if verify else None, mask_indptr=fx["mask_indptr"] if verify else None,
            swa_out_cache_loc=None)

    def init_cuda_graph_state(self, max_bs, max_num_tokens, kv_indices_buf=None, cuda_graph_num_kv_splits_buf=None):
        self.calls.append(("init_cuda_graph_state", max_bs, max_num_tokens))
        n = self.target_verify_num_tokens_per_req
        dev = self.token_to_kv_pool.kv_buffer[0].device
        self.graph_state = SimpleNamespace(
            qo_indptr=torch.zeros(max_bs + 1, dtype=torch.int32, device=dev),
            kv_indptr=torch.zeros(max_bs + 1, dtype=torch.int32, device=dev),
            kv_indices=torch.zeros(max_num_tokens * self.max_context_len, dtype=torch.int64, device=dev)
            if kv_indices_buf is None else kv_indices_buf,
            mask=torch.zeros(max_bs * n * (self.max_context_len + n), dtype=torch.uint8, device=dev),
            mask_indptr=torch.zeros(max_bs + 1, dtype=torch.int64, device=dev))

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        self.calls.append(("init_forward_metadata_out_graph", forward_batch, in_capture))
        g = self.graph_state
        if g is None or not forward_batch.forward_mode.is_target_verify():
            return
        fx = forward_batch.fixture
        bs = fx["qo_indptr"].numel() - 1
        g.qo_indptr[: bs + 1] = fx["qo_indptr"].to(torch.int32)
        g.kv_indptr[: bs + 1] = fx["kv_indptr"]
        g.kv_indices.zero_()
        g.kv_indices[: fx["kv_indices"].numel()] = fx["kv_indices"]
        g.mask.fill_(1)  # stale cells past the batch's blocks
        g.mask[: fx["custom_mask"].numel()] = fx["custom_mask"].to(torch.uint8)
        g.mask_indptr[: bs + 1] = fx["mask_indptr"]
        if in_capture:
            self.forward_metadata = SimpleNamespace(
                qo_indptr=g.qo_indptr[: bs + 1], kv_indptr=g.kv_indptr[: bs + 1], kv_indices=g.kv_indices,
                custom_mask=g.mask, mask_indptr=g.mask_indptr[: bs + 1], swa_out_cache_loc=None)

    def init_forward_metadata_in_graph(self, forward_batch):
        self.calls.append(("init_forward_metadata_in_graph", forward_batch))

    def get_cuda_graph_seq_len_fill_value(self):
        return 1

    def _set_kv_buffer(self, forward_batch, layer, loc_info, k, v, k_scale=None, v_scale=None):
        self.token_to_kv_pool.kv_buffer[layer.layer_id][loc_info.loc] = k

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, sinks=None, score_mod=None,
                       aux_tensors=None):
        self.calls.append(("forward_extend", q, k, v, layer, forward_batch,
                           dict(save_kv_cache=save_kv_cache, sinks=sinks, score_mod=score_mod, aux_tensors=aux_tensors)))
        return PARENT_RESULT


def mla_layer(heads: int, layer_id: int = 0, **overrides):
    attrs = dict(layer_id=layer_id, tp_q_head_num=heads, tp_k_head_num=1, qk_head_dim=576, v_head_dim=512,
                 scaling=1.0 / 192 ** 0.5, k_scale=None, v_scale=None, logit_cap=0.0, xai_temperature_len=-1,
                 sliding_window_size=-1, is_cross_attention=False)
    attrs.update(overrides)
    return SimpleNamespace(**attrs)


def runner_for(fixture, use_mla: bool = True, layers: int = 1):
    pools = [fixture["pool"].clone() for _ in range(layers)]
    return SimpleNamespace(use_mla=use_mla, token_to_kv_pool=MLAPool(pools),
                           req_to_token_pool=SimpleNamespace(size=16), num_draft_tokens=fixture["num_draft_tokens"])


def batch_for(fixture, mode: str = "target_verify"):
    return SimpleNamespace(forward_mode=ForwardMode(mode), out_cache_loc=fixture["out_cache_loc"], fixture=fixture)
