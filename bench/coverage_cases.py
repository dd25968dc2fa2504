"""The coverage cases (phase 1's accuracy gate): the accuracy cases run through every kernel variant, through forced
KV split counts around those other GPUs would choose, and on a pool whose slots sit past 2^31
elements. Phase 1's accuracy gate adds them when it checks the owned kernel.

Why: the launch plan picks one variant and one split count per shape and device, so a run on one
Hopper card alone never exercises ``base32`` (the pre-sm_90 path) and never the split counts a card
with another SM count chooses (188 on the RTX PRO 6000, an sm_120 card). Forcing them through
their plans (`kdtree.bench.forced`) checks every specialisation on every case; the large pool checks
the 64-bit slot offsets (slot * 576 > 2^31) that the phase's small pools never reach.

A coverage case's inputs carry ``inputs["launch"]``: the kernel's call with its variant and split
count forced, which the gate's candidate uses in place of the plain op. torch is imported only
inside the functions that build inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

from kdtree.bench.cases import make_case, make_pool
from kdtree.gates.accuracy import AccuracyCase
from kdtree.bench.forced import forced_kernel
from kdtree.kernels.device_facts import DeviceFacts
from kdtree.kernels.launch_plan import MAX_SPLITS, VARIANTS, WORKSPACE_ROWS, plan, runnable_variants

# (SM count, compute capability) of the cards whose split choices are covered.
SPLIT_DEVICES = ((188, (12, 0)), (132, (9, 0)))  # RTX PRO 6000 Blackwell, H200
ELEMENT_LIMIT = 2**31
HIGH_SLOT = -(-ELEMENT_LIMIT // 576)  # the first slot whose element offset is >= 2^31 (3728271)
LARGE_POOL_SLOTS = 4 << 20  # 4 Mi slots, 4.8 GB: 466k slots past 2^31 elements
LARGE_POOL_CASES = [  # (name, H, [(T_b, L_b)], tree kind): a long prefix that splits, and a mixed batch
    ("H8 T16 L16k", 8, [(16, 16384)], "random"),
    ("mixed H4", 4, [(9, 700), (1, 0), (40, 33)], "random"),
]


@dataclass(frozen=True)
class CoverageCase:
    """One accuracy case with the launch forced (None: the plan's choice) and its pool."""

    name: str
    H: int
    requests: list
    kind: str
    variant: Optional[str] = None
    num_splits: Optional[int] = None
    pool_slots: Optional[int] = None  # None: a small pool drawn for the case
    min_slot: int = 0  # every slot the case reads is >= this
    params: dict = field(default_factory=dict)

    def make_inputs(self, seed: int, device: str) -> dict[str, Any]:
        pool = make_pool(self.pool_slots, device, seed) if self.pool_slots else None
        inputs = make_case(self.H, self.requests, self.kind, seed, pool=pool, device=device, min_slot=self.min_slot)
        inputs["launch"] = forced_kernel(self.variant, self.num_splits)
        return inputs


def plan_splits(H: int, requests: list, sm_count: int, capability: tuple[int, int]) -> int:
    """The split count the launch plan chooses for a case on a device with ``sm_count`` SMs."""
    rows = sum(t for t, _ in requests)
    words = math.ceil(max(t for t, _ in requests) / 32)
    kv = sum(t + ell for t, ell in requests)
    return plan(rows, H, len(requests), words, kv, DeviceFacts(sm_count, tuple(capability))).num_splits


def split_counts(H: int, requests: list) -> list[int]:
    """Forced split counts for a case: each SPLIT_DEVICES choice and its neighbours, when any of
    them splits at all (and within what the workspace holds)."""
    chosen = [plan_splits(H, requests, sms, cap) for sms, cap in SPLIT_DEVICES]
    if max(chosen) <= 1:
        return []
    limit = min(MAX_SPLITS, WORKSPACE_ROWS // (H * sum(t for t, _ in requests)))
    return sorted({s + d for s in chosen for d in (-1, 0, 1) if 1 <= s + d <= limit})


def device_variants(device: str = "cuda") -> list[str]:
    """The variants the current CUDA device runs (`launch_plan.runnable_variants`: wgmma on a 9.0
    device only); every variant when there is no CUDA device (the cases are then only listed)."""

    if str(device).startswith("cuda") and torch.cuda.is_available():
        return runnable_variants(torch.cuda.get_device_capability())
    return list(VARIANTS)


def coverage_cases(base_cases: list, variants: Optional[Sequence[str]] = None) -> list[CoverageCase]:
    """The coverage cases for ``base_cases`` (tuples starting (name, H, [(T_b, L_b)], kind)):
    every case through every variant of ``variants`` (default: all of VARIANTS; the gate passes
    `device_variants()`), split counts around SPLIT_DEVICES' choices, and LARGE_POOL_CASES on a
    pool past 2^31 elements (plan's launch, then every variant)."""
    variants = list(VARIANTS) if variants is None else list(variants)
    out = []
    for name, H, reqs, kind, *_ in base_cases:
        for variant in variants:
            out.append(CoverageCase(f"{name} [{variant}]", H, list(reqs), kind, variant=variant,
                                    params={"H": H, "requests": reqs, "tree": kind, "variant": variant}))
        for splits in split_counts(H, reqs):
            out.append(CoverageCase(f"{name} [splits {splits}]", H, list(reqs), kind, num_splits=splits,
                                    params={"H": H, "requests": reqs, "tree": kind, "num_splits": splits}))
    for name, H, reqs, kind in LARGE_POOL_CASES:
        for variant in (None, *variants):
            out.append(CoverageCase(f"{name} [slots >= {HIGH_SLOT}{', ' + variant if variant else ''}]", H,
                                    list(reqs), kind, variant=variant, pool_slots=LARGE_POOL_SLOTS,
                                    min_slot=HIGH_SLOT,
                                    params={"H": H, "requests": reqs, "tree": kind, "variant": variant,
                                            "pool_slots": LARGE_POOL_SLOTS, "min_slot": HIGH_SLOT}))
    return out


def accuracy_cases(base_cases: list, variants: Optional[Sequence[str]] = None) -> list:
    """`coverage_cases` as the accuracy gate's `AccuracyCase` objects (outputs: out, lse)."""

    def outputs(inp):
        nq, heads = inp["q"].shape[:2]
        return {"out": torch.empty(nq, heads, 512, dtype=torch.bfloat16, device=inp["q"].device),
                "lse": torch.empty(nq, heads, dtype=torch.float32, device=inp["q"].device)}

    return [AccuracyCase(name=c.name, make_inputs=c.make_inputs, make_outputs=outputs, params=c.params)
            for c in coverage_cases(base_cases, variants)]
