"""Phase 4: defragmenting the page_size=1 KV token pool, proven lossless and measured for what it buys.

Tier 0 (`kdtree.engine.kv.allocator.SortedRunAllocator`) keeps free slots as sorted runs, serves an
allocation from the lowest run that fits and grows a request's last run in place. Tier 1
(`kdtree.engine.kv.relocation.Relocator`) moves live KV between steps under a per-step copy budget,
rewriting every holder of slot ids (req_to_token, a draft model's pool, a prefix cache's nodes)
with the copy, and never touching a slot a running or captured step can read (pins). Scattered
slots cost attention next to nothing (phase 1's `scatter` gate, docs/design.md section 3b), so the
gates do not claim bandwidth: they prove defrag loses nothing and slows nothing, and measure what contiguity buys
(the `benefit` gate), including where it buys nothing.

The checks live in `checks`. `TARGETS` holds the issue's targets (best in the field, never
blocking) by gate and figure, set on the gates' ``targets`` field below.
"""

from __future__ import annotations

from kdtree.gates.spec import MetricGateSpec, PhaseSpec, Target, Threshold
from kdtree.phases import with_targets


def _gate(name: str, requires: list[str], thresholds: list[tuple], description: str,
          workload: dict) -> MetricGateSpec:
    """A metric gate from (figure, op, value[, unit]) thresholds, measuring `workload`."""
    return MetricGateSpec(name=name, requires=requires, description=description, workload=workload,
                          thresholds=[Threshold(figure=t[0], op=t[1], value=t[2], unit=t[3] if len(t) > 3 else "")
                                      for t in thresholds])


# The churn workloads (kdtree.bench.churn): "full" is what the phase measures (a 1M-slot pool,
# hundreds of live requests; B=8 at L=32k for the step and kernel figures), "quick" what a quick
# run (tests, CI) measures.
SCALE = {"full": dict(num_slots=1 << 20, live_requests=256, steps=100),
         "quick": dict(num_slots=1 << 17, live_requests=48, steps=40, prompt_len=(128, 1536),
                       new_tokens=(32, 384))}
INTEGRITY = {"full": dict(num_slots=32768, live_requests=24, steps=80, prompt_len=(64, 1024),
                          new_tokens=(32, 256)),
             "quick": dict(num_slots=8192, live_requests=10, steps=40, prompt_len=(32, 384),
                           new_tokens=(16, 128))}
LONG_CONTEXT = dict(num_slots=1 << 20, live_requests=8, prompt_len=(32768, 32768), new_tokens=(256, 2048),
                    steps=150)
ALLOC_COST = {"full": LONG_CONTEXT, "quick": dict(LONG_CONTEXT, steps=60)}  # B=8, L=32k: the target's step


_RELOCATED = ("rows_relocated", ">=", 1)  # a gate about relocation must have seen rows move

