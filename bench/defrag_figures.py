"""Phase 4's measurements: the churn workloads (`kdtree.bench.churn`, `kdtree.bench.spec_churn`)
run and measured, each returning the figures its gate holds and the details recorded beside them.

Every function takes the `GateContext` (seeds come from ``ctx.fresh_seed``, progress goes to
``ctx.progress``) and its workload's sizes as data (what the phase's spec says was measured);
those that take a relocator accept ``relocator_cls`` so the tests can hand them broken
relocations.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from typing import Any

import torch

from kdtree.bench.churn import ChurnConfig, ChurnRun, replay_on_sglang_model
from kdtree.bench.defrag_measure import (
    H200_HBM_BYTES_PER_S, churn_layouts, copy_out_and_back, expand_seconds, gather_out, gather_staging_bytes,
    main_stream_slowdown, median_seconds, pd_handoff, releasable_tail, request_runs_tensors, runs_out,
    upload_seconds, verify_step_hbm_bytes,
)
from kdtree.bench.spec_churn import Arrival, serve
from kdtree.bench.timing import gpu_cycles_per_s, make_timer, round_robin, sleep_cycles
from kdtree.engine import ModelConfig, build_model
from kdtree.engine.model.config import preset
from kdtree.engine.kv.relocation import Relocator
from kdtree.engine.kv.run_metadata import expand_runs, indices_metadata_bytes, runs_metadata_bytes
from kdtree.gates.base import GateContext
from kdtree.kernels import tree_verify_mla
from kdtree.kernels.cuda_op import launch
from kdtree.kernels.masks import pack_tree_masks
from kdtree.kernels.runs import runs_from_run_lists

KERNEL_HEADS, TREE_NODES = 16, 16  # DeepSeek-V3's 128 heads over TP8; a 16-node tree per request
STEP_LAYERS = 61  # DeepSeek-V3's layer count: the whole-step figure runs the kernel once per layer
TARGET_BATCH, TARGET_CONTEXT = 8, 32768


def _churn_config(ctx: GateContext, **kw):
    return ChurnConfig(**kw)


# -- integrity (the churn workload's KV, read through the maps, against a shadow) --------------------------------------------------------------------------------------
def integrity(ctx: GateContext, workload: dict, relocator_cls=None, trials: int = 2) -> tuple[dict, dict]:
    """Tier 0+1 churn with materialised target + draft stores, a prefix cache and pinned requests:
    after every relocation round, every live sequence's KV read through the maps == the shadow
    copy written with it, byte for byte, and no pinned slot moved or changed."""


    cfg = _churn_config(ctx, **workload, num_layers=2, draft_layers=1, device=ctx.device,
                        dtype=torch.bfloat16, prefix_cache_fraction=0.3, pin_fraction=0.25)
    totals = {"kv_bytes_changed": 0, "kv_slots_lost": 0, "pinned_slots_touched": 0, "rows_relocated": 0,
              "rounds_checked": 0, "sequences_checked": 0, "cache_nodes_moved": 0}
    errors: list[str] = []
    for _ in range(trials):
        run = ChurnRun(cfg, "tier0+1", ctx.fresh_seed(), relocator_cls=relocator_cls or Relocator,
                       integrity_every=1)
        ctx.progress("integrity churn", None)
        stats = run.stats
        for _ in range(cfg.steps):
            try:
                run.step()
            except ValueError as exc:
                # A candidate that lost a slot makes the workload's own bookkeeping fail later (a
                # double free); once a check has seen the loss that is the gate failing, not an error.
                if not any(c["kv_slots_lost"] or c["kv_bytes_changed"] for c in stats.integrity):
                    raise
                errors.append(f"{type(exc).__name__}: {exc}")
                break
        for check in stats.integrity:
            for k in ("kv_bytes_changed", "kv_slots_lost", "pinned_slots_touched", "sequences_checked"):
                totals[k] += check[k]
        totals["rounds_checked"] += len(stats.integrity)
        totals["rows_relocated"] += sum(r.rows_copied for r in stats.rounds)
        totals["cache_nodes_moved"] += sum(1 for r in stats.rounds for m in r.moves if m.set_index == 1)
    return totals, {"trials": trials, "steps": cfg.steps, "num_slots": cfg.num_slots, "workload_errors": errors}


# -- token_exact ------------------------------------------------------------------------------------
def token_exact(ctx: GateContext, requests: int, trials: int, relocator_cls=None) -> tuple[dict, dict]:
    """Speculative decoding (self-draft trees) of requests arriving at random steps: every
    request's tokens with defrag on (Tier 0 + relocation after every step) == with it off."""


    n_req = requests
    exact = total = rows = 0
    worst_round = budget = 0
    divergences = []
    for trial in range(trials):
        seed = ctx.fresh_seed()
        rng = random.Random(seed)
        model = build_model(ModelConfig(num_layers=2), seed=seed % 1000, device=ctx.device)
        arrivals = [Arrival(step=rng.randint(0, 12),
                            prompt=tuple(rng.randrange(model.config.vocab_size) for _ in range(rng.randint(8, 60))),
                            max_new_tokens=rng.randint(8, 40)) for _ in range(n_req)]
        slots = sum(len(a.prompt) + a.max_new_tokens + 16 for a in arrivals)
        kw = dict(pool_slots=slots, drafter="selfdraft", budget=6)
        ctx.progress(f"token_exact trial {trial}: defrag off", None)
        off = serve(model, arrivals, defrag=False, **kw)
        ctx.progress(f"token_exact trial {trial}: defrag on", None)
        on = serve(model, arrivals, defrag=True, relocator_cls=relocator_cls or Relocator, **kw)
        for i, (a, b) in enumerate(zip(off.tokens, on.tokens)):
            total += 1
            if a == b:
                exact += 1
            else:
                first = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                divergences.append({"trial": trial, "request": i, "first_divergence": first,
                                    "off": a[first:first + 4], "on": b[first:first + 4]})
        rows += on.rows_relocated
        worst_round, budget = max(worst_round, on.max_round_bytes), on.budget_bytes
    return ({"exact_fraction": exact / total, "rows_relocated": rows, "requests": total,
             "max_round_bytes": worst_round, "budget_bytes": budget}, {"divergences": divergences[:16]})


