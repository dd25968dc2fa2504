"""The SGLang backend's CUDA-graph API on the CPU, against `fake_sglang`'s graph layout.

The sequence is the one SGLang 0.5.23's decode CUDA-graph runner (and its attention kit) runs:
``init_cuda_graph_state(max_bs, max_num_tokens)`` once; per captured batch size
``init_forward_metadata_out_graph(batch, in_capture=True)``, ``init_forward_metadata_in_graph``
and the forward; per replay ``init_forward_metadata_out_graph(view)`` with a SimpleNamespace view
(the kit also runs ``_in_graph(view)`` and the forward eagerly, as here). The expected output is
computed straight off SGLang's layout (`sglang_layout_reference`).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import fake_sglang
from kdtree.integrations.sglang.backend import make_backend_class
from kdtree.bench.sglang_batches import make_verify_batch, sglang_layout_reference
from kdtree.kernels import launch_plan
from kdtree.kernels.device_facts import DeviceFacts

POOL = 4200  # every fixture's pool has this many slots, so a replay's pool fits the captured one
HEADS, N, BS = 4, 8, 3


def fixture(lens, seed, padded=0, **kw):
    extra = POOL - (sum(lens) + len(lens) * N)
    return make_verify_batch(HEADS, lens, N, seed, pool_extra=extra, padded=padded, **kw)


def graph_backend(fx, max_bs=BS):
    cls = make_backend_class(fake_sglang.TritonAttnBackend)
    backend = cls(fake_sglang.runner_for(fx))
    launch = fake_sglang.RecordingLaunch()
    backend.launch_op = launch
    backend.init_cuda_graph_state(max_bs, max_bs * N)
    return backend, launch


def view_of(fx, mode="target_verify"):
    """What the graph runner hands `init_forward_metadata_out_graph` on a replay."""
    return SimpleNamespace(batch_size=fx["qo_indptr"].numel() - 1, forward_mode=fake_sglang.ForwardMode(mode),
                           out_cache_loc=fx["out_cache_loc"], fixture=fx, seq_lens=None, spec_info=None)


def forward(backend, fx, batch):
    out = backend.forward_extend(fx["q"], fx["k_extend"], fx["v_extend"], fake_sglang.mla_layer(HEADS), batch)
    return out


def load_pool(backend, fx):
    backend.token_to_kv_pool.kv_buffer[0].copy_(fx["pool"])


def check(out, fx, rows=None):
    ref = sglang_layout_reference(fx)
    rows = rows or ref.shape[0]
    torch.testing.assert_close(out.view_as(ref)[:rows].float(), ref[:rows].float(), rtol=2e-2, atol=2e-2)


def test_capture_then_replays_at_other_lengths_run_the_kernel_with_the_buckets_plan():
    cap = fixture([1, 1, 1], seed=1)  # the runner captures with seq_len fill values
    backend, launch = graph_backend(cap)
    assert backend.get_cuda_graph_seq_len_fill_value() == 1
    batch = fake_sglang.batch_for(cap)
    backend.init_forward_metadata_out_graph(batch, in_capture=True)
    backend.init_forward_metadata_in_graph(batch)
    check(forward(backend, cap, batch), cap)
    assert backend.kd_last_route[0] == "kernel"
    want = launch_plan.plan_bucket(BS, N, backend.max_context_len, HEADS, DeviceFacts(132, (9, 0)))
    assert launch.plans[-1] == want  # the bucket's plan, held: no variant name and split count to plan again
    for seed, lens in enumerate([[37, 0, 200], [3900, 2, 9], [0, 0, 0]], start=2):
        fx = fixture(lens, seed)
        load_pool(backend, fx)
        view = view_of(fx)
        backend.init_forward_metadata_out_graph(view)
        backend.init_forward_metadata_in_graph(view)
        check(forward(backend, fx, fake_sglang.batch_for(fx)), fx)
        assert backend.kd_last_route[0] == "kernel", backend.kd_last_route
    assert len({p for p in launch.plans}) == 1, "every call of the bucket keeps the captured plan"
    assert not [c for c in backend.calls if c[0] == "forward_extend"], "the parent must not run"


def test_padded_replay_rows_are_finite_and_real_rows_exact():
    backend, _ = graph_backend(fixture([1, 1, 1], seed=1))
    fx = fixture([20, 9], seed=8, padded=1)  # the graph runner pads bs 2 to the captured 3
    load_pool(backend, fx)
    batch = fake_sglang.batch_for(fx)
    backend.init_forward_metadata_out_graph(batch, in_capture=True)
    backend.init_forward_metadata_in_graph(batch)
    out = forward(backend, fx, batch).view(-1, HEADS, 512)
    assert torch.isfinite(out.float()).all()
    check(out, fx, rows=fx["real_requests"] * N)


def test_graph_buffers_are_sized_by_tokens_not_by_the_mask():
    backend, _ = graph_backend(fixture([1, 1, 1], seed=1))
    conv = backend._kd_graph_converter
    assert conv.max_batch == BS and conv.max_rows == BS * N and conv.max_tree == N
    assert conv.max_slots == BS * backend.max_context_len + BS * N
    mask_bytes = backend.graph_state.mask.numel()  # SGLang's verify mask: max_bs x N x (ctx + N)
    assert conv.buffer_bytes < mask_bytes * 4 / N + 1024


@pytest.mark.parametrize("mode", ["extend", "decode", "draft_extend"])
def test_other_graph_modes_take_the_parents_path(mode):
    fx = fixture([5, 6, 7], seed=3)
    backend, launch = graph_backend(fx)
    batch = fake_sglang.batch_for(fx, mode)
    backend.init_forward_metadata_out_graph(batch, in_capture=True)
    backend.init_forward_metadata_in_graph(batch)
    assert forward(backend, fx, batch) is fake_sglang.PARENT_RESULT
    assert ("init_forward_metadata_out_graph", batch, True) in backend.calls
    assert ("init_forward_metadata_in_graph", batch) in backend.calls
    assert not launch.plans


def test_a_batch_the_graph_converter_cannot_take_goes_to_the_parent():
    fx = fixture([5, 6, 7], seed=4)
    backend, launch = graph_backend(fx)
    backend._kd_graph_converter.max_rows = 2 * N  # as if the state were made for fewer tokens
    batch = fake_sglang.batch_for(fx)
    backend.init_forward_metadata_out_graph(batch, in_capture=True)
    backend.init_forward_metadata_in_graph(batch)
    assert backend.kd_last_route[1].startswith("graph converter: ") and "draft rows" in backend.kd_last_route[1]
    assert forward(backend, fx, batch) is fake_sglang.PARENT_RESULT and not launch.plans


def test_an_eager_batch_after_graphs_uses_the_eager_path_again():
    backend, launch = graph_backend(fixture([1, 1, 1], seed=1))
    fx = fixture([30, 4, 11], seed=5)
    load_pool(backend, fx)
    batch = fake_sglang.batch_for(fx)
    backend.init_forward_metadata_out_graph(batch, in_capture=True)
    backend.init_forward_metadata_in_graph(batch)
    forward(backend, fx, batch)
    graph_plan = launch.plans[-1]
    backend.init_forward_metadata(batch)
    check(forward(backend, fx, batch), fx)
    eager_plan = launch.plans[-1]
    assert eager_plan is not graph_plan, "an eager batch must not take the graph plan"
    rows = fx["q"].shape[0]
    assert eager_plan == launch_plan.plan(rows, HEADS, 3, 1, sum([30, 4, 11]) + rows, eager_plan.device)
