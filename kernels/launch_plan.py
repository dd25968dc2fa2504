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
from dataclasses import dataclass
from typing import Optional

BLOCK_N = 32
WORKSPACE_ROWS = 1 << 15  # split partials: 32768 rows x 512 fp32 = 64 MiB per device
MAX_SPLITS = 1024

VARIANTS = {"base16": 1, "base32": 2, "ws": 3, "wgmma": 4}  # name -> id of the launcher (csrc/tree_verify_mla.cu)
BLOCK_M = {1: 16, 2: 32, 3: 32, 4: 64}
NEEDS_SM90 = {"ws"}  # bulk copy engine + mbarriers
SM90A_ONLY = {"wgmma"}  # wgmma: built into sm_90a extensions only, which run on compute capability 9.0 only
# Whether the Hopper variant takes the default dispatch on a 9.0 device (issue 17). On the H200 v2
# runs the tensor-core-bound phase-1 shapes in 0.43-0.46 of the ws kernel's time. Its one token
# divergence in phase 2 (runs b773c3 and a replay of seeds 1064539936, 1110497202) was an oracle
# near-tie: margin 0.0104 logits, which ws moves by 0.024 and wgmma by 0.025 the other way; its
# logit drift on phase 2's workload is ws's (median 0.018 both, `kdtree.tools.variant_audit`).
HOPPER_WGMMA_DEFAULT = True
WGMMA_MIN_ROWS = 64  # rows per request from which the default dispatch (when enabled) takes wgmma

# Cost-model constants, in tile units (see the module docstring).
CTA_OVERHEAD_TILES = 3.0  # Q fragments, pipeline fill, epilogue
SPLIT_WRITE_TILES = 2.0  # a split's fp32 partial rows written instead of bf16 out
COMBINE_LAUNCH_TILES = 2.0  # the combine pass's launch and tail
COMBINE_ROWS_PER_TILE = 1170.0  # rows x splits whose 2 KiB partial the combine reads per tile


@dataclass(frozen=True)
class LaunchPlan:
    """How one call is cut up: KV splits per request, kernel variant, grid rows per request.

    `variant` 1 and 2 are the base kernel with 16 or 32 rows per CTA; 3 is the warp-specialised
    kernel (32 rows per CTA, bulk-copy producer warp), which uses the bulk copy engine and
    mbarriers and so needs sm_90 or newer; 4 is the Hopper kernel (64 rows per CTA, wgmma), which
    exists only in sm_90a builds and so runs on compute capability 9.0 only.
    """

    num_splits: int
    variant: int
    grid_y: int

    @property
    def block_m(self) -> int:
        return BLOCK_M[self.variant]


def runnable_variants(capability: tuple[int, int]) -> list[str]:
    """The names of VARIANTS a device of this compute capability can run (in VARIANTS order):
    base16 and base32 on sm_80+, ws on sm_90+, wgmma on 9.0 only (its sm_90a build)."""
    cap = tuple(capability)
    out = []
    for name in VARIANTS:
        if name in SM90A_ONLY and cap != (9, 0):
            continue
        if name in NEEDS_SM90 and cap < (9, 0):
            continue
        out.append(name)
    return out


