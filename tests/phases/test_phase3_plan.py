"""Phase 3's bucket launch plans (no GPU): one plan per bucket, close to exact-length plans."""

from __future__ import annotations

import math

import pytest

from kdtree.kernels import launch_plan as lp
from kdtree.kernels.device_facts import DeviceFacts

H200 = DeviceFacts(132, (9, 0))


def exact(B, T, L, H, sms=132):
    return lp.plan(B * T, H, B, math.ceil(T / 32), B * (L + T), DeviceFacts(sms, (9, 0)))


@pytest.mark.parametrize("B,T,H", [(1, 16, 16), (1, 64, 16), (4, 16, 16), (4, 64, 16), (1, 4, 8), (8, 16, 128)])
@pytest.mark.parametrize("C", [32768, 65536, 131072])
def test_long_context_buckets_keep_the_exact_plans_split_count(B, T, H, C):
    plan = lp.plan_bucket(B, T, C, H, H200)
    for L in (C // 2 + 1, 3 * C // 4, C):
        want = exact(B, T, max(L, 32768), H)
        assert (plan.num_splits, plan.variant) == (want.num_splits, want.variant)


@pytest.mark.parametrize("B,T,H,C", [(1, 16, 16, 4096), (1, 4, 8, 8192), (2, 64, 16, 4096), (4, 16, 16, 16384)])
def test_short_buckets_stay_close_to_exact_plans_over_their_range(B, T, H, C):
    plan = lp.plan_bucket(B, T, C, H, H200)
    ctas = B * math.ceil(T * H / plan.block_m)
    lengths = lp._bucket_lengths(C // 2, C)
    assert lp.bucket_regret(plan.num_splits, ctas, lengths, T, B * T * H, 132) <= 1.25
    # and no other split count does better in the worst case
    for s in range(1, 200):
        assert lp.bucket_regret(s, ctas, lengths, T, B * T * H, 132) >= \
            lp.bucket_regret(plan.num_splits, ctas, lengths, T, B * T * H, 132) - 1e-6


def test_forced_choices_and_bad_buckets():
    plan = lp.plan_bucket(2, 16, 4096, 16, H200, variant="base32", num_splits=7)
    assert plan.variant == lp.VARIANTS["base32"] and plan.num_splits == 7
    assert lp.variant_name(plan.variant) == "base32"
    with pytest.raises(ValueError, match="max_batch"):
        lp.plan_bucket(0, 16, 4096, 16, H200)
    with pytest.raises(ValueError, match="variant id"):
        lp.variant_name(9)