SPEC = PhaseSpec(
    id="phase4",
    title="defrag",
    objective=("Tier 0 (sorted free runs, lowest fit, in-place growth) and Tier 1 (relocation of live KV "
               "between steps under a copy budget) keep each request's KV in few runs without losing or "
               "changing a KV byte, without changing a token and without slowing the kernel or the step; "
               "what contiguity buys is measured, including where it buys nothing."),
    deliverables=[
        "kdtree.engine.kv.allocator.SortedRunAllocator (Tier 0; its core native, engine/kv/csrc/slot_runs.cpp, "
        "where a C++ compiler is found, else the same in Python) and kdtree.bench.sglang_allocator_model "
        "(SGLang 0.5.23's page_size=1 allocator, the baseline)",
        "kdtree.engine.kv.relocation: victims by runs removed per byte, a per-step byte budget, pins; "
        "KVPool.move_tokens rewrites req_to_token, the draft pool and a prefix cache's nodes with the copy",
        "kdtree.bench.churn and kdtree.bench.spec_churn: churn workloads (synthetic at 1M slots; "
        "speculative decoding with requests arriving and finishing)",
        "kdtree.bench.defrag_measure: offload/hand-off copies, run-length metadata, the free tail",
    ],
    versions=["torch", "nvcc"],  # recorded with every run, besides python and the orchestrator
    inputs=["bench/**/*.py", "engine/**/*.py", "engine/kv/csrc/**", "kernels/**/*.py", "phases/__init__.py",
            "phases/models.py", "phases/phase4/**/*.py", "gates/**/*.py"],
    gates=[
        _gate("integrity", ["torch"],
              [("kv_bytes_changed", "==", 0, " B"), ("kv_slots_lost", "==", 0), ("pinned_slots_touched", "==", 0),
               _RELOCATED],
              "Tier 0+1 churn (target + draft stores, prefix-cache nodes, pinned requests): after "
              "every relocation round every live sequence's KV in token order, read through the "
              "maps, is byte-equal to a shadow written with it; no slot lost; no pinned slot moved",
              {"full": dict(INTEGRITY["full"], trials=2), "quick": dict(INTEGRITY["quick"], trials=2)}),
        _gate("token_exact", ["torch"], [("exact_fraction", ">=", 1.0), _RELOCATED],
              "self-draft tree speculative decoding, requests arriving and finishing at random "
              "steps: every request's tokens with defrag on == with defrag off",
              {"full": dict(requests=10, trials=2), "quick": dict(requests=6, trials=1)}),
        _gate("copy_budget", ["torch"],
              [("max_step_copy_over_budget", "<=", 1.0, "x"), ("max_copy_traffic_fraction", "<=", 0.01), _RELOCATED],
              "bytes each relocation round copies, counted at the pool's copy, / the round's budget "
              "(1 % of the step's KV reads, read + write counted); 1M slots, 256 live requests",
              SCALE),
        _gate("contiguity", ["torch"], [("run_reduction_tier01", ">=", 10.0, "x")],
              "runs per live request after the same churn (1M slots, 256 live, T=16 trees with "
              "rejected-draft frees): SGLang's unsorted free list / Tier 0+1; Tier 0 alone, SGLang's "
              "PD sort, allocator host cost and the free tail are recorded",
              {size: {"churn": SCALE[size], "alloc_cost": ALLOC_COST[size]} for size in ("full", "quick")}),
        _gate("no_slowdown", ["cuda"],
              [("kernel_time_ratio", "<=", 1.02, "x"), ("step_time_ratio", "<=", 1.05, "x"),
               ("kernel_outputs_max_abs_diff", "<=", 1e-2)],
              "B=8 L=32k, H=16, T=16: the phase-1 kernel on the Tier 0+1 layout / the unsorted "
              "layout of the same requests after the same churn (GPU time, interleaved; outputs "
              "agree); the whole step (allocator, metadata, kernel x 61 layers, relocation) defrag "
              "on / off. Tolerances: 2 % kernel, 5 % step (timing noise of a host-bound step). "
              "Recorded beside it: the kernel reading (first slot, first key) runs instead of "
              "kv_indices (kdtree.kernels.runs) on each layout, its time / the indices path's and "
              "whether its output is the same bits",
              {"full": dict(LONG_CONTEXT, step_num_slots=1 << 19, layers=61, repeats=30)}),
        _gate("benefit", ["torch"], [("pd_handoff_speedup", ">=", 2.0, "x")],
              "a B=8 L=32k request's KV handed off as SGLang's PD disaggregation issues it (one "
              "transfer per contiguous run of source and destination slots per layer; destination a "
              "pinned host buffer on a GPU, host memory on the CPU fallback, noted in the record), "
              "fragmented / defragmented. Recorded, not gated: the host offload round trip by a "
              "gather, by one copy per run and the best of both on each side (a gather copies a "
              "fragmented request as fast as a contiguous one: contiguity buys offload nothing), "
              "the gather's staging memory and, on a GPU, the slowdown of a verify kernel on the main "
              "stream while either copy runs on a side stream; run-length metadata bytes, its runs -> "
              "kv_indices expansion and the full indices' upload per step",
              {"full": dict(LONG_CONTEXT, stores=4, repeats=10), "quick": dict(LONG_CONTEXT, num_slots=1 << 18, prompt_len=(8192, 8192), steps=60, stores=4, repeats=10)}),
    ],
)

# The targets (best in the field), by gate and figure: recorded, never blocking; set on the gates'
# `targets` field below.
TARGETS: dict[str, list[tuple[str, str, float]]] = {
    "integrity": [("kv_bytes_changed", "==", 0.0)],
    "token_exact": [("exact_fraction", ">=", 1.0)],
    "contiguity": [("run_reduction_tier01", ">=", 10.0), ("copy_traffic_fraction", "<=", 0.01),
                   ("alloc_cost_fraction_of_hbm_floor", "<", 0.02)],
    "no_slowdown": [("alloc_cost_fraction_of_step", "<", 0.02)],
}

SPEC = with_targets(SPEC, {gate: [Target(figure=f, op=op, value=v) for f, op, v in figures]
                           for gate, figures in TARGETS.items()})

# gate -> its check, "module:function", imported when the gate runs (kdtree.orchestrator.plan)
CHECKS = {
    "integrity": "kdtree.phases.phase4.checks:check_integrity",
    "token_exact": "kdtree.phases.phase4.checks:check_token_exact",
    "copy_budget": "kdtree.phases.phase4.checks:check_copy_budget",
    "contiguity": "kdtree.phases.phase4.checks:check_contiguity",
    "no_slowdown": "kdtree.phases.phase4.checks:check_no_slowdown",
    "benefit": "kdtree.phases.phase4.checks:check_benefit",
}
