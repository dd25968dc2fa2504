"""`contract.validate` turns every breach of the op contract into a ValueError naming the argument,
and every implementation runs it before touching the data."""

from __future__ import annotations

import pytest
import torch

from kdtree.kernels import plan, plan_bucket
from kdtree.kernels.contract import validate
from kdtree.kernels.device_facts import DeviceFacts
from kernel_cases import CASES, build
from kernel_impls import IMPLS

_CASE = next(c for c in CASES if c.name == "mixed-B4-H3")  # 4 requests, T_b 5/1/40/33, 2 mask words


def _args():
    """A valid call as a dict of validate's arguments (bf16, CPU)."""
    inp = build(_CASE, torch.bfloat16, seed=1234)
    return dict(q=inp.q, kv_cache=inp.kv_cache, qo_indptr=inp.qo_indptr, kv_indptr=inp.kv_indptr,
                kv_indices=inp.kv_indices, tree_mask=inp.tree_mask, sm_scale=inp.sm_scale)


def _call(**override):
    args = _args()
    args.update({k: (v(args) if callable(v) else v) for k, v in override.items()})
    return validate(**args)


def _with(name, fn):
    """Override `name` with fn(current value)."""
    return {name: lambda a: fn(a[name])}


def _indptr_swap(t):
    t = t.clone()
    t[1], t[2] = t[2].item(), t[1].item()
    return t


def _drop_own_bit(mask):
    mask = mask.clone()
    mask[3, 0] &= ~(1 << 3)  # row 3 is node 3 of request 0
    return mask


