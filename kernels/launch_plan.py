"""How one call of the CUDA kernel is cut up: variant, KV splits and grid, from shapes alone.

Nothing here reads a tensor's values, so planning never synchronises the device and a call can
be captured in a CUDA graph. The split count comes from a small cost model in units of one
32-key tile processed by one CTA (about the same time whether the tile is bound by its 36 KB
load or by its MMAs):

    time(s) = waves(s) * (tiles per split + per-CTA overhead) + combine(s)

where waves(s) = ceil(CTAs * s / (SMs * CTAs per SM)). Counting whole waves is the point: a grid
of 136 one-CTA-per-SM blocks on 132 SMs takes two full tile sweeps, not 1.03, so a split count
that spills a few CTAs into a second wave runs at about half the rate of one that fills whole waves.

The two planners, `plan` (one call's exact shapes) and `plan_bucket` (every call of a CUDA-graph
bucket), return a `LaunchPlan` for a device (or its `DeviceFacts`) that a caller holds and hands
to ``tree_verify_mla(..., plan=...)``; their ``variant=`` / ``num_splits=`` are the only way to
force a launch's choices. `kdtree.kernels.cuda_op` holds the constants below to the ones the
compiled extension publishes when it loads it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Optional

from kdtree.kernels.device_facts import DeviceFacts, DeviceLike, device_facts

BLOCK_N = 32  # keys per tile (the extension's block_n)
WORKSPACE_ROWS = 1 << 15  # split partials: 32768 rows x 512 fp32 = 64 MiB per device
MAX_SPLITS = 1024  # the extension's max_splits

# The extension's variant table (name, id, rows per CTA; csrc/tree_verify_mla.cu)
VARIANTS = {"base16": 1, "base32": 2, "ws": 3, "wgmma": 4}  # name -> id
BLOCK_M = {1: 16, 2: 32, 3: 32, 4: 64}  # id -> q rows (node x head) per CTA
NEEDS_SM90 = {"ws"}  # bulk copy engine + mbarriers
SM90A_ONLY = {"wgmma"}  # wgmma: built into sm_90a extensions only, which run on compute capability 9.0 only
# Whether the Hopper variant takes the default dispatch on a 9.0 device: it runs the tensor-core-bound
# shapes faster than the ws kernel, and its logits drift from the oracle as much as ws's
# (`kdtree.tools.variant_audit`); the plan's kernel versions table has the figures.
HOPPER_WGMMA_DEFAULT = True
WGMMA_MIN_ROWS = 64  # rows per request from which the default dispatch (when enabled) takes wgmma

# Cost-model constants, in tile units (see the module docstring).
CTA_OVERHEAD_TILES = 3.0  # Q fragments, pipeline fill, epilogue
SPLIT_WRITE_TILES = 2.0  # a split's fp32 partial rows written instead of bf16 out
COMBINE_LAUNCH_TILES = 2.0  # the combine pass's launch and tail
COMBINE_ROWS_PER_TILE = 1170.0  # rows x splits whose 2 KiB partial the combine reads per tile


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """How one launch is cut up, and the shapes and device it was made for.

    `variant` 1 and 2 are the base kernel with 16 or 32 rows per CTA; 3 is the warp-specialised
    kernel (32 rows per CTA, bulk-copy producer warp), which uses the bulk copy engine and
    mbarriers and so needs sm_90 or newer; 4 is the Hopper kernel (64 rows per CTA, wgmma), which
    exists only in sm_90a builds and so runs on compute capability 9.0 only. The grid is
    ``num_splits x grid_y x batch`` CTAs (`grid`).

    A plan covers calls of exactly its shapes (``num_rows`` q rows of ``num_heads`` heads,
    ``batch`` requests, ``mask_words`` mask words per row) on a device with its facts: what
    `kdtree.kernels.cuda_op.launch` checks before it runs one. ``num_kv`` (for a bucket, the most
    keys: ``batch * (max_context + tree)``) and ``context`` (a bucket's prefix-length range,
    ``(min, max)``) are what the split count was weighed for; any KV length runs correctly with
    the plan, since the kernel cuts each request's KV into the splits on the device.
    """

    variant: int
    num_splits: int
    grid_y: int
    num_rows: int
    num_heads: int
    batch: int
    mask_words: int
    num_kv: int
    device: DeviceFacts
    context: Optional[tuple[int, int]] = None

    @property
    def block_m(self) -> int:
        return BLOCK_M[self.variant]

    @property
    def variant_name(self) -> str:
        """The VARIANTS name of the plan's variant (``"ws"``, ...)."""
        return variant_name(self.variant)

    @property
    def total_rows(self) -> int:
        """q rows x heads: the rows the kernel computes."""
        return self.num_rows * self.num_heads

    @property
    def grid(self) -> tuple[int, int, int]:
        """The main kernel's grid: (KV splits, row blocks per request, requests)."""
        return self.num_splits, self.grid_y, self.batch

    @property
    def ctas(self) -> int:
        """CTAs the grid launches (some exit at once: short requests, empty splits)."""
        return self.num_splits * self.grid_y * self.batch

    def mismatch(self, num_rows: int, num_heads: int, batch: int, mask_words: int,
                 device: DeviceFacts) -> Optional[str]:
        """What keeps this plan from a call of these shapes on a device with these facts, or None."""
        for name, mine, theirs in (("q rows", self.num_rows, num_rows), ("heads", self.num_heads, num_heads),
                                   ("requests", self.batch, batch), ("mask words per row", self.mask_words,
                                                                     mask_words)):
            if mine != theirs:
                return f"made for {mine} {name}, the call has {theirs}"
        return self.device.mismatch(device)

    def __repr__(self) -> str:
        covers = f"kv {self.num_kv}" if self.context is None else \
            f"context {self.context[0]}..{self.context[1]}, kv <= {self.num_kv}"
        return (f"LaunchPlan({self.variant_name}, {self.num_splits} split{'s' if self.num_splits != 1 else ''}, "
                f"grid {self.num_splits}x{self.grid_y}x{self.batch} = {self.ctas} CTAs of {self.block_m} rows; "
                f"for {self.num_rows} q rows x {self.num_heads} heads, {self.batch} request"
                f"{'s' if self.batch != 1 else ''}, {self.mask_words} mask word{'s' if self.mask_words != 1 else ''}, "
                f"{covers}; on {self.device.describe()})")


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