# -- copy_budget ------------------------------------------------------------------------------------
def copy_budget(ctx: GateContext, workload: dict, relocator_cls=None) -> tuple[dict, dict]:
    """Tier 0+1 churn at scale; the bytes each round really copies are counted at the pool's copy
    (not from the relocator's own report) and held against that round's budget."""

    cfg = _churn_config(ctx, **workload)
    run = ChurnRun(cfg, "tier0+1", ctx.fresh_seed(), relocator_cls=relocator_cls or Relocator)
    copied: list[int] = []
    real_copy = run.pool.copy_rows

    def counted(src, dst):
        copied[-1] += len(dst) * run.pool.bytes_per_slot
        real_copy(src, dst)

    run.pool.copy_rows = counted
    over, traffic = [], []
    ctx.progress("copy_budget churn", None)
    for _ in range(cfg.steps):
        copied.append(0)
        run.step()
        step_bytes = run.stats.step_kv_bytes[-1]
        budget = int(cfg.copy_budget_fraction * step_bytes / 2)  # the spec's, not the relocator's word
        over.append(copied[-1] / budget if budget else (float("inf") if copied[-1] else 0.0))
        traffic.append(2 * copied[-1] / step_bytes if step_bytes else 0.0)
    return {
        "max_step_copy_over_budget": max(over),
        "max_copy_traffic_fraction": max(traffic),
        "rows_relocated": sum(copied) // run.pool.bytes_per_slot,
        "mean_copy_traffic_fraction": statistics.fmean(traffic),
    }, {"steps": cfg.steps, "num_slots": cfg.num_slots, "live_requests": cfg.live_requests,
        "copy_budget_fraction": cfg.copy_budget_fraction}


