"""Phase 3's work: what each gate of `kdtree.phases.phase3.spec.SPEC` runs, bound to this project.

Three kinds of captured callables are put through `kdtree.gates.graph_safety`:
- **launch** cases: one kernel launch with a bucket's fixed plan (`kdtree.kernels.plan_bucket`)
  over static buffers sized for the bucket; every draw has a fresh number of live requests
  (the rest padded: no rows, no keys), fresh tree sizes up to the bucket's (the rows past the
  last node padded, their mask rows garbage), fresh prefix lengths from 0 to the bucket's
  context, fresh slots, q and KV; the callable zeroes ``out`` and ``lse`` then launches, so
  every output element is defined;
- **converter** case: SGLang's target-verify metadata converted on the device
  (`VerifyConverter`, Triton) and the kernel launched, both into preallocated buffers;
- **step** cases: the engine's whole verify step (`graph_capture.verify_body`: metadata
  conversion, every layer, the head) for a bucket, fresh lengths / trees / tokens / slots.

Speed: a whole verify step of the dsv3-tp8 model, the engine's graph path (staging copies +
replay) against its eager path, interleaved, at B in {1, 4}, L = 4k; decode tokens/s with and
without graphs; a captured launch against an eager launch planned for the exact length at
L >= 32k (GPU time, each call queued behind an L2 wipe and a busy-wait). Parameters after
``ctx`` exist for the tests (broken candidates, small sizes); the phase runs the defaults.
"""

from __future__ import annotations

import math
import statistics
from typing import Optional

from kdtree.bench.graph_cases import (
    _triton_available, buffer_comparison, captured_launch_loss, converter_case, engine_step_allocations,
    launch_cases, oracle_check, step_cases, time_verify_step, timed_decode_graphs,
)
from kdtree.bench.graph_replay import graph_protocol, measure_graph_cases
from kdtree.gates.base import Figure, GateContext, GateResult, Outcome, verdict
from kdtree.gates.graph_safety import summarize
from kdtree.gates.metric import check_metric
from kdtree.gates.spec import GraphSafetyGateSpec
from kdtree.gates.stats import Spread
from kdtree.phases.models import SPEED_PRESET, shared_model



def _workload(spec, given: dict) -> dict:
    """The gate's workload in the spec, with what the caller gave (not None) in its place."""
    return {**spec.workload["full"], **{k: v for k, v in given.items() if v is not None}}


def _safety(spec, ctx: GateContext, pairs) -> GateResult:
    reports, details = measure_graph_cases(pairs, ctx, **graph_protocol(spec))
    return summarize(spec, reports, **details)


# -- gates ---------------------------------------------------------------------------------------
def check_replay_equal(spec, ctx: GateContext, launch_candidate=None, step_backend=None,
                       launch_buckets=None, step_buckets=None, step_preset: Optional[str] = None,
                       with_oracle: bool = True) -> GateResult:
    """Replay == eager, bitwise, on fresh inputs, for launch and whole-step buckets; plus the
    bucket-planned launch against the fp64 oracle (so replay and eager cannot be wrong together)."""
    w = _workload(spec, dict(launch_buckets=launch_buckets, step_buckets=step_buckets, step_preset=step_preset))
    launch_buckets, step_buckets, step_preset = w["launch_buckets"], w["step_buckets"], w["step_preset"]
    pairs = launch_cases(launch_buckets, launch_candidate) + step_cases(shared_model(step_preset, ctx.device), step_buckets,
                                                                          step_backend)
    result = _safety(spec, ctx, pairs)
    if with_oracle:
        worst, rows = oracle_check(launch_buckets, launch_candidate, ctx)
        result.details["oracle"] = rows
        result.figures.append(Figure(name="bucket_plan_vs_oracle_rel_l2", value=worst, op="<=", threshold=1e-2))
        if not (worst <= 1e-2) and result.outcome is Outcome.PASSED:
            result.outcome = Outcome.FAILED
            result.summary = f"a bucket-planned launch is off the oracle (rel L2 {worst:.3g}); " + result.summary
    return result


