"""How one call of the CUDA kernel is cut up: variant, KV splits and grid, from shapes alone.

Nothing here reads a tensor's values, so planning never synchronises the device and a call can
be captured in a CUDA graph. The split count comes from a small cost model in units of one
32-key tile processed by one CTA (about 1.1-1.5 us on the H200, whether the tile is bound by
its 36 KB load or by its MMAs):

    time(s) = waves(s) * (tiles per split + per-CTA overhead) + combine(s)

where waves(s) = ceil(CTAs * s / (SMs * CTAs per SM)). Counting whole waves is the point: a grid
of 136 one-CTA-per-SM blocks on 132 SMs takes two full tile sweeps, not 1.03 (measured on the
H200: H64 T4 B1 L32k with 17 splits ran at half the rate of the same kernel on full waves).
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

BLOCK_N = 32
WORKSPACE_ROWS = 1 << 15  # split partials: 32768 rows x 512 fp32 = 64 MiB per device
MAX_SPLITS = 1024

VARIANTS = {"base16": 1, "base32": 2, "ws": 3, "g64": 4}
BLOCK_M = {1: 16, 2: 32, 3: 32, 4: 64}

# Cost-model constants, in tile units (see the module docstring).
CTA_OVERHEAD_TILES = 3.0  # Q fragments, pipeline fill, epilogue
SPLIT_WRITE_TILES = 2.0  # a split's fp32 partial rows written instead of bf16 out
COMBINE_LAUNCH_TILES = 2.0  # the combine pass's launch and tail
COMBINE_ROWS_PER_TILE = 1170.0  # rows x splits whose 2 KiB partial the combine reads per tile


@dataclass(frozen=True)
class LaunchPlan:
    """How one call is cut up: KV splits per request, kernel variant, grid rows per request.

    `variant` 1 and 2 are the base kernel with 16 or 32 rows per CTA; 3 is the warp-specialised
    kernel (32 rows per CTA, bulk-copy producer warp); 4 is the 64-row kernel of two 32-row
    warp groups. 3 and 4 use the bulk copy engine and mbarriers, so they need sm_90 or newer.
    """

    num_splits: int
    variant: int
    grid_y: int

    @property
    def block_m(self) -> int:
        return BLOCK_M[self.variant]


def choose_variant(rows_per_request: float, capability: tuple[int, int]) -> int:
    """The specialisation for a shape: few rows -> 16-row base tiles, else the ws kernel (base32
    before sm_90). KDTREE_VARIANT overrides; g64 is opt-in only: on the H200 it measured slower
    than ws on every shape tried (plan 0002, phase 1, version v3)."""
    forced = os.environ.get("KDTREE_VARIANT")
    if forced:
        if forced not in VARIANTS:
            raise ValueError(f"KDTREE_VARIANT={forced!r}: expected one of {sorted(VARIANTS)}")
        return VARIANTS[forced]
    if rows_per_request <= 16:
        return 1
    return 3 if capability >= (9, 0) else 2


def split_cost(splits: int, ctas: int, keys_per_request: float, total_rows: int, slots: int) -> float:
    """Modelled time of a launch with `splits` KV splits, in tile units (module docstring).

    `ctas` is the number of row-block CTAs of one split (all requests), `slots` how many CTAs
    run at once on the whole device (SMs x CTAs per SM).
    """
    chunk = math.ceil(math.ceil(keys_per_request / splits) / BLOCK_N)
    used = max(1, math.ceil(keys_per_request / (chunk * BLOCK_N))) if keys_per_request > 0 else 1
    waves = math.ceil(ctas * used / slots)
    per_cta = chunk + CTA_OVERHEAD_TILES
    if used == 1:
        return waves * per_cta
    per_cta += SPLIT_WRITE_TILES
    return waves * per_cta + COMBINE_LAUNCH_TILES + total_rows * used / COMBINE_ROWS_PER_TILE


def choose_splits(ctas: int, keys_per_request: float, total_rows: int, sm_count: int,
                  ctas_per_sm: int = 1) -> int:
    """The split count with the least modelled time; ties go to fewer splits.

    Only the largest split count that fits each whole number of waves (1..16) is a candidate,
    besides 1: within a wave count more splits mean fewer tiles per CTA, and the combine's cost
    is what the comparison across wave counts weighs. At most 17 evaluations, cached.
    """
    if total_rows > WORKSPACE_ROWS:
        return 1
    tiles = math.ceil(keys_per_request / BLOCK_N) if keys_per_request > 0 else 1
    return _choose_splits(max(ctas, 1), tiles, total_rows, max(1, sm_count * ctas_per_sm))


@functools.lru_cache(maxsize=4096)
def _choose_splits(ctas: int, tiles: int, total_rows: int, slots: int) -> int:
    limit = max(1, min(MAX_SPLITS, WORKSPACE_ROWS // max(total_rows, 1), tiles))
    keys = tiles * BLOCK_N
    candidates = {1} | {min(limit, max(1, w * slots // ctas)) for w in range(1, 17)}
    best, best_cost = 1, math.inf
    for s in sorted(candidates):
        cost = split_cost(s, ctas, keys, total_rows, slots)
        if cost < best_cost - 1e-9:
            best, best_cost = s, cost
    return best


def plan_launch(num_rows: int, num_heads: int, batch: int, mask_words: int, num_kv: int,
                sm_count: int, capability: tuple[int, int] = (9, 0)) -> LaunchPlan:
    """Choose the variant, splits and grid from shapes (see the module docstring).

    KDTREE_SPLITS=N forces the split count (clamped to what the workspace holds), for experiments.
    """
    total_rows = num_rows * num_heads
    rows_per_request = total_rows / batch
    variant = choose_variant(rows_per_request, capability)
    block_m = BLOCK_M[variant]
    max_tree = min(num_rows, 32 * mask_words)
    grid_y = math.ceil(max_tree * num_heads / block_m)
    ctas = batch * math.ceil(rows_per_request / block_m)
    forced = os.environ.get("KDTREE_SPLITS")
    if forced:
        splits = max(1, min(int(forced), MAX_SPLITS, WORKSPACE_ROWS // total_rows or 1))
        if total_rows > WORKSPACE_ROWS:
            splits = 1
    else:
        splits = choose_splits(ctas, num_kv / batch, total_rows, sm_count)
    return LaunchPlan(num_splits=splits, variant=variant, grid_y=grid_y)