# -- contiguity -------------------------------------------------------------------------------------
def contiguity(ctx: GateContext, workload: dict, alloc_cost_workload: dict, model_preset: str,
               relocator_cls=None) -> tuple[dict, dict]:
    """Runs per live request after the same churn workload, per allocator mode; also the host cost
    of the allocator per step and the free tail each mode leaves (benefit 3c)."""

    cfg = _churn_config(ctx, **workload)
    seed = ctx.fresh_seed()
    figures: dict[str, float] = {}
    rows = {}
    for mode in ("unsorted", "sglang_sorted", "tier0", "tier0+1"):
        ctx.progress(f"contiguity churn: {mode}", None)
        run = ChurnRun(cfg, mode, seed, relocator_cls=relocator_cls or Relocator, trace=mode == "unsorted")
        stats = run.run()
        name = mode.replace("+", "")
        if mode == "unsorted":
            ctx.progress("contiguity: SGLang's allocator replayed", None)
            sglang = replay_on_sglang_model(run.pool.allocator.trace, cfg.num_slots, ctx.device)
            figures["alloc_us_per_step_sglang_model"] = 1e6 * statistics.median(sglang)
            run.pool.allocator.trace = None
        figures[f"runs_per_request_{name}"] = stats.runs_per_request(run.pool)
        figures[f"allocator_us_per_step_{name}"] = 1e6 * statistics.median(stats.allocator_seconds)
        figures[f"alloc_us_per_step_{name}"] = 1e6 * statistics.median(stats.alloc_seconds)
        figures[f"free_tail_fraction_{name}"] = releasable_tail(run) / cfg.num_slots
        if stats.relocation_seconds:
            figures["relocation_plan_us_per_step"] = 1e6 * statistics.median(stats.relocation_seconds)
            figures["copy_traffic_fraction"] = max(
                2 * r.bytes_copied / b for r, b in zip(stats.rounds, stats.step_kv_bytes) if b)
        rows[mode] = {"finished": stats.finished, "live": len(run.pool.requests),
                      "used_slots": cfg.num_slots - run.pool.num_free}
    base = figures["runs_per_request_unsorted"]
    figures["run_reduction_tier01"] = base / figures["runs_per_request_tier01"]
    figures["run_reduction_tier0"] = base / figures["runs_per_request_tier0"]
    figures["run_reduction_sglang_sorted"] = base / figures["runs_per_request_sglang_sorted"]
    figures.update(_allocator_cost_b8(ctx, seed, alloc_cost_workload, model_preset))
    return figures, {
        "modes": rows, "steps": cfg.steps, "num_slots": cfg.num_slots, "live_requests": cfg.live_requests,
        "allocator_us": "allocator calls alone (alloc, free) per step, host wall time; alloc_us adds the "
                        "req_to_token bookkeeping; the SGLang model replays the unsorted run's calls on "
                        f"{ctx.device} (on a CPU its torch.cat copies the 8 MB free list on the host)"}


def _allocator_cost_b8(ctx: GateContext, seed: int, lc: dict, model_preset: str) -> dict[str, float]:
    """The allocator's host cost per step at B=8, L=32k (the plan's target: under 2 % of a verify
    step there), against the verify step's HBM floor (bytes of the dsv3-tp8 preset / 4.3 TB/s)."""

    cfg = _churn_config(ctx, **lc)
    out = {}
    for mode in ("unsorted", "tier0+1"):
        ctx.progress(f"allocator cost at B=8: {mode}", None)
        run = ChurnRun(cfg, mode, seed, trace=mode == "unsorted")
        stats = run.run()
        out[f"allocator_us_per_step_b8_{mode.replace('+', '')}"] = 1e6 * statistics.median(stats.allocator_seconds)
        # the mean carries the steps that admit a 32k prompt or release a finished request
        out[f"allocator_us_per_step_b8_{mode.replace('+', '')}_mean"] = 1e6 * statistics.mean(stats.allocator_seconds)
        if mode == "unsorted":
            out["allocator_us_per_step_b8_sglang_model"] = 1e6 * statistics.median(
                replay_on_sglang_model(run.pool.allocator.trace, cfg.num_slots, ctx.device))
    floor_ms = _verify_step_floor_ms(TARGET_CONTEXT, model_preset)
    out["verify_step_ms_hbm_floor"] = floor_ms
    out["alloc_cost_fraction_of_hbm_floor"] = out["allocator_us_per_step_b8_tier01"] / 1e3 / floor_ms
    return out