def _set_bit(mask, row, bit):
    mask = mask.clone()
    word = int(mask[row, bit // 32]) & 0xFFFFFFFF | (1 << (bit % 32))
    mask[row, bit // 32] = word - (1 << 32) if word >= 1 << 31 else word
    return mask


def _noncontig(t):
    wide = torch.empty(t.shape[0], 2 * t.shape[1], *t.shape[2:], dtype=t.dtype)
    wide[:, ::2] = t
    return wide[:, ::2]


BREACHES = {
    "q dtype fp16": ("q", _with("q", lambda t: t.half())),
    "q not a tensor": ("q", {"q": lambda a: a["q"].tolist()}),
    "q head dim 575": ("q", _with("q", lambda t: t[..., :575].contiguous())),
    "q 129 heads": ("q", _with("q", lambda t: t[:, :1].expand(-1, 129, -1).contiguous())),
    "q non-contiguous": ("q", _with("q", _noncontig)),
    "kv_cache dtype differs from q": ("kv_cache", _with("kv_cache", lambda t: t.float())),
    "kv_cache rows 512 wide": ("kv_cache", _with("kv_cache", lambda t: t[:, :512].contiguous())),
    "kv_cache non-contiguous": ("kv_cache", _with("kv_cache", lambda t: t.t().contiguous().t())),
    "qo_indptr int64": ("qo_indptr", _with("qo_indptr", lambda t: t.long())),
    "qo_indptr not monotonic": ("qo_indptr", _with("qo_indptr", _indptr_swap)),
    "qo_indptr not starting at 0": ("qo_indptr", _with("qo_indptr", lambda t: t + 1)),
    "kv_indptr not monotonic": ("kv_indptr", _with("kv_indptr", _indptr_swap)),
    "kv_indptr length": ("kv_indptr", _with("kv_indptr", lambda t: t[:-1].contiguous())),
    "kv_indices non-contiguous": ("kv_indices", _with("kv_indices", lambda t: torch.stack([t, t], 1)[:, 0])),
    "kv_indices slot id out of range": ("kv_indices", {"kv_indices": lambda a: torch.where(
        torch.arange(a["kv_indices"].numel()) == 5, a["kv_cache"].shape[0], a["kv_indices"]).int()}),
    "kv_indices negative slot id": ("kv_indices", _with("kv_indices", lambda t: torch.cat([t[:-1], -t[-1:] - 1]))),
    "tree_mask row missing its own node": ("tree_mask", _with("tree_mask", _drop_own_bit)),
    "tree_mask too few words for T_b": ("tree_mask", _with("tree_mask", lambda t: t[:, :1].contiguous())),
    "tree_mask bit past a tree of 5": ("tree_mask", _with("tree_mask", lambda t: _set_bit(t, 0, 5))),
    "tree_mask bit in the spare word of a tree of 1": ("tree_mask", _with("tree_mask", lambda t: _set_bit(t, 5, 32))),
    "tree_mask bit 40 of a tree of 40": ("tree_mask", _with("tree_mask", lambda t: _set_bit(t, 6, 40))),
    "tree_mask sign bit past a tree of 33": ("tree_mask", _with("tree_mask", lambda t: _set_bit(t, 46, 63))),
    "tree_mask row count": ("tree_mask", _with("tree_mask", lambda t: t[:-1].contiguous())),
    "tree_mask 33 words": ("tree_mask", _with("tree_mask", lambda t: torch.zeros(t.shape[0], 33, dtype=torch.int32))),
    "sm_scale zero": ("sm_scale", {"sm_scale": 0.0}),
    "sm_scale a tensor": ("sm_scale", {"sm_scale": lambda a: torch.tensor(a["sm_scale"])}),
    "out wrong shape": ("out", {"out": lambda a: torch.empty(a["q"].shape[0], a["q"].shape[1], 576,
                                                           dtype=torch.bfloat16)}),
    "out wrong dtype": ("out", {"out": lambda a: torch.empty(a["q"].shape[0], a["q"].shape[1], 512)}),
    "lse wrong shape": ("lse", {"lse": lambda a: torch.empty(a["q"].shape[0], a["q"].shape[1] + 1)}),
    "lse wrong dtype": ("lse", {"lse": lambda a: torch.empty(a["q"].shape[:2], dtype=torch.bfloat16)}),
}


def test_valid_call_passes():
    problem = _call()
    assert (problem.num_rows, problem.num_heads, problem.batch, problem.mask_words) == (79, 3, 4, 2)


@pytest.mark.parametrize("what", list(BREACHES))
def test_breach_names_the_argument(what):
    arg, override = BREACHES[what]
    with pytest.raises(ValueError, match=rf"^{arg}:"):
        _call(**override)


def test_tree_larger_than_1024_nodes():
    T = 1025
    with pytest.raises(ValueError, match=r"^qo_indptr:.*1025"):
        validate(torch.zeros(T, 1, 576, dtype=torch.bfloat16), torch.zeros(T, 576, dtype=torch.bfloat16),
                 torch.tensor([0, T], dtype=torch.int32), torch.tensor([0, T], dtype=torch.int32),
                 torch.arange(T, dtype=torch.int32), torch.full((T, 32), -1, dtype=torch.int32), 0.1)


def test_fewer_slots_than_tree_nodes():
    args = _args()
    kv = args["kv_indptr"].clone()
    kv[2] = kv[1]  # request 1 (T_b = 1) gets no slot at all
    with pytest.raises(ValueError, match=r"^kv_indptr:"):
        validate(**dict(args, kv_indptr=kv))


@pytest.mark.gpu
def test_tensor_on_another_device():
    args = _args()
    with pytest.raises(ValueError, match=r"^kv_cache:"):
        validate(**dict(args, kv_cache=args["kv_cache"].cuda()))


@pytest.mark.parametrize("impl", [pytest.param(i, id=i.name) for i in IMPLS if not i.gpu])
def test_every_cpu_implementation_validates(impl):
    args = _args()
    args = {k: (v.to(impl.dtype) if k in ("q", "kv_cache") else v) for k, v in args.items()}
    args["tree_mask"] = _drop_own_bit(args["tree_mask"])
    with pytest.raises(ValueError, match=r"^tree_mask:"):
        impl.fn()(*args.values())


def test_a_bit_past_the_tree_is_named_with_its_row_and_bit():
    with pytest.raises(ValueError, match=r"^tree_mask: row 6 sets bit 40, past its request's 40 tree nodes"):
        _call(**_with("tree_mask", lambda t: _set_bit(t, 6, 40)))


# -- the planner's arguments (kdtree.kernels.plan, plan_bucket) -----------------------------------

@pytest.mark.parametrize("kwargs,match", [
    (dict(num_heads=200), r"^num_heads: the kernel takes 1 to 128 heads, got 200"),
    (dict(device=DeviceFacts(40, (7, 5))), r"^device: compute capability 7\.5; the kernel needs 8\.0"),
    (dict(device="cpu"), r"^device: expected a CUDA device, got cpu"),
])
def test_plan_refuses_what_the_kernel_cannot_run_naming_the_argument(kwargs, match):
    args = dict(num_rows=8, num_heads=16, batch=1, mask_words=1, num_kv=100, device=DeviceFacts(132, (9, 0)))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        plan(**args)
    with pytest.raises(ValueError, match=match):
        plan_bucket(1, 8, 4096, args["num_heads"], args["device"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a CUDA device to plan for")
def test_plan_without_a_device_on_a_machine_without_cuda_says_what_to_pass():
    with pytest.raises(ValueError, match=r"^device: no CUDA device here .*DeviceFacts\(sm_count=\.\.\., capability"):
        plan(8, 16, 1, 1, 100)


# -- the torch operator --------------------------------------------------------------------------

def test_the_torch_op_passes_opcheck_on_meta_tensors():
    from kdtree.kernels.torch_op import tree_verify_mla_op

    inp = build(_CASE, torch.bfloat16, seed=7)
    nq, h = inp.q.shape[:2]
    args = [t.to("meta") for t in (inp.q, inp.kv_cache, inp.qo_indptr, inp.kv_indptr, inp.kv_indices, inp.tree_mask)]
    out = torch.empty(nq, h, 512, dtype=torch.bfloat16, device="meta")
    lse = torch.empty(nq, h, dtype=torch.float32, device="meta")
    torch.library.opcheck(tree_verify_mla_op, (*args, inp.sm_scale, out, lse))
