"""The SGLang backend on the CPU, against stand-ins of SGLang's classes (`fake_sglang`).

Fixtures are target-verify batches in SGLang's layout (`kdtree.bench.sglang_batches`);
the expected output is computed straight off that layout in fp64 (`sglang_layout_reference`),
independently of the converter. The kernel is swapped for the oracle (same signature) on CPU.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

import fake_sglang
from kdtree.integrations.sglang import plugin
from kdtree.integrations.sglang.backend import make_backend_class
from kdtree.bench.sglang_batches import make_verify_batch, sglang_layout_reference
from kdtree.kernels.reference import tree_verify_mla_reference


def _backend(fixture, **runner_kw):
    cls = make_backend_class(fake_sglang.TritonAttnBackend)
    backend = cls(fake_sglang.runner_for(fixture, **runner_kw))
    backend.launch_op = fake_sglang.RecordingLaunch()
    return backend


def _verify(fixture, heads, mode="target_verify", layer=None):
    backend = _backend(fixture)
    batch = fake_sglang.batch_for(fixture, mode)
    backend.init_forward_metadata(batch)
    layer = layer or fake_sglang.mla_layer(heads)
    out = backend.forward_extend(fixture["q"], fixture["k_extend"], fixture["v_extend"], layer, batch)
    return backend, out


CASES = [
    dict(prefix_lens=[37, 0, 5], tree_size=9, mask_dtype=torch.bool, qo_dtype=torch.int32),
    dict(prefix_lens=[120], tree_size=40, mask_dtype=torch.uint8, qo_dtype=torch.int64, kind="chain"),
    dict(prefix_lens=[3, 64], tree_size=17, mask_dtype=torch.bool, qo_dtype=torch.int64, kind="star"),
]


@pytest.mark.parametrize("case", CASES, ids=["bool-int32", "uint8-int64-chain", "star"])
def test_target_verify_goes_to_the_kernel_and_matches_sglangs_semantics(case):
    fx = make_verify_batch(4, seed=11, **case)
    backend, out = _verify(fx, 4)
    assert backend.kd_last_route[0] == "kernel", backend.kd_last_route
    assert not [c for c in backend.calls if c[0] == "forward_extend"], "the parent must not run"
    ref = sglang_layout_reference(fx)
    assert out.shape == (fx["q"].shape[0], 4 * 512)
    torch.testing.assert_close(out.view_as(ref).float(), ref.float(), rtol=2e-2, atol=2e-2)
    pool = backend.token_to_kv_pool.kv_buffer[0]
    assert torch.equal(pool[fx["out_cache_loc"]], fx["k_extend"]), "the draft KV must be written into the pool first"


def test_kv_already_in_the_pool_k_and_v_none_is_served_without_a_write():
    # SGLang's MLA attention kit (and models that write the latent themselves) pass k = v = None
    # with save_kv_cache=False: the draft latent is already at out_cache_loc
    fx = make_verify_batch(4, [37, 5], 9, seed=13)
    backend = _backend(fx)
    pool = backend.token_to_kv_pool.kv_buffer[0]
    pool[fx["out_cache_loc"]] = fx["k_extend"]
    before = pool.clone()
    batch = fake_sglang.batch_for(fx)
    backend.init_forward_metadata(batch)
    out = backend.forward_extend(fx["q"], None, None, fake_sglang.mla_layer(4), batch, save_kv_cache=False)
    assert backend.kd_last_route[0] == "kernel", backend.kd_last_route
    assert torch.equal(pool, before), "nothing may be written"
    ref = sglang_layout_reference(fx)
    torch.testing.assert_close(out.view_as(ref).float(), ref.float(), rtol=2e-2, atol=2e-2)


def test_only_one_of_k_and_v_goes_to_the_parent():
    fx = make_verify_batch(2, [10], 4, seed=4)
    backend = _backend(fx)
    batch = fake_sglang.batch_for(fx)
    backend.init_forward_metadata(batch)
    out = backend.forward_extend(fx["q"], fx["k_extend"], None, fake_sglang.mla_layer(2), batch)
    assert out is fake_sglang.PARENT_RESULT and "only one of k, v" in backend.kd_last_route[1]


def test_a_mask_that_is_not_ancestor_closed_gives_what_the_mask_says():
    fx = make_verify_batch(2, [50, 7], 24, seed=5, ancestor_closed=False)
    backend, out = _verify(fx, 2)
    assert backend.kd_last_route[0] == "kernel"
    ref = sglang_layout_reference(fx)
    torch.testing.assert_close(out.view_as(ref).float(), ref.float(), rtol=2e-2, atol=2e-2)


def test_padded_graph_rows_are_finite_and_real_rows_exact():
    fx = make_verify_batch(3, [20, 9], 8, seed=8, padded=3)
    backend, out = _verify(fx, 3)
    out = out.view(-1, 3, 512)
    assert torch.isfinite(out.float()).all()
    real = fx["real_requests"] * fx["num_draft_tokens"]
    ref = sglang_layout_reference(fx)
    torch.testing.assert_close(out[:real].float(), ref[:real].float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("mode", ["extend", "decode", "draft_extend"])
def test_other_modes_reach_the_parent_unchanged(mode):
    fx = make_verify_batch(2, [10], 4, seed=1)
    backend, out = _verify(fx, 2, mode=mode)
    assert out is fake_sglang.PARENT_RESULT
    (call,) = [c for c in backend.calls if c[0] == "forward_extend"]
    assert call[1] is fx["q"] and call[2] is fx["k_extend"] and call[3] is fx["v_extend"]
    assert call[6] == dict(save_kv_cache=True, sinks=None, score_mod=None, aux_tensors=None)
    assert backend.kd_last_route[0] == "parent"


@pytest.mark.parametrize("overrides,why", [
    (dict(qk_head_dim=192, v_head_dim=128), "not the absorbed MLA shape"),
    (dict(tp_k_head_num=8), "not the absorbed MLA shape"),
    (dict(k_scale=torch.tensor(0.5)), "scaled"),
    (dict(logit_cap=30.0), "logit capping"),
    (dict(sliding_window_size=128), "sliding-window"),
], ids=["mha-shape", "gqa", "fp8-scale", "logit-cap", "window"])
def test_layers_the_kernel_cannot_serve_go_to_the_parent(overrides, why):
    fx = make_verify_batch(2, [10], 4, seed=2)
    backend, out = _verify(fx, 2, layer=fake_sglang.mla_layer(2, **overrides))
    assert out is fake_sglang.PARENT_RESULT
    assert backend.kd_last_route[0] == "parent" and why in backend.kd_last_route[1]


def test_sinks_go_to_the_parent():
    fx = make_verify_batch(2, [10], 4, seed=3)
    backend = _backend(fx)
    batch = fake_sglang.batch_for(fx)
    backend.init_forward_metadata(batch)
    sinks = torch.zeros(2)
    out = backend.forward_extend(fx["q"], fx["k_extend"], fx["v_extend"], fake_sglang.mla_layer(2), batch, sinks=sinks)
    assert out is fake_sglang.PARENT_RESULT
    assert [c for c in backend.calls if c[0] == "forward_extend"][0][6]["sinks"] is sinks


def test_non_mla_models_and_huge_pools_never_take_the_kernel_path():
    fx = make_verify_batch(2, [10], 4, seed=4)
    backend, out = _verify(fx, 2)
    assert out is not fake_sglang.PARENT_RESULT
    mha = _backend(fx, use_mla=False)
    assert mha.kd_unservable == "the model is not MLA"
    batch = fake_sglang.batch_for(fx)
    mha.init_forward_metadata(batch)
    assert mha.forward_extend(fx["q"], fx["k_extend"], fx["v_extend"], fake_sglang.mla_layer(2), batch) \
        is fake_sglang.PARENT_RESULT
    big = _backend(fx)
    big.token_to_kv_pool.size = 2 ** 31
    assert "int32" in make_backend_class(fake_sglang.TritonAttnBackend).__mro__[0].__init__.__globals__[
        "_unservable_backend"](big)


def test_graph_metadata_forgets_the_eager_conversion():
    fx = make_verify_batch(2, [10], 4, seed=6)
    backend = _backend(fx)
    batch = fake_sglang.batch_for(fx)
    backend.init_forward_metadata(batch)
    assert backend._kd_meta is not None
    backend.init_forward_metadata_out_graph(batch, True)
    assert backend._kd_meta is None
    assert backend.forward_extend(fx["q"], fx["k_extend"], fx["v_extend"], fake_sglang.mla_layer(2), batch) \
        is fake_sglang.PARENT_RESULT
    assert ("init_forward_metadata_out_graph", batch, True) in backend.calls


def test_a_broken_kernel_is_caught_by_these_checks():
    fx = make_verify_batch(2, [30], 12, seed=9)

    def leaky(q, kv, qo, kvp, idx, mask, scale, *, out=None, lse=None):
        return tree_verify_mla_reference(q, kv, qo, kvp, idx, mask | 0xFFF, scale, out=out, lse=lse)  # every node of 12

    backend = _backend(fx)
    backend.launch_op = fake_sglang.RecordingLaunch(leaky)
    batch = fake_sglang.batch_for(fx)
    backend.init_forward_metadata(batch)
    out = backend.forward_extend(fx["q"], fx["k_extend"], fx["v_extend"], fake_sglang.mla_layer(2), batch)
    ref = sglang_layout_reference(fx)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(out.view_as(ref).float(), ref.float(), rtol=2e-2, atol=2e-2)


def _fake_registry(monkeypatch):
    registry = types.ModuleType("sglang.srt.layers.attention.attention_registry")
    registry.ATTENTION_BACKENDS = {"triton": "sglang's own"}

    def register_attention_backend(name):
        def deco(fn):
            registry.ATTENTION_BACKENDS[name] = fn
            return fn
        return deco

    registry.register_attention_backend = register_attention_backend
    for name in ("sglang", "sglang.srt", "sglang.srt.layers", "sglang.srt.layers.attention"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, registry.__name__, registry)
    return registry


def test_plugin_registers_under_the_triton_name(monkeypatch):
    registry = _fake_registry(monkeypatch)
    monkeypatch.delenv("KDTREE_SGLANG", raising=False)
    plugin.register()
    factory = registry.ATTENTION_BACKENDS["triton"]
    assert callable(factory) and factory.__name__ == "create_kdtree_triton_backend"
    with pytest.raises(ValueError, match="Cross attention"):
        factory(types.SimpleNamespace(model_config=types.SimpleNamespace(is_encoder_decoder=True)))


def test_plugin_can_be_switched_off(monkeypatch):
    registry = _fake_registry(monkeypatch)
    monkeypatch.setenv("KDTREE_SGLANG", "0")
    plugin.register()
    assert registry.ATTENTION_BACKENDS["triton"] == "sglang's own"


def test_the_entry_point_is_declared():
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="sglang.srt.plugins") if e.name == "kdtree"]
    assert ep.value == "kdtree.integrations.sglang.plugin:register"
    assert ep.load() is plugin.register