def _verify_step_floor_ms(context: int, model_preset: str) -> float:
    """HBM floor of one dsv3-tp8 verify step at B=8 (`defrag_measure.verify_step_hbm_bytes`), ms
    (on every device: it is the target's step, whatever the workload measured)."""

    hbm = verify_step_hbm_bytes(preset(model_preset), TARGET_BATCH, context, TREE_NODES)
    return hbm["total_bytes"] / H200_HBM_BYTES_PER_S * 1e3


# -- no_slowdown (GPU) ------------------------------------------------------------------------------
def _verify_inputs(pool_tensor, run_lists, q, masks, device):
    """Op-contract inputs for requests given as (start, length) runs in token order: the runs go
    to the device (a few bytes) and are expanded there; each request's last TREE_NODES tokens
    are its tree."""



    flat = [r for runs in run_lists for r in runs]
    lens = [sum(n for _, n in runs) for runs in run_lists]
    host = torch.tensor([[s for s, _ in flat], [n for _, n in flat]], dtype=torch.int32)
    starts, run_lens = host.to(device, non_blocking=True)
    kv_indices = expand_runs(starts, run_lens, sum(lens))
    T = TREE_NODES
    qo = torch.arange(0, T * (len(run_lists) + 1), T, dtype=torch.int32)
    kvp = torch.zeros(len(lens) + 1, dtype=torch.int32)
    kvp[1:] = torch.tensor(lens).cumsum(0)
    return dict(q=q, kv_cache=pool_tensor, qo_indptr=qo.to(device), kv_indptr=kvp.to(device),
                kv_indices=kv_indices, tree_mask=masks, sm_scale=1.0 / math.sqrt(192.0))


def _call(fn, case, out=None):
    return fn(case["q"], case["kv_cache"], case["qo_indptr"], case["kv_indptr"], case["kv_indices"],
              case["tree_mask"], case["sm_scale"], out=out)