def check_capture_clean(spec, ctx: GateContext, launch_candidate=None, step_backend=None,
                        launch_buckets=None, step_buckets=None, step_preset: Optional[str] = None,
                        with_converter: Optional[bool] = None, engine_steps: Optional[int] = None,
                        graphs_factory=None) -> GateResult:
    """No host sync in any capture (under sync debug mode "error"), no allocation in the launch
    and converter captures, none in any replay, none in the engine's graph steps; the graph
    buffers next to SGLang's verify mask at 128k."""
    w = _workload(spec, dict(launch_buckets=launch_buckets, step_buckets=step_buckets, step_preset=step_preset,
                             engine_steps=engine_steps))
    launch_buckets, step_buckets, step_preset = w["launch_buckets"], w["step_buckets"], w["step_preset"]
    engine_steps = w["engine_steps"]
    probe = GraphSafetyGateSpec(name=spec.name, replays=3, max_rel_l2=0.0)
    pairs = launch_cases(launch_buckets, launch_candidate)
    if with_converter is None:
        with_converter = _triton_available()
    if with_converter:
        pairs.append(converter_case())
    pairs += step_cases(shared_model(step_preset, ctx.device), step_buckets, step_backend)
    safety = _safety(probe, ctx, pairs)
    got = {f.name: f.value for f in safety.figures}
    figures = {name: got[name] for name in ("host_syncs_in_capture", "allocations_in_capture", "allocations_in_replay",
                                            "capture_failures", "pool_allocations_in_capture") if got.get(name) is not None}
    step_allocs, graph_rows = engine_step_allocations(shared_model(step_preset, ctx.device), engine_steps,
                                                      graphs_factory=graphs_factory)
    figures["allocations_in_replay"] = figures.get("allocations_in_replay", 0) + step_allocs
    figures["engine_graph_steps"] = graph_rows["replays"]
    buffers = buffer_comparison(w["buffer_context"], w["buffer_buckets"])
    for row in buffers:
        figures[f"mask_buffer_ratio_B{row['batch']}_T{row['tree']}"] = row["ratio"]
    figures["mask_buffer_ratio_128k"] = min(row["ratio"] for row in buffers)
    figures["packed_mask_ratio_128k"] = min(row["mask_only_ratio"] for row in buffers)
    figures["graph_metadata_ratio_128k"] = min(row["total_ratio"] for row in buffers)
    details = {"cases": safety.details.get("cases"), "safety_summary": safety.summary, "engine": graph_rows,
               "buffers_128k": buffers, "converter_case": bool(with_converter)}
    result = check_metric(spec, figures, ctx, details=details)
    if safety.outcome is not Outcome.PASSED and result.outcome is Outcome.PASSED:
        result.outcome = Outcome.FAILED
        result.summary = f"graph safety: {safety.summary}; " + result.summary
    elif safety.outcome is not Outcome.PASSED:
        result.summary = f"graph safety: {safety.summary}; " + result.summary
    return result


def check_replay_speedup(spec, ctx: GateContext, preset_name: str = SPEED_PRESET, batches=None,
                         context: Optional[int] = None, tree: Optional[int] = None, loss_buckets=None,
                         loss_contexts=None, decode_new_tokens: Optional[int] = None) -> GateResult:
    """Whole verify step, graph vs eager (engine, kernel backend), interleaved, at each batch;
    decode tokens/s with and without graphs; captured launch vs exact-length eager at L >= 32k."""
    w = _workload(spec, dict(batches=batches, context=context, tree=tree, loss_buckets=loss_buckets,
                             loss_contexts=loss_contexts, decode_new_tokens=decode_new_tokens))
    batches, context, tree, decode_new_tokens = w["batches"], w["context"], w["tree"], w["decode_new_tokens"]
    loss_buckets, loss_contexts = w["loss_buckets"], w["loss_contexts"]
    model = shared_model(preset_name, ctx.device)
    figures: list[Figure] = []
    rows, problems, speedups = [], [], {}
    for batch in batches:
        ctx.progress(f"verify step B={batch} L={context}: graph vs eager", None)
        row = time_verify_step(model, context, batch, tree, ctx.fresh_seed(), warmup=spec.warmup, repeats=spec.repeats)
        problems += [f"B={batch}: {p}" for p in row.pop("problems")]
        g, e = Spread.of(row.pop("graph_s")), Spread.of(row.pop("eager_s"))
        speedups[batch] = e.median / g.median
        rows.append({"batch": batch, "context": context, "tree": tree, "graph": g.ms(), "eager": e.ms(),
                     "speedup": speedups[batch], **row})
        figures.append(Figure(name=f"replay_speedup_b{batch}", value=speedups[batch], unit="x"))
    median = statistics.median(speedups.values()) if speedups else math.nan
    figures.insert(0, Figure(name="replay_speedup", value=median, unit="x", op=">=",
                             threshold=spec.min_replay_speedup, key=True))
    figures.append(Figure(name="logit_disagreements", value=len(problems), op="<=", threshold=0))

    ctx.progress("decode tokens/s with and without graphs", None)
    decode = timed_decode_graphs(model, context, decode_new_tokens, ctx.fresh_seed(), budget=tree)
    figures += [Figure(name="decode_tokens_per_s_graph", value=decode["tokens_per_s"]["graph"], unit=" tok/s"),
                Figure(name="decode_tokens_per_s_eager", value=decode["tokens_per_s"]["eager"], unit=" tok/s"),
                Figure(name="decode_graph_speedup",
                       value=decode["tokens_per_s"]["graph"] / decode["tokens_per_s"]["eager"], unit="x"),
                Figure(name="decode_same_tokens", value=float(decode["same_tokens"]), op="==", threshold=1.0)]

    loss_rows = []
    for batch, t in loss_buckets:
        for size in loss_contexts:
            ctx.progress(f"captured launch vs exact eager B={batch} T={t} bucket {size}", None)
            loss_rows += captured_launch_loss(batch, t, size, w["loss_heads"], ctx)
    losses = [r["loss"] for r in loss_rows if r["context"] >= 32768]
    figures.append(Figure(name="captured_launch_loss_max", value=max(losses) if losses else math.nan))
    figures.append(Figure(name="captured_launch_loss_median", value=statistics.median(losses) if losses else math.nan))
    bad = [r for r in loss_rows if not r["agree"]]
    figures.append(Figure(name="captured_launch_disagreements", value=len(bad), op="<=", threshold=0))
    details = {"steps": rows, "decode": {k: v for k, v in decode.items() if k != "tokens"}, "launch_loss": loss_rows,
               "timer": "cuda_event (host launch included)", "problems": problems}
    return verdict(spec.name, spec.kind, figures, "; ".join(problems[:3]), **details)


