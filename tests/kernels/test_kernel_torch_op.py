"""``torch.ops.kdtree.tree_verify_mla``: its schema, its fake implementation (shapes only, the
contract's messages) under FakeTensorMode, torch.compile(fullgraph=True) recording one opaque
node, and on a GPU the real op against the dense oracle, eager and compiled."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import kdtree.kernels as K
from kernel_cases import CASES, build, case_seed, dense_truth

OP = torch.ops.kdtree.tree_verify_mla.default
_SMALL = next(c for c in CASES if c.name == "mixed-B4-H3")


def _empty_call(device, nq=5, heads=8, slots=100, keys=20, words=1, batch=1):
    """Uninitialised inputs of the contract's shapes and dtypes (values never read here)."""
    return dict(
        q=torch.empty(nq, heads, 576, dtype=torch.bfloat16, device=device),
        kv_cache=torch.empty(slots, 576, dtype=torch.bfloat16, device=device),
        qo_indptr=torch.empty(batch + 1, dtype=torch.int32, device=device),
        kv_indptr=torch.empty(batch + 1, dtype=torch.int32, device=device),
        kv_indices=torch.empty(keys, dtype=torch.int32, device=device),
        tree_mask=torch.empty(nq, words, dtype=torch.int32, device=device),
    )


def test_schema_declares_out_and_lse_written_in_place():
    schema = OP._schema
    mutated = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert mutated == {"out", "lse"}
    assert [a.name for a in schema.arguments] == ["q", "kv_cache", "qo_indptr", "kv_indptr", "kv_indices",
                                                  "tree_mask", "sm_scale", "out", "lse"]
    assert not schema.returns


def test_fake_implementation_accepts_the_contract_on_fake_cuda_tensors():
    with FakeTensorMode():
        call = _empty_call("cuda")
        out = torch.empty(5, 8, 512, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(5, 8, dtype=torch.float32, device="cuda")
        assert OP(*call.values(), 0.1, out, lse) is None
        assert OP(*call.values(), 0.1, out, None) is None
        assert out.shape == (5, 8, 512) and out.device.type == "cuda"


@pytest.mark.parametrize("breach,message", [
    (lambda c: c.update(q=torch.empty(5, 8, 512, dtype=torch.bfloat16)), "q: last dimension must be 576"),
    (lambda c: c.update(kv_cache=torch.empty(100, 576, dtype=torch.float16)), "kv_cache: dtype must be one of"),
    (lambda c: c.update(tree_mask=torch.empty(4, 1, dtype=torch.int32)), "tree_mask: has 4 rows, q has 5"),
    (lambda c: c.update(out=torch.empty(5, 4, 512, dtype=torch.bfloat16)), r"out: expected shape \(5, 8, 512\)"),
    (lambda c: c.update(lse=torch.empty(5, 8, 2, dtype=torch.float32)), "lse: expected 2 dimensions"),
    (lambda c: c.update(sm_scale=-1.0), "sm_scale: must be a positive float"),
])
def test_fake_implementation_refuses_a_breach_with_the_contracts_message(breach, message):
    with FakeTensorMode():
        call = dict(_empty_call("cpu"), sm_scale=0.1, out=torch.empty(5, 8, 512, dtype=torch.bfloat16), lse=None)
        breach(call)
        with pytest.raises(ValueError, match=message):
            OP(**call)


class _Verify(torch.nn.Module):
    """A model fragment that calls the kernel through the public name and uses its output."""

    def forward(self, q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, lse):
        out = K.tree_verify_mla(q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, 0.0417, lse=lse)
        return out.float().sum(-1) + lse


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_torch_compile_fullgraph_records_the_op_once(dynamic):
    torch._dynamo.reset()
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    # meta tensors: the captured graph runs on the fake implementation, no GPU or build needed
    call = _empty_call("meta")
    lse = torch.empty(5, 8, dtype=torch.float32, device="meta")
    result = torch.compile(_Verify(), fullgraph=True, dynamic=dynamic, backend=capture)(*call.values(), lse)
    assert result.shape == (5, 8)
    (graph,) = graphs
    ops = [n for n in graph.graph.nodes if n.op == "call_function" and n.target is OP]
    assert len(ops) == 1
    assert ops[0].kwargs.get("lse", ops[0].args[8] if len(ops[0].args) > 8 else None) is not None


def test_torch_compile_reports_a_breach_while_tracing():
    torch._dynamo.reset()
    call = _empty_call("meta")
    call["tree_mask"] = torch.empty(4, 1, dtype=torch.int32, device="meta")
    lse = torch.empty(5, 8, dtype=torch.float32, device="meta")
    with pytest.raises(Exception, match="tree_mask: has .* rows, q has 5"):
        torch.compile(_Verify(), fullgraph=True, backend="eager")(*call.values(), lse)


@pytest.mark.gpu
def test_the_op_on_the_gpu_matches_the_oracle_eager_and_compiled():
    inp = build(_SMALL, torch.bfloat16, case_seed(_SMALL, "torch-op")).to("cuda")
    truth_out, truth_lse = dense_truth(inp)
    nq, heads = inp.q.shape[:2]

    out = torch.full((nq, heads, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((nq, heads), float("nan"), dtype=torch.float32, device="cuda")
    OP(*inp.args(), out, lse)
    eager_out = K.tree_verify_mla(*inp.args())
    torch.testing.assert_close(out, eager_out, rtol=0, atol=0)  # the op is the launcher, bit for bit
    assert float((out.double().cpu() - truth_out).norm() / truth_out.norm()) < 2e-2
    assert float((lse.double().cpu() - truth_lse).abs().max()) < 2e-2

    def fragment(q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask):
        return K.tree_verify_mla(q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, inp.sm_scale) * 2

    compiled = torch.compile(fragment, fullgraph=True)(*inp.args()[:6])
    torch.testing.assert_close(compiled, eager_out * 2, rtol=0, atol=0)
    with pytest.raises(ValueError, match="q: the CUDA kernel needs CUDA tensors"):
        OP(*inp.to("cpu").args(), out.cpu(), None)


def test_the_public_api_is_typed_and_listed():
    import typing
    from pathlib import Path

    assert set(K.__all__) == {"LaunchPlan", "pack_sglang_custom_mask", "pack_tree_masks", "plan", "plan_bucket",
                              "set_debug", "tree_mask_from_parents", "tree_verify_mla"}
    assert all(callable(getattr(K, name)) for name in K.__all__)
    hints = typing.get_type_hints(K.tree_verify_mla)
    assert hints["q"] is torch.Tensor and hints["return"] is torch.Tensor and hints["sm_scale"] is float
    assert hints["out"] == typing.Optional[torch.Tensor]
    assert (Path(K.__file__).parent / "py.typed").is_file()
