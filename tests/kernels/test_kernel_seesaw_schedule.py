"""The arithmetic of the wgmma variant's pair ("seesaw") schedule (`consume` in
kernels/csrc/tree_verify_mla_sm90a.cuh), emulated in fp64: two warpgroups take the tiles of a pair,
each applying the other's running max and rescale factors (lazy rescale, threshold 2^8), one
holding O's low columns and one the high, with their row sums kept apart and added at the end.
Whatever the tile count (odd: the last pair has no tile b), fully masked tiles or rows, it must be
the softmax. This pins down the bookkeeping the kernel implements; the kernel itself is checked
against the oracle on the GPU (devcheck, the phase-1 gates)."""

from __future__ import annotations

import math
import sys

import pytest
import torch

LAZY_LOG2 = 8.0
TILE = 64


def _softmax_tile(x: torch.Tensor, m_in: torch.Tensor):
    """The kernel's `softmax_row` over a tile's rows: new running max, rescale factor, P and its row sums."""
    m_new = torch.maximum(m_in, x.max(-1).values)
    moved = m_new > m_in + LAZY_LOG2
    scale = torch.where(moved, torch.exp2(m_in - m_new), torch.ones_like(m_in))
    m = torch.where(moved, m_new, m_in)
    p = torch.exp2(x - torch.where(m == -math.inf, torch.zeros_like(m), m)[:, None])
    return m, scale, p, p.sum(-1)


def seesaw(scores_log2: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """O as the pair schedule computes it: warpgroup 0 owns tile a and O[:, :D/2], warpgroup 1
    tile b and O[:, D/2:]; P_a reaches warpgroup 1 and P_b warpgroup 0 through shared memory."""
    rows, keys = scores_log2.shape
    half = v.shape[1] // 2
    tiles = -(-keys // TILE)
    o_lo = torch.zeros(rows, half, dtype=v.dtype)
    o_hi = torch.zeros(rows, v.shape[1] - half, dtype=v.dtype)
    l_lo = torch.zeros(rows, dtype=v.dtype)
    l_hi = torch.zeros(rows, dtype=v.dtype)
    m = torch.full((rows,), -math.inf, dtype=v.dtype)
    for i in range(-(-tiles // 2)):
        a = slice(2 * i * TILE, (2 * i + 1) * TILE)
        m_a, sa, p_a, sum_a = _softmax_tile(scores_log2[:, a], m)  # warpgroup 0
        o_lo = o_lo * sa[:, None] + p_a @ v[a, :half]
        l_lo = l_lo * sa + sum_a
        m, sb, sum_b = m_a, torch.ones_like(m), torch.zeros_like(m)
        if 2 * i + 1 < tiles:
            b = slice((2 * i + 1) * TILE, (2 * i + 2) * TILE)
            m, sb, p_b, sum_b = _softmax_tile(scores_log2[:, b], m_a)  # warpgroup 1
        o_hi = (o_hi * sa[:, None] + p_a @ v[a, half:]) * sb[:, None]  # warpgroup 1: sa, P_a V_a, then sb
        l_hi = l_hi * sa * sb + sum_b
        o_lo, l_lo = o_lo * sb[:, None], l_lo * sb  # warpgroup 0 after tile b's factor arrives
        if 2 * i + 1 < tiles:
            o_hi = o_hi + p_b @ v[b, half:]
            o_lo = o_lo + p_b @ v[b, :half]
    return torch.cat([o_lo, o_hi], dim=1) / (l_lo + l_hi)[:, None]


@pytest.mark.parametrize("keys", [64, 100, 64 * 7, 64 * 8 + 1])
@pytest.mark.parametrize("spread", [1.0, 12.0])
def test_the_pair_schedule_is_the_softmax(keys, spread):
    g = torch.Generator().manual_seed(keys)
    scores = torch.randn(16, keys, generator=g, dtype=torch.float64) * spread
    scores[:, keys // 3: keys // 3 + 70] = -math.inf  # a masked stretch, whole tiles included
    scores[5] = -math.inf
    scores[5, keys - 1] = 0.5  # a row that sees only the last key
    scores[9, : keys // 2] += 40.0  # a row whose max is early: later tiles never move it
    v = torch.randn(keys, 32, generator=g, dtype=torch.float64)
    ref = torch.softmax(scores * math.log(2.0), dim=-1) @ v
    assert torch.allclose(seesaw(scores, v), ref, atol=1e-12, rtol=1e-12)


def test_a_wrong_factor_is_caught(monkeypatch):
    """The emulation is not vacuous: dropping the rescale factors breaks it where the max moves."""
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(8, 64 * 4, generator=g, dtype=torch.float64) * 12
    v = torch.randn(64 * 4, 16, generator=g, dtype=torch.float64)
    ref = torch.softmax(scores * math.log(2.0), dim=-1) @ v
    right = _softmax_tile

    def no_rescale(x, m_in):
        m, scale, p, s = right(x, m_in)
        return m, torch.ones_like(scale), p, s

    monkeypatch.setattr(sys.modules[__name__], "_softmax_tile", no_rescale)
    assert not torch.allclose(seesaw(scores, v), ref, atol=1e-6)