def choose_variant(rows_per_request: float, capability: tuple[int, int]) -> int:
    """The specialisation the default dispatch picks for a shape: few rows -> 16-row base tiles,
    else the ws kernel (base32 before sm_90); on a 9.0 device with HOPPER_WGMMA_DEFAULT set, the
    wgmma kernel from WGMMA_MIN_ROWS rows per request."""
    cap = tuple(capability)
    if rows_per_request <= 16:
        return 1
    if HOPPER_WGMMA_DEFAULT and cap == (9, 0) and rows_per_request >= WGMMA_MIN_ROWS:
        return VARIANTS["wgmma"]
    return 3 if cap >= (9, 0) else 2


def forced_variant(name: str, capability: tuple[int, int]) -> int:
    """The id of variant ``name`` (a key of VARIANTS), refused on a device that cannot run it."""
    cap = tuple(capability)
    if name not in VARIANTS:
        raise ValueError(f"variant {name!r}: expected one of {sorted(VARIANTS)}")
    if name in SM90A_ONLY and cap != (9, 0):
        raise ValueError(f"variant {name!r} is built for sm_90a only (wgmma), which runs on compute "
                         f"capability 9.0; this device is sm_{cap[0]}{cap[1]}: use one of "
                         f"{runnable_variants(cap)}")
    if name in NEEDS_SM90 and cap < (9, 0):
        raise ValueError(f"variant {name!r} needs sm_90 or newer (bulk copy, mbarrier); this device is "
                         f"sm_{cap[0]}{cap[1]}: use base16 or base32")
    return VARIANTS[name]


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


def plan(num_rows: int, num_heads: int, batch: int, mask_words: int, num_kv: int, device: DeviceLike = None, *,
         variant: Optional[str] = None, num_splits: Optional[int] = None) -> LaunchPlan:
    """The launch plan of a call of these shapes on `device`, for ``launch(..., plan=...)``.

    The shapes are the call's: ``num_rows = q.shape[0]``, ``num_heads = q.shape[1]``,
    ``batch = qo_indptr.numel() - 1``, ``mask_words = tree_mask.shape[1]``, ``num_kv =
    kv_indices.numel()`` (or ``kv_runs.num_kv``). `device` is a CUDA device (index, name,
    ``torch.device``; None: the current one) or the `DeviceFacts` of one, to plan without it.
    ``variant`` (a name of VARIANTS, refused on a device that cannot run it) and ``num_splits``
    force those choices, for tests and measurements; a forced split count is clamped to what the
    workspace holds (1 when even one split's partials would not fit, as the automatic choice does).
    """
    if min(num_rows, num_heads, batch, mask_words) < 1 or num_kv < 0:
        raise ValueError(f"plan: need num_rows, num_heads, batch, mask_words >= 1 and num_kv >= 0, got "
                         f"{num_rows}, {num_heads}, {batch}, {mask_words}, {num_kv}")
    return _plan(num_rows, num_heads, batch, mask_words, num_kv, checked_facts(num_heads, device), variant, num_splits)


def checked_facts(num_heads: int, device: DeviceLike) -> DeviceFacts:
    """The facts of the device a plan is for, after the checks a plan's arguments need: heads in
    1..128, a CUDA device to read (or given `DeviceFacts`), compute capability 8.0 or newer.
    ValueError naming the argument otherwise."""
    if not 1 <= num_heads <= 128:
        raise ValueError(f"num_heads: the kernel takes 1 to 128 heads, got {num_heads}")
    if not isinstance(device, DeviceFacts):
        import torch  # noqa: PLC0415

        cuda = device is None or isinstance(device, int) or torch.device(device).type == "cuda"
        if cuda and not torch.cuda.is_available():
            raise ValueError(f"device: no CUDA device here to plan for ({device!r}; torch.cuda.is_available() "
                             "is False): pass DeviceFacts(sm_count=..., capability=...) to plan for one elsewhere")
    facts = device_facts(device)
    if tuple(facts.capability) < (8, 0):
        raise ValueError(f"device: compute capability {facts.capability[0]}.{facts.capability[1]}; the kernel "
                         "needs 8.0 or newer (sm_80)")
    return facts