def choose_variant(rows_per_request: float, capability: tuple[int, int], forced: Optional[str] = None) -> int:
    """The specialisation for a shape: few rows -> 16-row base tiles, else the ws kernel (base32
    before sm_90); on a 9.0 device with HOPPER_WGMMA_DEFAULT set, the wgmma kernel from
    WGMMA_MIN_ROWS rows per request. ``forced`` (a name of VARIANTS) overrides, for tests and
    measurements, and is refused on a device that cannot run it."""
    cap = tuple(capability)
    if forced is not None:
        if forced not in VARIANTS:
            raise ValueError(f"variant {forced!r}: expected one of {sorted(VARIANTS)}")
        if forced in SM90A_ONLY and cap != (9, 0):
            raise ValueError(f"variant {forced!r} is built for sm_90a only (wgmma), which runs on compute "
                             f"capability 9.0; this device is sm_{cap[0]}{cap[1]}: use one of "
                             f"{runnable_variants(cap)}")
        if forced in NEEDS_SM90 and cap < (9, 0):
            raise ValueError(f"variant {forced!r} needs sm_90 or newer (bulk copy, mbarrier); this device is "
                             f"sm_{cap[0]}{cap[1]}: use base16 or base32")
        return VARIANTS[forced]
    if rows_per_request <= 16:
        return 1
    if HOPPER_WGMMA_DEFAULT and cap == (9, 0) and rows_per_request >= WGMMA_MIN_ROWS:
        return VARIANTS["wgmma"]
    return 3 if cap >= (9, 0) else 2


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
                sm_count: int, capability: tuple[int, int] = (9, 0), *, variant: Optional[str] = None,
                num_splits: Optional[int] = None) -> LaunchPlan:
    """Choose the variant, splits and grid from shapes (see the module docstring).

    ``variant`` (a name of VARIANTS) and ``num_splits`` force those choices, for tests and
    measurements; a forced split count is clamped to what the workspace holds (1 when even one
    split's partials would not fit, as the automatic choice does).
    """
    total_rows = num_rows * num_heads
    rows_per_request = total_rows / batch
    variant_id = choose_variant(rows_per_request, capability, variant)
    block_m = BLOCK_M[variant_id]
    max_tree = min(num_rows, 32 * mask_words)
    grid_y = math.ceil(max_tree * num_heads / block_m)
    ctas = batch * math.ceil(rows_per_request / block_m)
    if num_splits is not None:
        if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1:
            raise ValueError(f"num_splits: expected a whole number >= 1, got {num_splits!r}")
        splits = 1 if total_rows > WORKSPACE_ROWS else min(num_splits, MAX_SPLITS, WORKSPACE_ROWS // total_rows)
    else:
        splits = choose_splits(ctas, num_kv / batch, total_rows, sm_count)
    return LaunchPlan(num_splits=splits, variant=variant_id, grid_y=grid_y)


# -- CUDA-graph buckets ------------------------------------------------------------------------
VARIANT_NAMES = {v: k for k, v in VARIANTS.items()}
BUCKET_SAMPLES = 6  # lengths of a bucket the split choice is weighed at (geometric, min..max)


def variant_name(variant: int) -> str:
    """The VARIANTS name of a launcher id (what `cuda_op.launch(variant=...)` takes)."""
    if variant not in VARIANT_NAMES:
        raise ValueError(f"variant id {variant!r}: expected one of {sorted(VARIANT_NAMES)}")
    return VARIANT_NAMES[variant]


def _bucket_lengths(min_context: int, max_context: int) -> list[int]:
    lo, hi = max(min_context, 1), max(max_context, 1)
    if lo >= hi:
        return [hi]
    ratio = (hi / lo) ** (1.0 / (BUCKET_SAMPLES - 1))
    return sorted({int(round(lo * ratio ** i)) for i in range(BUCKET_SAMPLES)} | {hi})


def bucket_regret(splits: int, ctas: int, lengths: list[int], tree: int, total_rows: int, slots: int) -> float:
    """Worst modelled time of `splits` over `lengths` against the best split count at each length
    (1.0: as good as an exact plan everywhere)."""
    worst = 1.0
    for length in lengths:
        keys = length + tree
        best = _choose_splits(ctas, max(1, math.ceil(keys / BLOCK_N)), total_rows, slots)
        worst = max(worst, split_cost(splits, ctas, keys, total_rows, slots) /
                    split_cost(best, ctas, keys, total_rows, slots))
    return worst


def plan_for_bucket(max_batch: int, max_tree: int, max_context: int, num_heads: int, sm_count: int,
                    capability: tuple[int, int] = (9, 0), *, min_context: Optional[int] = None,
                    variant: Optional[str] = None, num_splits: Optional[int] = None) -> LaunchPlan:
    """The plan one captured launch keeps for every call of a CUDA-graph bucket.

    A bucket admits up to `max_batch` requests of up to `max_tree` nodes and `max_context` prefix
    tokens each; its static buffers have exactly those sizes (q rows ``max_batch * max_tree``,
    ``ceil(max_tree / 32)`` mask words). The grid (splits x row blocks x requests) is fixed at
    capture; the kernel cuts each request's KV into `num_splits` ranges from ``kv_indptr`` on the
    device, so any length up to the maximum is served (empty splits and requests without rows
    exit early and the combine skips them). The split count is the one whose modelled time is
    worst-case closest to an exact-length plan over the contexts the bucket is used for
    (``min_context``, default ``max_context // 2``, to ``max_context``; `bucket_regret`); the
    variant is the one the bucket's row count picks. ``variant`` / ``num_splits`` force them.
    """
    if min(max_batch, max_tree, num_heads) < 1 or max_context < 0:
        raise ValueError(f"bucket: need max_batch, max_tree, num_heads >= 1 and max_context >= 0, got "
                         f"{max_batch}, {max_tree}, {num_heads}, {max_context}")
    words = math.ceil(max_tree / 32)
    rows = max_batch * max_tree
    base = plan_launch(rows, num_heads, max_batch, words, max_batch * (max_context + max_tree), sm_count,
                       capability, variant=variant, num_splits=num_splits)
    if num_splits is not None:
        return base
    total_rows = rows * num_heads
    if total_rows > WORKSPACE_ROWS:
        return base
    ctas = max_batch * math.ceil(max_tree * num_heads / base.block_m)
    slots = max(1, sm_count)
    lo = max_context // 2 if min_context is None else min(min_context, max_context)
    lengths = _bucket_lengths(lo, max_context)
    limit = max(1, min(MAX_SPLITS, WORKSPACE_ROWS // total_rows, math.ceil((max_context + max_tree) / BLOCK_N)))
    candidates = sorted({1, base.num_splits} | {_choose_splits(ctas, max(1, math.ceil((n + max_tree) / BLOCK_N)),
                                                               total_rows, slots) for n in lengths})
    candidates = [min(s, limit) for s in candidates]
    best = min(candidates, key=lambda s: (round(bucket_regret(s, ctas, lengths, max_tree, total_rows, slots), 6), s))
    return LaunchPlan(num_splits=best, variant=base.variant, grid_y=base.grid_y)
