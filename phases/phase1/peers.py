"""Phase 1's comparison with FlashInfer's MLA kernels: FA2 (mma.sync, the sm_120-portable peer) and,
on a Hopper device, FA3 (wgmma; the peer of our wgmma variant). The targets' figures.

FA2 takes a causal mask only, so both sides run the **chain** of each speed config: the same
inputs, so the speed mechanism can check that they agree before timing counts, and our kernel's
time on a chain is its time on a tree of the same size (the mask is a few bit tests per tile:
ours on random trees and on chains differ by < 0.5 % over the 72-shape grid, plans/results/phase1/
peers_grid.md). The figures ``<peer>_median_speedup`` / ``<peer>_min_speedup`` (peer time / ours)
feed the speed gate's targets, and ``<peer>_min_speedup_tc`` the minimum over the tensor-core-bound
configs only (FLOPs / matmul rate above bytes / copy bandwidth: where wgmma, not the gather,
decides the time); where FlashInfer or the peer is unavailable (FA3 off Hopper) the gate's details say why and
the targets read "not measured".

FlashMLA's dense decode (`kdtree.bench.flashmla_peer`, 64-token pages, causal: its best case) is
the second Hopper peer: ``flashmla_*`` figures (the median's target is in the spec); its outputs are held
against the fp64 oracle on the chain before its time counts.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from kdtree.bench import flashinfer_peer, flashmla_peer
from kdtree.bench.speed import SpeedConfig, measure_speedup, speed_protocol
from kdtree.gates import speedup as speedup_gate
from kdtree.gates.base import Figure, GateContext, GateResult


def _peer_figures(name: str, rows: list, by_name: dict, bound: set) -> list[Figure]:
    tc = [r["speedup"] for r in rows if r.get("config") in bound and r.get("speedup") is not None]
    return [Figure(name=f"{name}_median_speedup", value=by_name.get("median_speedup"), unit="x"),
            Figure(name=f"{name}_min_speedup", value=by_name.get("min_speedup"), unit="x"),
            Figure(name=f"{name}_min_speedup_tc", value=min(tc) if tc else None, unit="x")]


ARGS = ("q", "kv_cache", "qo_indptr", "kv_indptr", "kv_indices", "tree_mask", "sm_scale")


def _call(fn: Callable) -> Callable:
    return lambda c: fn(*(c[k] for k in ARGS))


def _time_against_peer(result: GateResult, spec, configs: list, ctx: GateContext, op: Callable, timer, floor_s,
                       tensor_bound: Callable, key: str, bind: Callable[[SpeedConfig, dict], Callable], what: str,
                       others: Optional[dict[str, Callable]] = None) -> tuple:
    """Time ``op`` on the chains of ``configs`` against the peer call ``bind(config, case)`` returns (bound
    outside the timed region, per input set) with the speed gate's protocol (outputs agree first);
    add the figures ``{key}_*`` (and ``{name}_{key}_*`` per ``others``). Returns (gate result of
    the pass, its per-config rows, the tensor-core-bound config names)."""

    def chained(cfg: SpeedConfig) -> SpeedConfig:
        def make_inputs(seed, device):
            case = dict(cfg.make_inputs(seed, device))
            case["tree_mask"] = flashinfer_peer.chain_mask(case["qo_indptr"], device=case["q"].device)
            case["peer_call"] = bind(cfg, case)
            return case
        return SpeedConfig(name=cfg.name, params=cfg.params, make_inputs=make_inputs, refresh=cfg.refresh)

    others = dict(others or {})
    peer_spec = spec.model_copy(update={"min_median_speedup": 0.0, "min_each_speedup": 0.0})
    ctx.progress(f"timing {what} (chain) against the kernel", None)
    measured = measure_speedup([chained(c) for c in configs], _call(op), lambda c: c["peer_call"](), ctx,
                               **speed_protocol(peer_spec), timer=timer, floor_s=floor_s,
                               others={name: _call(fn) for name, fn in others.items()})
    peer_result = speedup_gate.judge_speedup(peer_spec, measured, ctx)
    by_name = {f.name: f.value for f in peer_result.figures}
    rows = peer_result.details.get("configs") or []
    bound = {c.name for c in configs if tensor_bound(c)}
    result.figures += _peer_figures(key, rows, by_name, bound)
    for name in others:
        other_rows = [{"config": r.get("config"), **(r.get("others") or {}).get(name, {})} for r in rows]
        ok_rows = [r for r in other_rows if r.get("status") == "ok"]
        result.figures += _peer_figures(
            f"{name}_{key}", ok_rows,
            {"median_speedup": by_name.get(f"{name}_median_speedup"), "min_speedup": by_name.get(f"{name}_min_speedup")},
            bound)
    return peer_result, rows, bound


def add_peer_figures(result: GateResult, spec, configs: list, ctx: GateContext, op: Callable,
                     timer, floor_s, backend: str = "fa2", tensor_bound: Callable = lambda cfg: True, *,
                     others: Optional[dict[str, Callable]] = None, smem_per_sm: Optional[int] = None,
                     label: Optional[str] = None, prefix: str = "") -> None:
    """Time ``op`` against FlashInfer's ``backend`` on the chains of ``configs``; add its figures
    ``{prefix}{label}_median_speedup``, ``_min_speedup`` and ``_min_speedup_tc`` (``label``:
    the backend's name unless given). ``others`` (name -> op) are timed in the same rounds and add
    ``{name}_{label}_*``. ``smem_per_sm``: FlashInfer built as a device with that much shared
    memory per SM would build it (`kdtree.bench.flashinfer_peer`)."""
    label = label or backend
    key = prefix + label
    reason = flashinfer_peer.unavailable_reason(backend, smem_per_sm=smem_per_sm)
    if reason is not None:
        result.details[key] = f"not measured: FlashInfer {label.upper()} MLA unavailable here ({reason})"
        return
    peer = flashinfer_peer.FlashInferMLA(backend, smem_per_sm=smem_per_sm)
    bind = lambda cfg, case: peer.bind(case["q"], case["kv_cache"], case["qo_indptr"], case["kv_indptr"],  # noqa: E731
                                  case["kv_indices"], case["sm_scale"])
    peer_result, rows, bound = _time_against_peer(result, spec, configs, ctx, op, timer, floor_s, tensor_bound, key,
                                                  bind, f"FlashInfer {label.upper()} MLA", others)
    result.details[key] = {"flashinfer": flashinfer_peer.version(), "outcome": peer_result.outcome.value,
                           "summary": peer_result.summary, "tensor_bound_configs": sorted(bound),
                           "smem_per_sm": smem_per_sm, "others": sorted(others or {}), "configs": rows}


FLASHMLA = "flashmla"


def add_flashmla_figures(result: GateResult, spec, configs: list, ctx: GateContext, op: Callable,
                         timer, floor_s, tensor_bound: Callable = lambda cfg: True) -> None:
    """Time ``op`` against FlashMLA's dense decode (`kdtree.bench.flashmla_peer`: causal chain,
    64-token pages) on the chains of ``configs``; add ``flashmla_median_speedup``,
    ``flashmla_min_speedup`` and ``flashmla_min_speedup_tc`` (FlashMLA time / ours), reported.
    Each input set's first FlashMLA output is held against the fp64 oracle on the chain (rel-L2
    <= ``spec.agree_max_rel_l2``) before its time can count: one that is not gives NaN from then
    on, so the gate marks that config disagreeing and leaves its time out; so does a config whose
    call FlashMLA refuses (details' ``refused``). Where FlashMLA does not load, or fails on every
    config in a way the pass cannot survive, the figures are not measured and the details say why."""
    reason = flashmla_peer.unavailable_reason()
    if reason is not None:
        result.details[FLASHMLA] = f"not measured: FlashMLA's dense decode not loaded here ({reason})"
        return
    peer = flashmla_peer.FlashMLADecode()
    oracle_errors: dict[str, list] = {}

    refused: dict[str, str] = {}

    def bind(cfg: SpeedConfig, case: dict) -> Callable:
        q = case["q"]
        try:
            call = peer.bind(q, case["kv_cache"], case["qo_indptr"], case["kv_indptr"], case["kv_indices"],
                             case["sm_scale"])
            got = call()
        except (RuntimeError, ValueError, AssertionError) as exc:  # a shape it refuses: that config only
            refused[cfg.name] = f"{type(exc).__name__}: {str(exc)[:300]}"
            return lambda: torch.full((q.shape[0], q.shape[1], flashmla_peer.HEAD_DIM_V), math.nan,
                                      dtype=q.dtype, device=q.device)
        err = flashmla_peer.oracle_rel_l2(got, case)
        oracle_errors.setdefault(cfg.name, []).append(err if math.isfinite(err) else None)
        if not err <= spec.agree_max_rel_l2:
            return lambda: torch.full_like(call(), math.nan)
        return call

    try:
        peer_result, rows, bound = _time_against_peer(result, spec, configs, ctx, op, timer, floor_s, tensor_bound,
                                                      FLASHMLA, bind, "FlashMLA's dense decode")
    except Exception as exc:  # loaded but refused to run here (a kernel image this driver rejects, ...)
        result.details[FLASHMLA] = (f"not measured: FlashMLA's dense decode loaded but failed here "
                                    f"({type(exc).__name__}: {str(exc)[:500]})")
        return
    result.details[FLASHMLA] = {"flash_mla": flashmla_peer.version(), "page_size": flashmla_peer.PAGE_SIZE,
                                "outcome": peer_result.outcome.value, "summary": peer_result.summary,
                                "oracle_rel_l2": oracle_errors, "refused": refused,
                                "tensor_bound_configs": sorted(bound),
                                "configs": rows}