def _plan(num_rows: int, num_heads: int, batch: int, mask_words: int, num_kv: int, device: DeviceFacts,
          variant: Optional[str], num_splits: Optional[int]) -> LaunchPlan:
    total_rows = num_rows * num_heads
    rows_per_request = total_rows / batch
    variant_id = choose_variant(rows_per_request, device.capability) if variant is None else \
        forced_variant(variant, device.capability)
    block_m = BLOCK_M[variant_id]
    max_tree = min(num_rows, 32 * mask_words)
    grid_y = math.ceil(max_tree * num_heads / block_m)
    ctas = batch * math.ceil(rows_per_request / block_m)
    if num_splits is not None:
        if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1:
            raise ValueError(f"num_splits: expected a whole number >= 1, got {num_splits!r}")
        splits = 1 if total_rows > WORKSPACE_ROWS else min(num_splits, MAX_SPLITS, WORKSPACE_ROWS // total_rows)
    else:
        splits = choose_splits(ctas, num_kv / batch, total_rows, device.sm_count)
    return LaunchPlan(variant=variant_id, num_splits=splits, grid_y=grid_y, num_rows=num_rows, num_heads=num_heads,
                      batch=batch, mask_words=mask_words, num_kv=num_kv, device=device)


# -- CUDA-graph buckets ------------------------------------------------------------------------
VARIANT_NAMES = {v: k for k, v in VARIANTS.items()}
BUCKET_SAMPLES = 6  # lengths of a bucket the split choice is weighed at (geometric, min..max)


def variant_name(variant: int) -> str:
    """The VARIANTS name of a launcher id (what `plan(..., variant=...)` takes)."""
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


def plan_bucket(max_batch: int, max_tree: int, max_context: int, num_heads: int, device: DeviceLike = None, *,
                min_context: Optional[int] = None, variant: Optional[str] = None,
                num_splits: Optional[int] = None) -> LaunchPlan:
    """The plan one captured launch keeps for every call of a CUDA-graph bucket, on `device` (as
    in `plan`).

    A bucket admits up to `max_batch` requests of up to `max_tree` nodes and `max_context` prefix
    tokens each; its static buffers have exactly those sizes (q rows ``max_batch * max_tree``,
    ``ceil(max_tree / 32)`` mask words), and so does every call the plan runs. The grid (splits x
    row blocks x requests) is fixed at capture; the kernel cuts each request's KV into
    `num_splits` ranges from ``kv_indptr`` on the device, so any length up to the maximum is
    served (empty splits and requests without rows exit early and the combine skips them). The
    split count is the one whose modelled time is worst-case closest to an exact-length plan over
    the contexts the bucket is used for (``min_context``, default ``max_context // 2``, to
    ``max_context``; `bucket_regret`); the variant is the one the bucket's row count picks.
    ``variant`` / ``num_splits`` force them.
    """
    return _plan_bucket(max_batch, max_tree, max_context, num_heads, checked_facts(num_heads, device), min_context, variant,
                        num_splits)


def _plan_bucket(max_batch: int, max_tree: int, max_context: int, num_heads: int, device: DeviceFacts,
                 min_context: Optional[int], variant: Optional[str], num_splits: Optional[int]) -> LaunchPlan:
    if min(max_batch, max_tree, num_heads) < 1 or max_context < 0:
        raise ValueError(f"bucket: need max_batch, max_tree, num_heads >= 1 and max_context >= 0, got "
                         f"{max_batch}, {max_tree}, {num_heads}, {max_context}")
    words = math.ceil(max_tree / 32)
    rows = max_batch * max_tree
    lo = max_context // 2 if min_context is None else min(min_context, max_context)
    base = _plan(rows, num_heads, max_batch, words, max_batch * (max_context + max_tree), device, variant, num_splits)
    base = dataclasses.replace(base, context=(lo, max_context))
    if num_splits is not None:
        return base
    total_rows = rows * num_heads
    if total_rows > WORKSPACE_ROWS:
        return base
    ctas = max_batch * math.ceil(max_tree * num_heads / base.block_m)
    slots = max(1, device.sm_count)
    lengths = _bucket_lengths(lo, max_context)
    limit = max(1, min(MAX_SPLITS, WORKSPACE_ROWS // total_rows, math.ceil((max_context + max_tree) / BLOCK_N)))
    candidates = sorted({1, base.num_splits} | {_choose_splits(ctas, max(1, math.ceil((n + max_tree) / BLOCK_N)),
                                                               total_rows, slots) for n in lengths})
    candidates = [min(s, limit) for s in candidates]
    best = min(candidates, key=lambda s: (round(bucket_regret(s, ctas, lengths, max_tree, total_rows, slots), 6), s))
    return dataclasses.replace(base, num_splits=best)
