"""Poisoning and comparison helpers: unwritten is told apart from NaN, for every common dtype."""

from __future__ import annotations

import math

import pytest
import torch

from kdtree.gates.tensors import compare, poison_, poisoned_mask


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_float_poison_is_a_nan_that_arithmetic_does_not_make(dtype):
    t = torch.empty(4, 3, dtype=dtype)
    p = poison_(t)
    assert torch.isnan(t).all() and poisoned_mask(t, p).all()
    t[1, 2] = float("nan")  # a computed NaN
    t[0, 0] = (torch.zeros((), dtype=dtype) / 0)
    t[2, 1] = -(torch.zeros((), dtype=dtype) / 0)
    mask = poisoned_mask(t, p)
    assert not mask[1, 2] and not mask[0, 0] and not mask[2, 1] and int(mask.sum()) == 9


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_float_poison_is_fresh_per_call_and_never_a_canonical_nan(dtype):
    a, b = torch.empty(4096, dtype=dtype), torch.empty(4096, dtype=dtype)
    pa, pb = poison_(a), poison_(b)
    ints = pa.bits.dtype
    assert not torch.equal(a.view(ints), b.view(ints))  # no constant pattern to recognise
    assert len(set(pa.bits.tolist())) > 100  # the pattern varies within one buffer too
    assert int((a.view(ints) < 0).sum()) > 1000  # both signs
    canonical = torch.tensor([float("nan")], dtype=dtype)
    for nan in (canonical, -canonical, torch.full((1,), -1, dtype=ints).view(dtype)):
        assert not bool((a.view(ints) == nan.view(ints)).any())
    assert not bool(poisoned_mask(b, pa).all())  # one poison does not stand for another


def test_same_seed_same_poison():
    a, b = torch.empty(64, dtype=torch.bfloat16), torch.empty(64, dtype=torch.bfloat16)
    assert torch.equal(poison_(a, 7).bits, poison_(b, 7).bits)


@pytest.mark.parametrize("dtype,value", [(torch.int32, -(2 ** 31)), (torch.int64, -(2 ** 63)), (torch.uint8, 255)])
def test_integer_poison_is_a_sentinel(dtype, value):
    t = torch.zeros(5, dtype=dtype)
    p = poison_(t)
    assert (t == value).all() and poisoned_mask(t, p).all()


def test_bool_outputs_are_refused():
    with pytest.raises(ValueError, match="bool"):
        poison_(torch.zeros(3, dtype=torch.bool))


def test_compare_counts_unwritten_and_non_finite_separately():
    ref = torch.arange(12, dtype=torch.float64).reshape(3, 4) + 1
    out = torch.empty(3, 4)
    p = poison_(out)
    out[:2] = ref[:2].float()  # row 2 is left unwritten
    out[0, 1] = float("inf")
    c = compare("y", out, ref, poison=p)
    assert c.unwritten == 4 and c.first_unwritten == (2, 0)
    assert c.non_finite == 1 and c.first_non_finite == (0, 1)
    assert math.isnan(c.rel_l2) and len(c.problems) == 2


def test_compare_numbers_and_matching_infinities():
    ref = torch.tensor([1.0, 2.0, float("-inf")], dtype=torch.float64)
    out = torch.tensor([1.0, 2.2, float("-inf")])
    c = compare("lse", out, ref)
    assert not c.problems
    assert c.max_abs == pytest.approx(0.2, rel=1e-5)
    assert c.rel_l2 == pytest.approx(0.2 / math.sqrt(5), rel=1e-5)
    assert compare("lse", torch.tensor([1.0, 2.0, 0.0]), ref).non_finite == 1


def test_int_compare_and_unwritten():
    ref = torch.tensor([3, 1, 2])
    out = torch.empty(3, dtype=torch.int64)
    p = poison_(out)
    out[:2] = ref[:2]
    c = compare("idx", out, ref, poison=p)
    assert c.unwritten == 1 and c.first_unwritten == (2,)


def test_nan_reference_is_a_broken_oracle():
    with pytest.raises(ValueError, match="oracle"):
        compare("y", torch.zeros(2), torch.tensor([0.0, float("nan")]))


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="shape"):
        compare("y", torch.zeros(2), torch.zeros(3))
