"""On the GPU machine, with the sglang 0.5.23 wheel installed (``pip install --no-deps``): the
backend against SGLang's real Triton kernel, and SGLang's own attention test kit with our backend
registered. Skipped with the reason on CPU, or where SGLang cannot be imported (the reason names
the import that failed)."""

from __future__ import annotations

import unittest

import pytest
import torch

from kdtree.bench.sglang_verify import kdtree_sglang_verify, sglang_triton_verify
from kdtree.integrations.sglang import plugin
from kdtree.integrations.sglang.converter import VerifyConverter
from kdtree.bench.sglang_batches import make_verify_batch, sglang_layout_reference

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def extend_attention_fwd():
    from kdtree.integrations.sglang.sglang_kernels import load_extend_attention

    try:
        fn, how = load_extend_attention()
    except ImportError as err:
        pytest.skip(f"SGLang's extend_attention_fwd cannot be loaded: {err}")
    print(f"SGLang's extend_attention_fwd loaded from {how}")
    return fn


@pytest.mark.parametrize("heads,lens,n,kind,mask,closed,padded", [
    (16, [4000, 17], 64, "random", torch.bool, True, 0),
    (16, [0, 1, 900], 8, "chain", torch.uint8, True, 0),
    (128, [2500], 16, "star", torch.bool, True, 0),
    (16, [300, 3000], 32, "random", torch.bool, False, 0),
    (16, [5, 2000], 16, "random", torch.uint8, True, 3),
    (16, [33000], 64, "random", torch.bool, True, 0),
])
def test_backend_path_matches_sglangs_triton_kernel(extend_attention_fwd, heads, lens, n, kind, mask, closed, padded):
    from kdtree.kernels import tree_verify_mla

    fx = make_verify_batch(heads, lens, n, seed=sum(lens) + n, device="cuda", mask_dtype=mask, kind=kind,
                           ancestor_closed=closed, padded=padded)
    sg_fx = dict(fx, pool=fx["pool"].clone())
    sg_fx["pool"][fx["out_cache_loc"]] = fx["k_extend"]
    theirs = sglang_triton_verify(sg_fx, extend_attention_fwd)
    ours = torch.full_like(theirs, float("nan"))
    kdtree_sglang_verify(fx, VerifyConverter(8, 1024, 128, 80000, "cuda"), tree_verify_mla, ours)
    assert torch.isfinite(ours.float()).all(), "padded rows too must be finite"
    real = fx["real_requests"] * n
    oracle = sglang_layout_reference(fx)[:real].float()
    err_ours = (ours[:real].float() - oracle).norm() / oracle.norm()
    err_theirs = (theirs[:real].float() - oracle).norm() / oracle.norm()
    rel = (ours[:real].float() - theirs[:real].float()).norm() / theirs[:real].float().norm()
    print(f"rel-L2 ours vs SGLang {rel:.2e}; vs fp64: ours {err_ours:.2e}, SGLang {err_theirs:.2e}")
    assert rel < 1e-2 and err_ours < 1e-2


def _kit():
    """The kit's modules; SGLang dependencies this machine lacks and the attention path does not
    use (networking, notebooks, quantization formats) are stubbed and named in the output."""
    from sglang_kit_imports import import_with_stubs

    try:
        (fbi, mla, runner), stubbed = import_with_stubs([
            "sglang.srt.model_executor.forward_batch_info",
            "sglang.test.kits.attention_unittest.attention_methods.mla_attention",
            "sglang.test.kits.attention_unittest.runner_modes.speculative_target_verify_runner"])
    except Exception as err:  # noqa: BLE001 - report exactly which import fails
        pytest.skip(f"SGLang's attention_unittest kit cannot be imported here: {type(err).__name__}: {err}")
    print(f"SGLang kit imported; stubbed missing modules: {stubbed or 'none'}")
    return fbi.ForwardMode, mla.MLAAttentionCase, runner


@pytest.mark.parametrize("topk,draft", [(1, 4), (2, 3)])
def test_sglang_kit_mla_eagle_verify_runs_on_our_kernel(topk, draft):
    ForwardMode, MLAAttentionCase, runner = _kit()
    plugin.register()
    from kdtree.integrations.sglang.backend import backend_class

    cls = backend_class()
    before = cls.kd_kernel_calls
    case = MLAAttentionCase(name=f"kdtree_mla_verify_topk{topk}", backend="triton",
                            forward_mode=ForwardMode.TARGET_VERIFY, num_heads=16, page_size=1,
                            prefix_lens=(37, 300), extend_lens=(draft, draft))
    runner.run_mla_eagle_verify_case(unittest.TestCase(), case, topk=topk, kv_lora_rank=512, qk_rope_head_dim=64,
                                     dtype=torch.bfloat16, max_context_len=1024)
    assert cls.kd_kernel_calls > before, "the kit's verify did not reach the kernel path"


def _kit_graph_case(ForwardMode, MLAAttentionCase, runner):
    case = MLAAttentionCase(name="kdtree_mla_verify_graph", backend="triton", forward_mode=ForwardMode.TARGET_VERIFY,
                            num_heads=16, page_size=1, prefix_lens=(37, 300), extend_lens=(4, 4))
    runner.run_mla_eagle_verify_cuda_graph_case(unittest.TestCase(), case, topk=1, kv_lora_rank=512,
                                                qk_rope_head_dim=64, dtype=torch.bfloat16, max_context_len=1024)


def test_sglang_kit_mla_eagle_verify_cuda_graph_runs_on_our_kernel():
    """The kit's CUDA-graph case (init_cuda_graph_state, an eager forward, out_graph at capture,
    in_graph, the capture forward; the replay view's out_graph + in_graph and forward, padded to the
    capture batch) goes through the kernel with the bucket's plan and matches the kit's reference.

    Where the case fails, it is run again with SGLang's own ``TritonAttnBackend`` in our place: if
    that fails too, the case is broken here whatever the backend (seen on the H200 with 0.5.23:
    354 of 512 elements off by up to 0.39 with SGLang's backend, the same as with ours), and the
    test is an expected failure that says so; if SGLang's passes, ours is wrong and the test fails."""
    ForwardMode, MLAAttentionCase, runner = _kit()
    from sglang.srt.layers.attention import attention_registry
    from sglang_kit_imports import STUB_CALLS

    plugin.register()
    from kdtree.integrations.sglang.backend import backend_class

    cls = backend_class()
    before = cls.kd_kernel_calls
    try:
        _kit_graph_case(ForwardMode, MLAAttentionCase, runner)
        ours = None
    except AssertionError as err:
        ours = err
    assert cls.kd_kernel_calls > before, "the kit's graph verify did not reach the kernel path"
    if ours is None:
        return
    ours_factory = attention_registry.ATTENTION_BACKENDS["triton"]
    attention_registry.ATTENTION_BACKENDS["triton"] = attention_registry.create_triton_backend
    try:
        _kit_graph_case(ForwardMode, MLAAttentionCase, runner)
        theirs = None
    except AssertionError as err:
        theirs = err
    finally:
        attention_registry.ATTENTION_BACKENDS["triton"] = ours_factory
    if theirs is None:
        raise AssertionError(f"SGLang's own backend passes the kit's graph case, ours fails: {ours}")
    first_line = str(theirs).strip().splitlines()
    pytest.xfail(f"SGLang 0.5.23's own TritonAttnBackend fails this kit case here too ({' '.join(first_line[:3])}); "
                 f"stubs called: {sorted(set(STUB_CALLS)) or 'none'}")
