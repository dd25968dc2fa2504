"""The SGLang backend's graph path captured in a real CUDA graph, on the GPU, with the fake
parent (`fake_sglang`) holding SGLang's graph buffers: `init_forward_metadata_in_graph` (the
Triton converter) and `forward_extend` (KV write + kernel) are captured once at the seq_len fill
value, then replayed after `init_forward_metadata_out_graph(view)` refills the buffers with
batches of other lengths; each replay matches the fp64 reference of SGLang's layout. SGLang's
own runner and kit are exercised in test_sglang_gpu.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import fake_sglang
from kdtree.integrations.sglang.backend import make_backend_class
from kdtree.bench.sglang_batches import make_verify_batch, sglang_layout_reference

pytestmark = pytest.mark.gpu

HEADS, N, BS, POOL = 16, 16, 4, 12000


def fixture(lens, seed, padded=0):
    extra = POOL - (sum(lens) + len(lens) * N)
    return make_verify_batch(HEADS, lens, N, seed, pool_extra=extra, padded=padded, device="cuda")


def test_captured_verify_replays_every_length_correctly():
    pytest.importorskip("triton")
    cap = fixture([1] * BS, seed=1)
    cls = make_backend_class(fake_sglang.TritonAttnBackend)
    backend = cls(fake_sglang.runner_for(cap))
    backend.init_cuda_graph_state(BS, BS * N)
    batch = fake_sglang.batch_for(cap)
    layer = fake_sglang.mla_layer(HEADS)
    q, k, v = cap["q"].clone(), cap["k_extend"].clone(), cap["v_extend"].clone()
    out_cache_loc = cap["out_cache_loc"].clone()
    batch.out_cache_loc = out_cache_loc  # the runner's static buffer
    backend.init_forward_metadata_out_graph(batch, in_capture=True)
    for _ in range(2):  # warm up: Triton compiles, the kernel's workspace is made
        backend.init_forward_metadata_in_graph(batch)
        backend.forward_extend(q, k, v, layer, batch)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        backend.init_forward_metadata_in_graph(batch)
        out = backend.forward_extend(q, k, v, layer, batch)
    assert backend.kd_last_route[0] == "kernel", backend.kd_last_route
    calls = type(backend).kd_kernel_calls
    for seed, (lens, padded) in enumerate([([37, 3000, 0, 9], 0), ([11000 // BS] * BS, 0), ([500, 20], 2)], start=2):
        fx = fixture(lens, seed, padded)
        backend.token_to_kv_pool.kv_buffer[0].copy_(fx["pool"])
        q.copy_(fx["q"])
        k.copy_(fx["k_extend"])
        out_cache_loc.copy_(fx["out_cache_loc"])
        view = SimpleNamespace(batch_size=BS, forward_mode=batch.forward_mode, out_cache_loc=out_cache_loc, fixture=fx)
        backend.init_forward_metadata_out_graph(view)
        graph.replay()
        torch.cuda.synchronize()
        real = fx["real_requests"] * N
        ref = sglang_layout_reference(fx)
        got = out.view_as(ref)
        assert torch.isfinite(got.float()).all()
        torch.testing.assert_close(got[:real].float(), ref[:real].float(), rtol=2e-2, atol=2e-2)
    assert type(backend).kd_kernel_calls == calls, "replays run the graph, not forward_extend"
