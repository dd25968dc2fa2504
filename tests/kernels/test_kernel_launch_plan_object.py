"""The launch plan you hold (`kdtree.kernels.plan` / `plan_bucket` -> `LaunchPlan`): the same
choices the planner made before plans carried their shapes and device (pinned in
`data/launch_plans.json` over a grid of shapes and device facts), the facts it carries, its repr,
and the checks a held plan passes before it runs. No GPU needed."""

from __future__ import annotations

import json
import math

import pytest

import kdtree.kernels as kernels
from kdtree.kernels import launch_plan as lp
from kdtree.kernels.device_facts import DeviceFacts

from plan_grid import BUCKET_MIN_CONTEXT, BUCKETS, DEVICES, EXACT, FORCED, GOLDEN, exact_shapes

H200 = DeviceFacts(132, (9, 0), 232448)


@pytest.fixture(scope="module")
def golden():
    return json.loads(GOLDEN.read_text())


def _triple(p):
    return [p.variant, p.num_splits, p.grid_y]


def test_plans_make_the_pinned_choices_on_every_shape_and_device(golden):
    got = {"exact": [], "forced": [], "bucket": [], "bucket_min_context": [], "bucket_launched": []}
    for sms, cap in DEVICES:
        facts = DeviceFacts(sms, cap)
        for H, T, B, L in EXACT:
            got["exact"].append(_triple(kernels.plan(*exact_shapes(H, T, B, L), facts)))
        for H, T, B, L in EXACT[::7]:
            for variant, splits in FORCED:
                if variant is not None and variant not in lp.runnable_variants(cap):
                    continue
                got["forced"].append(_triple(kernels.plan(*exact_shapes(H, T, B, L), facts, variant=variant,
                                                          num_splits=splits)))
        for B, T, C, H in BUCKETS:
            bucket = kernels.plan_bucket(B, T, C, H, facts)
            got["bucket"].append(_triple(bucket))
            # a held bucket plan launches as it is: what the graph path used to re-plan it into
            got["bucket_launched"].append(_triple(bucket))
            assert bucket.mismatch(B * T, H, B, math.ceil(T / 32), facts) is None
        for B, T, C, H in BUCKETS[::5]:
            for lo in BUCKET_MIN_CONTEXT:
                got["bucket_min_context"].append(_triple(kernels.plan_bucket(B, T, C, H, facts, min_context=lo)))
    for kind, want in golden.items():
        assert len(got[kind]) == len(want), kind
        bad = [i for i, (g, w) in enumerate(zip(got[kind], want)) if g != w]
        assert not bad, f"{kind}: {len(bad)} plans differ, first at {bad[0]}: {got[kind][bad[0]]} != {want[bad[0]]}"


def test_two_planners_and_one_way_to_force():
    planners = sorted(name for name in dir(lp) if name.startswith("plan") and callable(getattr(lp, name)))
    assert planners == ["plan", "plan_bucket"]
    import inspect

    from kdtree.kernels import cuda_op

    assert "variant" not in inspect.signature(cuda_op.launch).parameters
    assert "num_splits" not in inspect.signature(cuda_op.launch).parameters
    assert "plan" in inspect.signature(kernels.tree_verify_mla).parameters


def test_a_plan_carries_its_shapes_grid_and_device():
    p = kernels.plan(4, 64, 1, 1, 32772, H200)
    assert isinstance(p, kernels.LaunchPlan)
    assert (p.num_rows, p.num_heads, p.batch, p.mask_words, p.num_kv) == (4, 64, 1, 1, 32772)
    assert p.device == H200 and p.context is None
    assert p.variant_name == "wgmma" and p.block_m == 64 and p.total_rows == 256
    assert p.grid == (p.num_splits, p.grid_y, 1) and p.ctas == p.num_splits * p.grid_y
    b = kernels.plan_bucket(4, 16, 4096, 16, H200)
    assert b.context == (2048, 4096) and b.num_kv == 4 * (4096 + 16)
    assert (b.num_rows, b.batch, b.mask_words) == (64, 4, 1)
    assert kernels.plan_bucket(4, 16, 4096, 16, H200, min_context=100).context == (100, 4096)
    assert kernels.plan_bucket(4, 16, 4096, 16, H200, num_splits=3).context == (2048, 4096)


def test_plans_are_frozen_and_hashable():
    p = kernels.plan(4, 64, 1, 1, 32772, H200)
    with pytest.raises(AttributeError):
        p.num_splits = 3
    assert {p: 1}[kernels.plan(4, 64, 1, 1, 32772, H200)] == 1


def test_repr_says_what_runs_and_what_it_is_for():
    p = kernels.plan(4, 64, 1, 1, 32772, H200)
    text = repr(p)
    assert text.startswith(f"LaunchPlan(wgmma, {p.num_splits} splits, grid {p.num_splits}x4x1 = {p.ctas} CTAs")
    assert "4 q rows x 64 heads, 1 request, 1 mask word, kv 32772" in text
    assert text.endswith("on sm_90 with 132 SMs, 232448 B shared memory per block)")
    b = repr(kernels.plan_bucket(2, 16, 4096, 16, DeviceFacts(188, (12, 0))))
    assert "context 2048..4096, kv <= 8224; on sm_120 with 188 SMs)" in b


def test_mismatch_names_the_shape_or_device_fact_that_differs():
    p = kernels.plan_bucket(2, 16, 4096, 16, H200)
    assert p.mismatch(32, 16, 2, 1, H200) is None
    assert p.mismatch(32, 16, 2, 1, DeviceFacts(132, (9, 0))) is None  # shared memory unknown: no objection
    assert p.mismatch(31, 16, 2, 1, H200) == "made for 32 q rows, the call has 31"
    assert p.mismatch(32, 8, 2, 1, H200) == "made for 16 heads, the call has 8"
    assert p.mismatch(32, 16, 1, 1, H200) == "made for 2 requests, the call has 1"
    assert p.mismatch(32, 16, 2, 2, H200) == "made for 1 mask words per row, the call has 2"
    assert p.mismatch(32, 16, 2, 1, DeviceFacts(78, (9, 0), 232448)) == \
        "made for sm_90 with 132 SMs, 232448 B shared memory per block, the device is sm_90 with 78 SMs, " \
        "232448 B shared memory per block"
    assert p.mismatch(32, 16, 2, 1, DeviceFacts(132, (9, 0), 101376)) == \
        "made for 232448 B shared memory per block, the device offers 101376 B"


def test_bad_plan_requests_are_clear_errors():
    with pytest.raises(ValueError, match=r"^plan: need num_rows, num_heads, batch, mask_words >= 1"):
        kernels.plan(0, 16, 1, 1, 10, H200)
    with pytest.raises(ValueError, match="variant 'ws' needs sm_90 or newer"):
        kernels.plan(64, 16, 1, 2, 100, DeviceFacts(108, (8, 0)), variant="ws")
    with pytest.raises(ValueError, match="bucket: need max_batch"):
        kernels.plan_bucket(0, 16, 4096, 16, H200)
    with pytest.raises(ValueError, match=r"^device: expected a CUDA device, got cpu"):
        kernels.plan(64, 16, 1, 2, 100, "cpu")
