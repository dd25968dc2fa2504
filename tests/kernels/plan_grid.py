"""The grid of shapes and device facts over which launch plans are pinned (`data/launch_plans.json`).

``python tests/kernels/plan_grid.py`` rewrites the file from the planner as it is; the file was
written by the planner before `LaunchPlan` carried its shapes and device, so the test comparing
against it proves the plan object changed nothing that a launch runs with.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent / "data" / "launch_plans.json"

DEVICES = [(132, (9, 0)), (78, (9, 0)), (188, (12, 0)), (84, (12, 0)), (108, (8, 0)), (170, (10, 0))]
EXACT = [(H, T, B, L) for H in (1, 8, 16, 64, 128) for T in (1, 4, 16, 33, 64, 256, 1024)
         for B in (1, 4, 32) for L in (0, 100, 4096, 32768, 131072)]
FORCED = [("base16", None), (None, 3), ("base32", 7), ("ws", 100000), ("wgmma", 2)]
BUCKETS = [(B, T, C, H) for B in (1, 2, 4, 8, 16, 32) for T in (4, 16, 64, 256, 1024)
           for C in (4096, 32768, 131072) for H in (8, 16, 128)]
BUCKET_MIN_CONTEXT = [0, 1000, 65536]


def exact_shapes(H: int, T: int, B: int, L: int) -> tuple[int, int, int, int, int]:
    """(num_rows, num_heads, batch, mask_words, num_kv) of B requests of T nodes and L prefix keys."""
    return T * B, H, B, math.ceil(T / 32), B * (L + T)


def old_results() -> dict:
    """(variant id, splits, grid_y) of every grid point, from the planner's shape-level functions;
    ``bucket_launched``: what the graph path launched with for each bucket before plans were held
    (the bucket's plan taken apart into a variant name and split count, planned again)."""
    from kdtree.kernels import launch_plan as lp
    from kdtree.kernels.device_facts import DeviceFacts

    def triple(p):
        return [p.variant, p.num_splits, p.grid_y]

    out = {"exact": [], "forced": [], "bucket": [], "bucket_min_context": [], "bucket_launched": []}
    for sms, cap in DEVICES:
        facts = DeviceFacts(sms, cap)
        for H, T, B, L in EXACT:
            out["exact"].append(triple(lp.plan(*exact_shapes(H, T, B, L), facts)))
        for H, T, B, L in EXACT[::7]:
            for variant, splits in FORCED:
                if variant is not None and variant not in lp.runnable_variants(cap):
                    continue
                out["forced"].append(triple(lp.plan(*exact_shapes(H, T, B, L), facts, variant=variant,
                                                    num_splits=splits)))
        for B, T, C, H in BUCKETS:
            bucket = lp.plan_bucket(B, T, C, H, facts)
            out["bucket"].append(triple(bucket))
            # what a graph launch ran with: the bucket's plan re-planned for the call, forced to its choices
            num_kv = B * (C + T)
            out["bucket_launched"].append(triple(lp.plan(
                B * T, H, B, math.ceil(T / 32), num_kv, facts, variant=lp.variant_name(bucket.variant),
                num_splits=bucket.num_splits)))
        for B, T, C, H in BUCKETS[::5]:
            for lo in BUCKET_MIN_CONTEXT:
                out["bucket_min_context"].append(triple(lp.plan_bucket(B, T, C, H, facts, min_context=lo)))
    return out


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(old_results(), separators=(",", ":")) + "\n")
    print(f"wrote {GOLDEN}")
