"""FlashMLA's dense decode as a peer (`kdtree.bench.flashmla_peer`).

CPU: why it does not load (no CUDA, not sm_90, the import's own error, no legacy extension); our
case in its paged layout gives back the same rows; bound to a CPU stand-in of ``flash_mla`` (the
``fake_flash_mla`` fixture: causal attention over the pages), its output is the fp64 oracle's on
the chain, follows queries refreshed in place, and a wrong output reads as a large oracle error.
GPU (skipped where FlashMLA does not load): the real wheel against the oracle.
"""

from __future__ import annotations

import math
import sys

import pytest
import torch

from kdtree.bench import flashmla_peer
from kdtree.bench.cases import make_case


@pytest.fixture
def hopper(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))


def test_no_cuda_is_the_reason_on_a_machine_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert flashmla_peer.unavailable_reason() == "no CUDA device"


def test_a_device_other_than_sm90_is_named(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (12, 0))
    assert "sm_90a only, this device is sm_120" in flashmla_peer.unavailable_reason()


def test_a_missing_module_gives_the_import_error(monkeypatch, hopper):
    monkeypatch.setitem(sys.modules, "flash_mla", None)  # import raises ImportError
    reason = flashmla_peer.unavailable_reason()
    assert reason.startswith("import flash_mla failed") and "ModuleNotFoundError" in reason


