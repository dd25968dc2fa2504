"""The launch plan: variant, KV splits and grid from shapes alone (no GPU needed)."""

from __future__ import annotations

import math

import pytest

from kdtree.kernels import launch_plan as lp
from kdtree.kernels.device_facts import DeviceFacts


def _plan(H, T, B, L, sms=132, cap=(9, 0)):
    return lp.plan(T * B, H, B, math.ceil(T / 32), B * (L + T), DeviceFacts(sms, cap))


def _waves(plan, H, T, B, sms=132):
    ctas = B * math.ceil(T * H / plan.block_m)
    return ctas * plan.num_splits / sms, math.ceil(ctas * plan.num_splits / sms)


@pytest.mark.parametrize("H,T,B,L", [(64, 4, 1, 32768), (16, 16, 1, 131072), (128, 4, 1, 32768),
                                     (8, 64, 1, 32768), (64, 16, 1, 131072), (8, 16, 8, 32768)])
def test_split_grids_fill_whole_waves(H, T, B, L):
    # The old rule (ceil(SMs / CTAs) splits) gave these 1.03-1.3 waves: a second, nearly empty
    # wave that doubled the time on the H200.
    plan = _plan(H, T, B, L)
    used, waves = _waves(plan, H, T, B)
    assert plan.num_splits > 1 and waves == 1 and used >= 0.9


def test_one_row_block_spreads_over_every_sm():
    plan = _plan(8, 4, 1, 32768)
    assert plan.variant == lp.VARIANTS["ws"] and plan.num_splits >= 66


def test_many_ctas_need_no_split():
    for H, T, B, L in [(64, 64, 8, 131072), (128, 256, 8, 32768), (16, 256, 8, 32768)]:
        assert _plan(H, T, B, L).num_splits == 1


def test_short_kv_is_not_split_below_a_tile():
    plan = _plan(8, 4, 1, 60)
    assert plan.num_splits <= math.ceil(64 / lp.BLOCK_N)


def test_split_cost_counts_whole_waves_and_the_combine():
    one_wave = lp.split_cost(16, 8, 32768, 256, 132)
    two_waves = lp.split_cost(17, 8, 32768, 256, 132)
    assert two_waves > 1.8 * one_wave
    assert lp.split_cost(1, 8, 32768, 256, 132) == math.ceil(8 / 132) * (1024 + lp.CTA_OVERHEAD_TILES)


def test_workspace_bounds_the_split_count():
    plan = _plan(128, 256, 1, 131072)
    assert plan.num_splits * 128 * 256 <= lp.WORKSPACE_ROWS or plan.num_splits == 1
    assert lp.choose_splits(1, 1e6, lp.WORKSPACE_ROWS + 1, 132) == 1


def test_variant_by_rows_and_capability():
    assert lp.choose_variant(16, (9, 0)) == lp.VARIANTS["base16"]
    assert lp.choose_variant(17, (9, 0)) == lp.VARIANTS["ws"]
    assert lp.choose_variant(17, (12, 0)) == lp.VARIANTS["ws"]
    assert lp.choose_variant(64, (8, 9)) == lp.VARIANTS["base32"]


def test_forced_variant_is_an_argument_checked_against_the_device():
    assert _forced(variant="base32").variant == lp.VARIANTS["base32"]
    assert _forced(variant="base16").variant == lp.VARIANTS["base16"]
    assert _forced(variant="base16").block_m == 16
    with pytest.raises(ValueError, match=r"variant 'g64': expected one of \['base16', 'base32', 'wgmma', 'ws'\]"):
        _forced(variant="g64")
    with pytest.raises(ValueError, match="variant 'ws' needs sm_90 or newer"):
        lp.plan(64, 1, 1, 1, 100, DeviceFacts(84, (8, 6)), variant="ws")


def _forced(H=8, T=4, B=1, L=32768, **kw):
    return lp.plan(T * B, H, B, math.ceil(T / 32), B * (L + T), DeviceFacts(132, (9, 0)), **kw)


