"""Phase 4's work: each gate of `kdtree.phases.phase4.spec.SPEC` bound to its measurement in
`kdtree.bench.defrag_figures` and judged by `kdtree.gates.metric.check_metric`.

What each measurement runs is its gate's ``workload`` in the spec ("full", or "quick" on a quick
run: tests, CI). Seeds are fresh per run (`ctx.fresh_seed`). Checks that take a relocator accept
``relocator_cls`` so the tests can hand them broken relocations and assert why they fail; the
other keyword arguments override the workload for the tests.
"""

from __future__ import annotations

from typing import Optional

from kdtree.bench import defrag_figures as measure
from kdtree.gates.base import GateContext, GateResult
from kdtree.gates.metric import check_metric
from kdtree.phases.models import SPEED_PRESET


def _workload(spec, ctx: GateContext) -> dict:
    """The gate's workload for this run: its "quick" one on a quick run where it has one."""
    sizes = spec.workload
    return dict(sizes["quick" if ctx.quick and "quick" in sizes else "full"])


def check_integrity(spec, ctx: GateContext, relocator_cls=None, trials: Optional[int] = None) -> GateResult:
    """Tier 0+1 churn with materialised target + draft stores, a prefix cache and pinned requests:
    after every relocation round, every live sequence's KV read through the maps == the shadow
    copy written with it, byte for byte, and no pinned slot moved or changed."""
    workload = _workload(spec, ctx)
    runs = workload.pop("trials")
    figures, details = measure.integrity(ctx, workload, relocator_cls, trials or runs)
    return check_metric(spec, figures, ctx, details=details)


def check_token_exact(spec, ctx: GateContext, relocator_cls=None, requests: Optional[int] = None,
                      trials: Optional[int] = None) -> GateResult:
    """Speculative decoding (self-draft trees) of requests arriving at random steps: every
    request's tokens with defrag on (Tier 0 + relocation after every step) == with it off."""
    workload = _workload(spec, ctx)
    figures, details = measure.token_exact(ctx, requests or workload["requests"], trials or workload["trials"],
                                           relocator_cls)
    return check_metric(spec, figures, ctx, details=details)


def check_copy_budget(spec, ctx: GateContext, relocator_cls=None) -> GateResult:
    """Tier 0+1 churn at scale; the bytes each round really copies are counted at the pool's copy
    (not from the relocator's own report) and held against that round's budget."""
    figures, details = measure.copy_budget(ctx, _workload(spec, ctx), relocator_cls)
    return check_metric(spec, figures, ctx, details=details)


def check_contiguity(spec, ctx: GateContext, relocator_cls=None) -> GateResult:
    """Runs per live request after the same churn workload, per allocator mode; also the host cost
    of the allocator per step and the free tail each mode leaves."""
    workload = _workload(spec, ctx)
    figures, details = measure.contiguity(ctx, workload["churn"], workload["alloc_cost"], SPEED_PRESET, relocator_cls)
    return check_metric(spec, figures, ctx, details=details)


def check_no_slowdown(spec, ctx: GateContext, kernel_fn=None, layers: Optional[int] = None,
                      long_context: Optional[dict] = None, repeats: Optional[int] = None) -> GateResult:
    """The phase-1 kernel on the unsorted layout vs the Tier 0+1 layout of the same requests
    after the same churn (outputs agree), GPU time interleaved; a whole verify step with defrag on
    vs off, wall time, interleaved step by step."""
    workload = _workload(spec, ctx)
    layers, repeats = layers or workload.pop("layers"), repeats or workload.pop("repeats")
    workload.pop("layers", None)
    workload.pop("repeats", None)
    figures, details = measure.no_slowdown(ctx, workload if long_context is None else long_context, SPEED_PRESET,
                                           kernel_fn, layers, repeats)
    return check_metric(spec, figures, ctx, details=details)


def check_benefit(spec, ctx: GateContext, long_context: Optional[dict] = None, stores: Optional[int] = None,
                  repeats: Optional[int] = None, defrag_mode: str = "tier0+1") -> GateResult:
    """What contiguity buys, from B=8 L=32k requests after churn, fragmented vs defragmented
    (`defrag_mode`; the tests hand it a mode that does not defragment): the PD hand-off (the gated
    figure), the host offload round trip, the run-length metadata."""
    workload = _workload(spec, ctx)
    stores, repeats = stores or workload.pop("stores"), repeats or workload.pop("repeats")
    workload.pop("stores", None)
    workload.pop("repeats", None)
    figures, details = measure.benefit(ctx, workload if long_context is None else long_context, stores, repeats,
                                       defrag_mode)
    return check_metric(spec, figures, ctx, details=details)
