"""The converter from SGLang's verify metadata to the op contract.

On the CPU its torch path runs directly and its Triton kernels run under the Triton interpreter
in a child process (the variable must be set before triton is imported; see
tests/kernels/test_kernel_triton_interpreted.py); on a GPU the kernels run for real. Both are
compared with `convert_reference` and, through the oracle op, with attention read straight off
SGLang's layout.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

from kdtree.integrations.sglang.converter import OpMetadata, VerifyConverter, convert_reference
from kdtree.bench.sglang_batches import make_verify_batch, sglang_layout_reference
from kdtree.kernels.reference import tree_verify_mla_reference

KEYS = ("qo_indptr", "kv_indptr", "kv_indices", "out_cache_loc", "custom_mask", "mask_indptr")
CASES = [
    dict(prefix_lens=[5, 0, 40], tree_size=7),
    dict(prefix_lens=[3, 100], tree_size=33, mask_dtype=torch.uint8, qo_dtype=torch.int64, ancestor_closed=False),
    dict(prefix_lens=[1], tree_size=1, qo_dtype=torch.int64, padded=3),
    dict(prefix_lens=[70, 2000], tree_size=64, kind="chain"),
    dict(prefix_lens=[9], tree_size=100, kind="star", padded=1),
]
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _args(fx):
    return [fx[k] for k in KEYS]


@pytest.mark.parametrize("case", CASES)
def test_converter_feeds_the_op_what_sglang_means(case):
    fx = make_verify_batch(2, seed=3, **case)
    conv = VerifyConverter(8, 1024, 128, 8192, "cpu")
    meta = conv.convert(*_args(fx))
    real = fx["real_requests"] * fx["num_draft_tokens"]
    pool = fx["pool"].clone()
    pool[fx["out_cache_loc"]] = fx["k_extend"]  # what forward_extend writes before attention
    out = tree_verify_mla_reference(fx["q"], pool.view(-1, 576), meta.qo_indptr, meta.kv_indptr,
                                    meta.kv_indices[: int(meta.kv_indptr[-1])], meta.tree_mask, fx["sm_scale"])
    ref = sglang_layout_reference(fx)
    torch.testing.assert_close(out[:real].float(), ref[:real].float(), rtol=2e-2, atol=2e-2)


def test_buffers_are_preallocated_and_reused():
    conv = VerifyConverter(8, 1024, 128, 8192, "cpu")
    ptrs = [t.data_ptr() for t in (conv.qo_indptr, conv.kv_indptr, conv.kv_indices, conv.tree_mask)]
    for seed in range(3):
        meta = conv.convert(*_args(make_verify_batch(2, [10 + seed, 4], 16, seed=seed)))
        assert meta.kv_indices.data_ptr() == ptrs[2] and meta.tree_mask.data_ptr() == ptrs[3]
        assert meta.qo_indptr.dtype == meta.kv_indptr.dtype == meta.kv_indices.dtype == torch.int32
    assert conv.buffer_bytes == 4 * (9 + 9 + 8192 + 1024 * 4)


@pytest.mark.parametrize("size,match", [
    (dict(max_batch=1), "batch of 2 requests"), (dict(max_rows=8), "draft rows"),
    (dict(max_slots=20), "prefix \\+ draft slots"), (dict(max_tree=4), "more than 4 per request"),
])
def test_batches_the_buffers_cannot_hold_are_refused_by_shape(size, match):
    sizes = {**dict(max_batch=8, max_rows=1024, max_tree=128, max_slots=8192), **size}
    conv = VerifyConverter(sizes["max_batch"], sizes["max_rows"], sizes["max_tree"], sizes["max_slots"], "cpu")
    with pytest.raises(ValueError, match=match):
        conv.convert(*_args(make_verify_batch(2, [10, 4], 16, seed=0)))


def test_slot_ids_beyond_int32_are_an_error_not_a_wrap():
    fx = make_verify_batch(1, [4], 2, seed=0)
    fx["kv_indices"] = fx["kv_indices"] + 2 ** 31
    with pytest.raises(ValueError, match="does not fit int32"):
        convert_reference(*_args(fx))


def test_trees_over_the_kernels_limit_are_refused():
    with pytest.raises(ValueError, match="max_tree"):
        VerifyConverter(1, 2048, 2048, 4096, "cpu")


@pytest.mark.skipif(not INTERPRETED and not torch.cuda.is_available(), reason="needs TRITON_INTERPRET=1 or a GPU")
@pytest.mark.parametrize("case", CASES)
def test_triton_kernels_equal_the_reference(case):
    device = "cuda" if torch.cuda.is_available() and not INTERPRETED else "cpu"
    fx = make_verify_batch(2, seed=4, device=device, **case)
    conv = VerifyConverter(8, 1024, 128, 8192, device)
    for buf in (conv.qo_indptr, conv.kv_indptr, conv.kv_indices, conv.tree_mask):
        buf.fill_(-7)  # poison: every element the op reads must be written
    batch, rows = fx["qo_indptr"].numel() - 1, fx["out_cache_loc"].numel()
    n = fx["kv_indices"].numel() + rows
    out = OpMetadata(conv.qo_indptr[: batch + 1], conv.kv_indptr[: batch + 1], conv.kv_indices[:n],
                     conv.tree_mask[: rows * conv.mask_words].view(rows, conv.mask_words))
    conv.launch(*_args(fx), out)
    ref = convert_reference(*_args(fx), conv.mask_words)
    assert torch.equal(out.qo_indptr.cpu(), ref.qo_indptr.cpu())
    assert torch.equal(out.kv_indptr.cpu(), ref.kv_indptr.cpu())
    assert torch.equal(out.kv_indices[: ref.kv_indices.numel()].cpu(), ref.kv_indices.cpu())
    assert torch.equal(out.tree_mask.cpu(), ref.tree_mask.cpu())


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
@pytest.mark.skipif(INTERPRETED, reason="this process already interprets triton")
def test_triton_kernels_under_the_interpreter(run_interpreted):
    child = run_interpreted(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-k",
                             "test_triton_kernels_equal_the_reference", str(Path(__file__).resolve())])
    report = child.stdout[-4000:] + child.stderr[-2000:]
    assert child.returncode == 0, report
    assert f"{len(CASES)} passed" in child.stdout, report