def test_a_library_this_torch_cannot_load_gives_the_loaders_text(monkeypatch, hopper, tmp_path):
    package = tmp_path / "flash_mla"
    package.mkdir()
    (package / "__init__.py").write_text(
        "raise OSError('cuda.abi3.so: undefined symbol: torch_new_list_reserve_size')\n")
    (package / "VERSION").write_text("1.0.0\n")
    monkeypatch.delitem(sys.modules, "flash_mla", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    reason = flashmla_peer.unavailable_reason()
    assert "OSError" in reason and "undefined symbol: torch_new_list_reserve_size" in reason
    assert flashmla_peer.version() == "1.0.0"  # read without importing it


def test_a_wheel_without_its_legacy_extension_cannot_decode_dense(monkeypatch, hopper, fake_flash_mla):
    module = fake_flash_mla()
    module.has_legacy = lambda: False
    loader = type(sys)("flash_mla._loader")
    loader._LEGACY_UNAVAILABLE = "this wheel was built with FLASH_MLA_BUILD_LEGACY=0"
    monkeypatch.setitem(sys.modules, "flash_mla._loader", loader)
    reason = flashmla_peer.unavailable_reason()
    assert "without its legacy extension" in reason and "FLASH_MLA_BUILD_LEGACY=0" in reason


def test_the_fake_module_loads(hopper, fake_flash_mla):
    fake_flash_mla()
    assert flashmla_peer.unavailable_reason() is None


def _case(T=5, reqs_l=(0, 63, 64, 200), H=3, seed=4):
    return make_case(H, [(T, ell) for ell in reqs_l], "random", seed, device="cpu")


def test_the_paged_layout_gives_back_each_requests_rows():
    case = _case()
    paged = flashmla_peer.paged_layout(case["q"], case["kv_cache"], case["qo_indptr"], case["kv_indptr"],
                                       case["kv_indices"])
    lens = [5, 68, 69, 205]  # prefix + T
    assert paged.cache_seqlens.tolist() == lens and paged.cache_seqlens.dtype == torch.int32
    assert paged.block_table.dtype == torch.int32 and paged.block_table.shape == (4, 4)
    assert paged.k_cache.shape == (1 + 2 + 2 + 4, 64, 1, 576)
    assert sorted(paged.block_table[b, :p].tolist() for b, p in enumerate([1, 2, 2, 4])) == \
        [[0], [1, 2], [3, 4], [5, 6, 7, 8]]  # every page used once
    kvp = case["kv_indptr"].tolist()
    for b, n in enumerate(lens):
        want = case["kv_cache"][case["kv_indices"][kvp[b]:kvp[b + 1]].long()]
        assert torch.equal(flashmla_peer.request_rows(paged, b), want)
    assert not paged.k_cache.view(-1, 576)[5:64].any()  # padding rows are zero
    assert paged.q.shape == (4, 5, 3, 576) and paged.q.data_ptr() == case["q"].data_ptr()  # a view


def test_ragged_query_rows_are_refused_with_the_reason():
    case = make_case(2, [(4, 10), (3, 10)], "random", 1, device="cpu")
    with pytest.raises(ValueError, match="one number of query rows per request"):
        flashmla_peer.paged_layout(case["q"], case["kv_cache"], case["qo_indptr"], case["kv_indptr"],
                                   case["kv_indices"])


def _bind(case):
    peer = flashmla_peer.FlashMLADecode(device="cpu")
    return peer.bind(case["q"], case["kv_cache"], case["qo_indptr"], case["kv_indptr"], case["kv_indices"],
                     case["sm_scale"])


def test_the_bound_call_is_the_oracle_on_the_chain_and_follows_refreshed_queries(fake_flash_mla):
    module = fake_flash_mla()
    case = _case(T=6, reqs_l=(70, 130), H=2)
    call = _bind(case)
    assert module.calls == 1  # bind ran it once (FlashMLA fills its scheduling metadata there)
    got = call()
    assert got.shape == (12, 2, 512)
    assert flashmla_peer.oracle_rel_l2(got, case) < 1e-2
    case["q"].normal_(generator=torch.Generator().manual_seed(9))  # the gate's refresh, in place
    assert flashmla_peer.oracle_rel_l2(call(), case) < 1e-2
    # and the chain is what it computes, not the case's tree
    from kdtree.bench.cases import oracle
    tree_out, _ = oracle(case)
    assert float((call().double() - tree_out).norm() / tree_out.norm()) > 1e-2


def test_a_wrong_output_reads_as_an_oracle_error(fake_flash_mla):
    fake_flash_mla(wrong=True)
    case = _case(T=3, reqs_l=(40,), H=2)
    assert flashmla_peer.oracle_rel_l2(_bind(case)(), case) > 0.3
    poisoned = torch.full((3, 2, 512), math.nan)
    assert flashmla_peer.oracle_rel_l2(poisoned, case) == math.inf


@pytest.mark.gpu
def test_the_real_flashmla_matches_the_oracle_on_the_chain():
    reason = flashmla_peer.unavailable_reason()
    if reason is not None:
        pytest.skip(f"FlashMLA's dense decode does not run here: {reason}")
    for H, T, reqs_l in [(16, 1, (4000,)), (8, 16, (3000, 70)), (128, 4, (129,))]:
        case = make_case(H, [(T, ell) for ell in reqs_l], "random", 3, device="cuda")
        assert flashmla_peer.oracle_rel_l2(_bind_cuda(case)(), case) < 1e-2, (H, T, reqs_l)


def _bind_cuda(case):
    peer = flashmla_peer.FlashMLADecode()
    return peer.bind(case["q"], case["kv_cache"], case["qo_indptr"], case["kv_indptr"], case["kv_indices"],
                     case["sm_scale"])


def test_the_peers_tool_summarises_flashmla_beside_flashinfer():
    from kdtree.tools.peers import markdown

    facts = {"device": "fake", "torch": "x", "flashinfer": "absent", "bw": 3e12, "rate": 7e14, "argv": "peers --flashmla",
             "flash_mla": "1.0.0"}
    rows = [{"shape": s, "floor_ms": 0.1, "ours_tree_ms": 0.2, "ours_tree_roofline": 0.5, "flashmla_ms": r * 0.2,
             "flashmla_over_ours_tree": r} for s, r in (("a", 0.9), ("b", 1.3), ("c", 1.1))]
    text = markdown(rows, facts)
    assert "FlashMLA dense decode time / ours (tree): median 1.100, min 0.900 (flash_mla 1.0.0)" in text