def no_slowdown(ctx: GateContext, long_context: dict, model_preset: str, kernel_fn=None, layers: int = STEP_LAYERS,
                repeats: int = 30) -> tuple[dict, dict]:
    """(1) The phase-1 kernel on the same requests' KV laid out by the unsorted allocator vs by Tier
    0+1 after the same churn (outputs must agree), GPU time interleaved. (2) A whole verify step —
    allocator and bookkeeping, metadata upload, the kernel once per layer over `layers` stores,
    and (defrag on) the relocation round, whose planning overlaps the queued kernels — with defrag
    on vs off, wall time to completion, interleaved step by step."""


    if kernel_fn is None:
        kernel_fn = _owned_kernel()
    device = torch.device(ctx.device)
    lc = dict(long_context)
    step_slots = lc.pop("step_num_slots", 1 << 19)  # 61 stores of 2^19 slots: 37 GB per mode
    seed = ctx.fresh_seed()
    gen = torch.Generator().manual_seed(seed)

    # (1) kernel on the two layouts
    ctx.progress("no_slowdown: churn layouts", None)
    runs = churn_layouts(_churn_config(ctx, **lc), seed, ("unsorted", "tier0+1"), trace_unsorted=True)
    sglang_steps = replay_on_sglang_model(runs["unsorted"].pool.allocator.trace, lc["num_slots"], str(device))
    live = sorted(runs["unsorted"].pool.requests.keys())
    if not live:
        raise ValueError(f"no_slowdown: the churn workload ended with no live request, so there is nothing to "
                         f"time (seed {seed}); give it longer requests (new_tokens) or fewer steps")
    layouts = {m: [r.pool.requests.slots(k) for k in live] for m, r in runs.items()}
    S = lc["num_slots"]
    pools = {m: torch.zeros(S, 576, dtype=torch.bfloat16, device=device) for m in layouts}
    for b, rid in enumerate(live):
        content = (torch.randn(len(layouts["unsorted"][b]), 576, generator=gen) * 0.5).to(torch.bfloat16).to(device)
        for m in layouts:
            pools[m][torch.tensor(layouts[m][b], device=device, dtype=torch.long)] = content
    q = torch.randn(TREE_NODES * len(live), KERNEL_HEADS, 576, generator=gen).to(torch.bfloat16).to(device)
    masks = pack_tree_masks([[-1] + list(range(TREE_NODES - 1))] * len(live)).to(device)
    run_lists = {m: [r.pool.requests.runs(k) for k in live] for m, r in runs.items()}
    cases = {m: _verify_inputs(pools[m], run_lists[m], q, masks, device) for m in layouts}
    outs = {m: _call(kernel_fn, c) for m, c in cases.items()}
    agree = float((outs["unsorted"].float() - outs["tier0+1"].float()).abs().max())
    calls = {m: (lambda c=c: _call(kernel_fn, c)) for m, c in cases.items()}
    # the owned kernel reading (first slot, first key) runs instead of kv_indices, on
    # each layout: its output must be the indices path's, bit for bit
    runs_paths = kernel_fn is _owned_kernel() and device.type == "cuda"
    runs_identical = 1.0
    if runs_paths:
        for m, c in cases.items():
            kv_runs = runs_from_run_lists(run_lists[m], device)
            args = (c["q"], c["kv_cache"], c["qo_indptr"], c["kv_indptr"], None, c["tree_mask"], c["sm_scale"])
            out_runs = torch.full_like(outs[m], float("nan"))
            launch(*args, out=out_runs, kv_runs=kv_runs)
            runs_identical = min(runs_identical, float(torch.equal(out_runs, outs[m])))
            calls[f"{m} runs"] = lambda a=args, r=kv_runs, o=out_runs: launch(*a, out=o, kv_runs=r)
    timer = make_timer(device)
    times = round_robin({m: (lambda i, call=call: call()) for m, call in calls.items()}, repeats=repeats, timer=timer)
    kernel_ratio = statistics.median(times["tier0+1"]) / statistics.median(times["unsorted"])
    runs_figures = {}
    if runs_paths:
        for m, name in (("unsorted", "fragmented"), ("tier0+1", "defragmented")):
            runs_figures[f"runs_kernel_time_ratio_{name}"] = (statistics.median(times[f"{m} runs"])
                                                              / statistics.median(times[m]))
            runs_figures[f"runs_kernel_ms_{name}"] = statistics.median(times[f"{m} runs"]) * 1e3
        runs_figures["runs_kernel_outputs_identical"] = runs_identical
    runs_per_req = {m: sum(r.pool.requests.num_runs(k) for k in live) / len(live) for m, r in runs.items()}
    del pools, cases, outs, runs, calls

    # (2) the whole step, defrag on vs off, interleaved
    ctx.progress("no_slowdown: whole steps", None)
    step_cfg = _churn_config(ctx, **{**lc, "num_slots": step_slots},
                             num_layers=layers, device=str(device), write_rows=False)
    on, off = ChurnRun(step_cfg, "tier0+1", seed), ChurnRun(step_cfg, "unsorted", seed)
    step_times = {"on": [], "off": []}
    warm = max(1, step_cfg.steps // 3)
    for i in range(step_cfg.steps):
        for name, run in (("off", off), ("on", on)):
            seconds = _timed_step(run, kernel_fn, q, masks, device)
            if i >= warm:
                step_times[name].append(seconds)
    t_on, t_off = statistics.median(step_times["on"]), statistics.median(step_times["off"])
    alloc_on = statistics.median(on.stats.alloc_seconds[warm:])
    allocator_on = statistics.median(on.stats.allocator_seconds[warm:])
    # The target's denominator: a dsv3-tp8 verify step at B=8, L=32k on this device, estimated as
    # its layers x this run's kernel time plus its weights' HBM floor (the rest of the step).

    preset_cfg = preset(model_preset)
    hbm = verify_step_hbm_bytes(preset_cfg, len(live), lc["prompt_len"][1], TREE_NODES)
    step_estimate = (preset_cfg.num_layers * statistics.median(times["unsorted"])
                     + hbm["weight_bytes"] / H200_HBM_BYTES_PER_S)
    plan = statistics.median(on.stats.relocation_seconds[warm:]) if on.stats.relocation_seconds else 0.0
    copy_fraction = max((2 * r.bytes_copied / b for r, b in zip(on.stats.rounds, on.stats.step_kv_bytes) if b),
                        default=0.0)
    return {
        "kernel_time_ratio": kernel_ratio,
        "step_time_ratio": t_on / t_off,
        "kernel_outputs_max_abs_diff": agree,
        "alloc_cost_fraction_of_step": allocator_on / step_estimate,
        "alloc_cost_fraction_of_hbm_floor": allocator_on / (hbm["total_bytes"] / H200_HBM_BYTES_PER_S),
        "alloc_cost_fraction_of_timed_step": alloc_on / t_off,
        "verify_step_ms_estimate": step_estimate * 1e3,
        "verify_step_ms_hbm_floor": hbm["total_bytes"] / H200_HBM_BYTES_PER_S * 1e3,
        "allocator_us_per_step_tier01": allocator_on * 1e6,
        "allocator_us_per_step_unsorted": statistics.median(off.stats.allocator_seconds[warm:]) * 1e6,
        "alloc_us_per_step_tier01": alloc_on * 1e6,
        "alloc_us_per_step_unsorted": statistics.median(off.stats.alloc_seconds[warm:]) * 1e6,
        "alloc_us_per_step_sglang_model": statistics.median(sglang_steps) * 1e6,
        "relocation_plan_us_per_step": plan * 1e6,
        "step_ms_defrag_on": t_on * 1e3, "step_ms_defrag_off": t_off * 1e3,
        "kernel_ms_defragmented": statistics.median(times["tier0+1"]) * 1e3,
        "kernel_ms_fragmented": statistics.median(times["unsorted"]) * 1e3,
        "runs_per_request_fragmented": runs_per_req["unsorted"],
        "runs_per_request_defragmented": runs_per_req["tier0+1"],
        "copy_traffic_fraction": copy_fraction,
        "runs_kernel_measured": 1.0 if runs_paths else 0.0,
        **runs_figures,
    }, {"layers": layers, "heads": KERNEL_HEADS, "tree_nodes": TREE_NODES,
                     "alloc_cost_fraction_of_step": f"allocator calls alone (Tier 0+1, median per step) / "
                     f"{model_preset} verify step = {preset_cfg.num_layers} layers x kernel_ms_fragmented "
                     "+ the preset's weight bytes / 4.3 TB/s; _of_hbm_floor: / every byte (KV + weights) / "
                     "4.3 TB/s; _of_timed_step: allocator + maps / this gate's 61-layer step",
                     "long_context": {k: list(v) if isinstance(v, tuple) else v for k, v in lc.items()},
                     "timer": getattr(timer, "label", "perf_counter")}


def _owned_kernel():
    return tree_verify_mla


def _timed_step(run, kernel_fn, q, masks, device) -> float:
    """Wall seconds of one step of `run` with the kernel once per store over its live requests."""

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    run.step(relocate=False)
    live = run.pool.requests.keys()[:q.shape[0] // TREE_NODES]
    run_lists = [run.pool.requests.runs(k) for k in live]  # kept incrementally: no O(L) host work
    if len(run_lists) * TREE_NODES == q.shape[0]:
        case = _verify_inputs(run.pool.kv[0], run_lists, q, masks, device)
        out = torch.empty(q.shape[0], q.shape[1], 512, dtype=q.dtype, device=device)
        for store in run.pool.kv:
            case["kv_cache"] = store
            _call(kernel_fn, case, out=out)
    run.relocate()  # host planning overlaps the queued kernels; its copies queue after them
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


# -- benefit ----------------------------------------------------------------------------------------
def benefit(ctx: GateContext, long_context: dict, stores: int = 4, repeats: int = 10,
            defrag_mode: str = "tier0+1") -> tuple[dict, dict]:
    """What contiguity buys, from B=8 L=32k requests after churn, fragmented (unsorted) vs
    defragmented (`defrag_mode`, Tier 0+1; the tests hand it a mode that does not defragment):
    (b) the hand-off of a request's KV as SGLang's PD disaggregation issues it — one transfer per
    contiguous run per layer — (the gated figure), and the host offload round trip by a gather,
    by one copy per run and the best of both; (a) the run-length metadata's bytes and its
    runs -> kv_indices expansion per verify step."""


    device = torch.device(ctx.device)
    lc = dict(long_context)
    seed = ctx.fresh_seed()
    ctx.progress("benefit: churn layouts", None)
    modes = {"fragmented": "unsorted", "defragmented": defrag_mode}
    runs = churn_layouts(_churn_config(ctx, **lc), seed, tuple(dict.fromkeys(modes.values())))
    live = sorted(runs["unsorted"].pool.requests.keys())
    layouts = {name: [runs[m].pool.requests.slots(k) for k in live] for name, m in modes.items()}
    n_stores = stores if device.type == "cuda" else 1
    pool = [torch.zeros(lc["num_slots"], 576, dtype=torch.bfloat16, device=device) for _ in range(n_stores)]
    figures: dict[str, Any] = {}
    # the gated figure: the hand-off as SGLang's PD disaggregation issues it, one transfer per
    # contiguous run of (source, destination) slots per layer, one way; the one-way gather beside it
    for name in modes:
        ctx.progress(f"benefit: PD hand-off, {name}", None)
        seconds, transfers = pd_handoff(pool, layouts[name][0], repeats)
        figures[f"pd_handoff_ms_{name}"] = seconds * 1e3
        figures[f"pd_transfers_per_layer_{name}"] = transfers
        figures[f"gather_out_ms_{name}"] = median_seconds(gather_out(pool, layouts[name][0]), device, repeats) * 1e3
    figures = {"pd_handoff_speedup": figures["pd_handoff_ms_fragmented"] / figures["pd_handoff_ms_defragmented"],
               **figures}
    figures["pd_handoff_defragmented_vs_gather"] = (figures["pd_handoff_ms_defragmented"]
                                                    / figures["gather_out_ms_defragmented"])
    # the host offload round trip (HiCache-style), each method and the best of both on each side
    t = {}
    for name in modes:
        for method in ("gather", "runs"):
            ctx.progress(f"benefit: round trip, {name} {method}", None)
            t[f"{name}_{method}"] = copy_out_and_back(pool, layouts[name][0], method, repeats)
    frag = min(t["fragmented_gather"], t["fragmented_runs"])
    defrag = min(t["defragmented_gather"], t["defragmented_runs"])
    request_bytes = len(layouts["fragmented"][0]) * 1152 * n_stores
    figures.update({
        "round_trip_speedup_best_of": frag / defrag,
        "round_trip_speedup_per_run_copies": t["fragmented_runs"] / t["defragmented_runs"],
        "round_trip_speedup_gather": t["fragmented_gather"] / t["defragmented_gather"],
        "round_trip_GBps_defragmented": 2 * request_bytes / defrag / 1e9,
        "round_trip_GBps_fragmented": 2 * request_bytes / frag / 1e9,
        "measured_on_gpu": 1.0 if device.type == "cuda" else 0.0,
    })
    figures.update({f"round_trip_ms_{k}": v * 1e3 for k, v in t.items()})
    # what the gather costs that per-run copies do not: staging memory, and the main stream's
    # slowdown while the copy runs on a side stream
    tokens0 = len(layouts["fragmented"][0])
    staging = gather_staging_bytes(tokens0, 1152, STEP_LAYERS)
    figures["gather_staging_MB_per_layer"] = staging["per_layer"] / 1e6
    figures[f"gather_staging_GB_{STEP_LAYERS}_layers"] = staging["all_layers"] / 1e9
    figures["interference_measured"] = 1.0 if device.type == "cuda" else 0.0
    if device.type == "cuda":
        figures.update(_interference(pool, layouts, runs[defrag_mode], live, device, seed))
    del pool
    tokens = sum(len(s) for s in layouts["fragmented"])
    for name in modes:
        starts, lens, total = request_runs_tensors(layouts[name], device)
        figures[f"metadata_runs_bytes_{name}"] = runs_metadata_bytes(int(starts.numel()), len(live))
        figures[f"runs_expand_us_{name}"] = expand_seconds(starts, lens, total) * 1e6
        figures[f"runs_per_request_{name}"] = starts.numel() / len(live)
    figures["metadata_indices_bytes"] = indices_metadata_bytes(tokens, len(live))
    # What the runs would save: uploading the whole kv_indices each step. The engine does not do
    # that: its SlotMirror keeps request prefixes on the device and uploads only the new slots.
    figures["indices_upload_us"] = upload_seconds(layouts["fragmented"], device) * 1e6
    figures["indices_new_slots_bytes_per_step"] = 4 * TREE_NODES * len(live)
    figures["metadata_bytes_ratio_defragmented"] = (figures["metadata_indices_bytes"]
                                                    / figures["metadata_runs_bytes_defragmented"])
    return figures, {
        "request_tokens": tokens0, "stores": n_stores, "batch": len(live), "defrag_mode": defrag_mode,
        "fallback": None if device.type == "cuda" else
        "CPU: host memory to host memory, not pinned; the honest figure needs the GPU (D2H over PCIe); "
        "the main stream's slowdown under a concurrent copy is not measured on a CPU",
        "pd_handoff": "SGLang's PD transfer: (src, dst) slot pairs grouped where both are contiguous "
                      "(sglang/srt/disaggregation/common/utils.py group_concurrent_contiguous), one transfer "
                      "per group per layer (mooncake/conn.py); destination a contiguous pinned host buffer",
        "gated_figure": "pd_handoff_speedup: the hand-off as SGLang's PD disaggregation issues it; the host "
                        "offload round trip (round_trip_speedup_best_of: a gather where it is faster) is "
                        "recorded, not gated: a gather copies a fragmented request as fast as a contiguous one"}


def _interference(pool, layouts, defragmented_run, live, device, seed) -> dict[str, float]:
    """The main stream's slowdown while one request's KV (every store) is copied out on a side
    stream: the phase-1 kernel on the B=8 requests (one layer) against each copy method."""


    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(TREE_NODES * len(live), KERNEL_HEADS, 576, generator=gen).to(torch.bfloat16).to(device)
    masks = pack_tree_masks([[-1] + list(range(TREE_NODES - 1))] * len(live)).to(device)
    case = _verify_inputs(pool[0], [defragmented_run.pool.requests.runs(k) for k in live], q, masks, device)
    out = torch.empty(q.shape[0], q.shape[1], 512, dtype=q.dtype, device=device)

    def kernel() -> None:
        _call(tree_verify_mla, case, out=out)

    figures = {}
    for name in ("fragmented", "defragmented"):
        for method, make in (("gather", gather_out), ("runs", runs_out)):
            r = main_stream_slowdown(kernel, make(pool, layouts[name][0]), device,
                                     lambda s: sleep_cycles(s, gpu_cycles_per_s(device)))
            figures[f"main_stream_slowdown_{method}_{name}"] = r["slowdown"]
            figures[f"copy_out_ms_{method}_{name}_alone"] = r["copy_ms_alone"]
    figures["main_kernel_ms"] = r["main_ms_alone"] / r["main_calls"]
    return figures