def test_forced_splits_are_clamped():
    assert _forced(num_splits=100000).num_splits == lp.MAX_SPLITS
    assert _forced(num_splits=7).num_splits == 7
    assert _forced(H=128, T=256, num_splits=7).num_splits == lp.WORKSPACE_ROWS // (128 * 256)  # 1
    with pytest.raises(ValueError, match="num_splits: expected a whole number >= 1, got 0"):
        _forced(num_splits=0)
    with pytest.raises(ValueError, match="num_splits"):
        _forced(num_splits=2.5)


def test_nothing_in_the_plan_reads_the_environment():
    import inspect
    import re

    from kdtree.kernels import cuda_op

    for module in (lp, cuda_op):
        assert not re.search(r"\bos\b|environ\b|getenv", inspect.getsource(module)), module.__name__


def test_grid_covers_the_largest_request():
    plan = lp.plan(num_rows=300, num_heads=16, batch=3, mask_words=8, num_kv=3000, device=DeviceFacts(132, (9, 0)))
    assert plan.grid_y * plan.block_m >= 256 * 16


# --- the Hopper variant -------------------------------------------------------------


def test_runnable_variants_by_capability():
    assert lp.runnable_variants((9, 0)) == ["base16", "base32", "ws", "wgmma"]
    for cap in [(12, 0), (10, 0), (9, 1)]:
        assert lp.runnable_variants(cap) == ["base16", "base32", "ws"], cap  # sm_90a code runs on 9.0 only
    assert lp.runnable_variants((8, 0)) == lp.runnable_variants((8, 9)) == ["base16", "base32"]
    assert set(lp.runnable_variants((9, 0))) == set(lp.VARIANTS)


def test_wgmma_is_forced_on_9_0_only():
    assert lp.forced_variant("wgmma", (9, 0)) == lp.VARIANTS["wgmma"]
    plan = _forced(H=64, T=64, B=8, variant="wgmma")
    assert plan.variant == lp.VARIANTS["wgmma"] and plan.block_m == 64 and plan.grid_y == 64
    for cap in [(12, 0), (10, 0), (8, 0)]:
        with pytest.raises(ValueError, match=r"variant 'wgmma' is built for sm_90a only .* use one of"):
            lp.plan(64, 1, 1, 1, 100, DeviceFacts(132, cap), variant="wgmma")
    assert lp.variant_name(lp.VARIANTS["wgmma"]) == "wgmma"


def test_default_dispatch_takes_wgmma_on_9_0_from_64_rows_and_never_elsewhere(monkeypatch):
    assert lp.HOPPER_WGMMA_DEFAULT is True
    assert lp.choose_variant(16, (9, 0)) == lp.VARIANTS["base16"]
    assert lp.choose_variant(lp.WGMMA_MIN_ROWS - 1, (9, 0)) == lp.VARIANTS["ws"]
    assert lp.choose_variant(lp.WGMMA_MIN_ROWS, (9, 0)) == lp.VARIANTS["wgmma"]
    assert lp.choose_variant(4096, (9, 0)) == lp.VARIANTS["wgmma"]
    assert lp.choose_variant(4096, (12, 0)) == lp.VARIANTS["ws"]  # never off 9.0: sm_120 keeps ws
    assert lp.choose_variant(4096, (9, 1)) == lp.VARIANTS["ws"]
    assert lp.choose_variant(4096, (8, 0)) == lp.VARIANTS["base32"]
    plan = _plan(64, 64, 8, 32768)
    assert plan.variant == lp.VARIANTS["wgmma"] and plan.grid_y == 64 and plan.num_splits == 1
    assert lp.plan_bucket(4, 64, 32768, 64, DeviceFacts(132, (9, 0))).variant == lp.VARIANTS["wgmma"]
    monkeypatch.setattr(lp, "HOPPER_WGMMA_DEFAULT", False)  # the switch: ws everywhere on 9.0 again
    for rows in (17, 64, 4096):
        assert lp.choose_variant(rows, (9, 0)) == lp.VARIANTS["ws"]
