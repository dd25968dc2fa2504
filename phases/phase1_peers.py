"""Phase 1's comparison with FlashInfer's FA2 MLA kernel (mma.sync): the targets' figures.

FA2 takes a causal mask only, so both sides run the **chain** of each speed config: the same
inputs, so the speed mechanism can check that they agree before timing counts, and our kernel's
time on a chain is its time on a tree of the same size (the mask is a few bit tests per tile:
ours on random trees and on chains differ by < 0.5 % over the 72-shape grid, plans/results/phase1/
peers_grid.md). The figures ``fa2_median_speedup`` / ``fa2_min_speedup`` (FA2 time / ours) feed
the speed gate's targets; where FlashInfer is not importable the gate's details say why and the
targets read "not measured".
"""

from __future__ import annotations

from typing import Callable

from kdtree.gates.base import Figure, GateContext, GateResult


def add_fa2_figures(result: GateResult, spec, configs: list, ctx: GateContext, op: Callable,
                    timer, floor_s) -> None:
    """Time ``op`` against FlashInfer FA2 on the chains of ``configs``; add the two figures."""
    from kdtree.gates.speedup import SpeedConfig, check_speedup  # noqa: PLC0415
    from kdtree.kernels import flashinfer_peer  # noqa: PLC0415

    reason = flashinfer_peer.unavailable_reason("fa2")
    if reason is not None:
        result.details["fa2"] = f"not measured: FlashInfer FA2 MLA unavailable here ({reason})"
        return
    peer = flashinfer_peer.FlashInferMLA("fa2")
    args = ("q", "kv_cache", "qo_indptr", "kv_indptr", "kv_indices", "tree_mask", "sm_scale")

    def chained(cfg: SpeedConfig) -> SpeedConfig:
        def make_inputs(seed, device):
            case = dict(cfg.make_inputs(seed, device))
            case["tree_mask"] = flashinfer_peer.chain_mask(case["qo_indptr"], device=case["q"].device)
            case["fa2_call"] = peer.bind(case["q"], case["kv_cache"], case["qo_indptr"], case["kv_indptr"],
                                         case["kv_indices"], case["sm_scale"])
            return case
        return SpeedConfig(name=cfg.name, params=cfg.params, make_inputs=make_inputs, refresh=cfg.refresh)

    peer_spec = spec.model_copy(update={"min_median_speedup": 0.0, "min_each_speedup": 0.0})
    ctx.progress("timing FlashInfer FA2 MLA (chain) against the kernel", None)
    peer_result = check_speedup(peer_spec, [chained(c) for c in configs],
                                lambda c: op(*(c[k] for k in args)), lambda c: c["fa2_call"](), ctx,
                                timer=timer, floor_s=floor_s)
    by_name = {f.name: f.value for f in peer_result.figures}
    result.figures += [Figure(name="fa2_median_speedup", value=by_name.get("median_speedup"), unit="x"),
                       Figure(name="fa2_min_speedup", value=by_name.get("min_speedup"), unit="x")]
    result.details["fa2"] = {"flashinfer": flashinfer_peer.version(), "outcome": peer_result.outcome.value,
                             "summary": peer_result.summary, "configs": peer_result.details.get("configs")}
