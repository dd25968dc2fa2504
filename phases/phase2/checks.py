"""Phase 2's work: what each gate of `kdtree.phases.phase2.spec.SPEC` runs, bound to this project.

Every check takes (spec, ctx) and returns the GateResult of a generic mechanism of
`kdtree.gates`, fed with the engine (`kdtree.engine`), the SGLang backend
(`kdtree.integrations.sglang`) and the kernels. The orchestrator imports this module only when a
gate runs. Parameters after ``ctx`` exist for the
tests (small sizes, the CPU, broken candidates); the phase runs the defaults.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from typing import Any, Optional

import torch

from kdtree.bench.sglang_batches import make_verify_batch
from kdtree.bench.sglang_verify import converter_fraction, kdtree_sglang_verify, sglang_extend_attention, sglang_triton_verify
from kdtree.bench.speed import SpeedConfig, measure_speedup, speed_protocol
from kdtree.bench.timing import make_timer
from kdtree.bench.token_probe import decoy_step
from kdtree.bench.verify_step import VerifySetup, step_breakdown, token_exact_prompts
from kdtree.engine import generate
from kdtree.engine.decode import backends
from kdtree.gates import accuracy as accuracy_gate, token_exact as token_exact_gate
from kdtree.gates.accuracy import AccuracyCase
from kdtree.gates.base import Figure, GateContext, GateResult, Outcome, verdict
from kdtree.gates.metric import check_metric
from kdtree.gates.speedup import judge_speedup
from kdtree.gates.token_exact import Stream
from kdtree.integrations.sglang.converter import VerifyConverter
from kdtree.kernels import tree_verify_mla
from kdtree.phases.models import SPEED_PRESET, release_device_memory, shared_model

LONG_PROMPT_TOKENS = 32768  # token_exact: prompts at least this long are part of every run
VERIFY_CONTEXTS = (4096, 32768, 131072)
VERIFY_BATCH = 2
TREE_BUDGET = 64
DECODE_RUNS = ((32768, 2), (131072, 1))  # (context, batch) of decode_speedup
DECODE_NEW_TOKENS = 64
DECODE_ROUNDS = 5
# No round starts past this (the rounds run are kept; rounds_per_arm says whether enough ran), so a
# slow machine ends the gate with a record instead of being killed by the device call's limit.
DECODE_TIME_BUDGET_S = 300.0
# verify_speedup times the step's GPU time: each step is queued behind a GPU busy-wait this long,
# longer than the eager step's host time (plans/0002, phase 2, gives it for dsv3-tp8's 8 layers),
# so the Python enqueue of ~270 launches stays out of the figure, as in a CUDA-graph replay.
STEP_LEAD_S = 0.03

# The sm_120 path (`sm120`: the variant compute capability 12.0 dispatches, forced) as an
# engine backend: verify_speedup and decode_speedup report it beside the default dispatch (figures
# sm120_path_*); the thresholds and targets hold the default dispatch.
SM120_BACKEND = "kernel-sm120-path"
SM120 = "sm120_path"

def sm120_backend() -> str:
    """Register (once) and name the engine backend whose every op call takes the sm_120 path."""

    if SM120_BACKEND not in backends.known_backends():
        backends.register_backend(SM120_BACKEND, lambda: backends.OpBackend(
            SM120_BACKEND, "kdtree.bench.forced", "sm120_path"))
    return SM120_BACKEND


def _hold(result: GateResult, figure: Figure, failure: str) -> GateResult:
    """Add a thresholded figure to a result; a miss turns a pass into a failure saying why."""
    result.figures.append(figure)
    if figure.ok is False and result.outcome is Outcome.PASSED:
        result.outcome = Outcome.FAILED
        result.summary = failure + "; " + result.summary
    return result


# -- token_exact ---------------------------------------------------------------------------------
def check_token_exact(spec, ctx: GateContext, backend: str = "kernel", device: str = "cuda",
                      preset_name: str = "tiny-long", long_len: int = LONG_PROMPT_TOKENS, long_prompts: int = 2,
                      drafters=(("ddtree", 64), ("ngram", 16))) -> GateResult:
    """Tree speculative decoding on `backend` vs plain greedy decoding on the oracle backend."""
    model = shared_model(preset_name, device)
    prompts = token_exact_prompts(spec.min_prompts, long_prompts, long_len, model.config.vocab_size,
                                  ctx.fresh_seed())
    ctx.progress(f"greedy decoding on the reference backend ({len(prompts)} prompts, longest "
                 f"{max(map(len, prompts))})", 0.05)
    ref = generate(prompts, model=model, drafter="none", backend="reference", max_new_tokens=spec.max_new_tokens,
                   record_margins=True)
    streams, details = [], {"prompt_lens": [len(p) for p in prompts], "backend": backend}
    for k, (drafter, budget) in enumerate(drafters):
        ctx.progress(f"tree speculative decoding ({drafter}, budget {budget}) on {backend}", 0.5 + 0.25 * k)
        cand = generate(prompts, model=model, drafter=drafter, budget=budget, backend=backend,
                        max_new_tokens=spec.max_new_tokens)
        details[f"{drafter}_mean_accepted"] = cand.mean_accepted
        details[f"{drafter}_decode_tokens_per_s"] = cand.decode_tokens_per_s
        streams += [Stream(f"p{i}", drafter, c, r, margins, runner_up) for i, (c, r, margins, runner_up)
                    in enumerate(zip(cand.tokens, ref.tokens, ref.margins, ref.runner_up))]
    streams += _decoy_streams(model, backend, prompts, ref.tokens, spec.max_new_tokens, ctx, details)
    result = token_exact_gate.check_token_exact(spec, streams, ctx)
    result.details.update(details)
    longest = max(map(len, prompts))
    return _hold(result, Figure(name="longest_prompt", value=longest, unit=" tokens", op=">=", threshold=long_len),
                 f"the longest prompt has {longest} tokens, the gate needs one of at least {long_len}")


def _decoy_streams(model, backend: str, prompts, greedy, max_new_tokens: int, ctx: GateContext,
                   details: dict, count: int = 4) -> list:
    """One verify step on decoy trees (`kdtree.bench.token_probe.decoy_step`: the greedy path hidden
    behind branches that only a wrong tree mask lets through) for the short prompts, on `backend`
    and on the reference over the same KV: drafted trees alone leave margins too wide for a leaky
    mask to change tokens reliably."""

    path = min(12, max_new_tokens - 1)
    picked = [i for i, p in enumerate(prompts) if len(p) <= 64 and len(greedy[i]) > path][:count]
    if path < 2 or not picked:
        details["decoy"] = "not run: no short prompt with a long enough greedy continuation"
        return []
    ctx.progress(f"decoy verify step on {backend}", 0.95)
    tree_seed = ctx.fresh_seed()
    chosen, paths = [prompts[i] for i in picked], [greedy[i] for i in picked]
    ref_step, pool = decoy_step(model, "reference", chosen, paths, path, tree_seed)
    cand_step, _ = decoy_step(model, backend, chosen, paths, path, tree_seed, pool=pool)
    details["decoy_reference_emitted"] = ref_step.emitted
    return [Stream(f"p{i}", "decoy", c, r) for i, c, r in zip(picked, cand_step.tokens, ref_step.tokens)]


# -- sglang_parity -------------------------------------------------------------------------------
PARITY_CASES = [  # (name, H, prefix lens, tree size, tree kind, mask dtype, qo dtype, ancestor-closed, padded)
    ("H16 N64 B2 random", 16, "random2", 64, "random", "bool", "int32", True, 0),
    ("H16 N8 B4 chain", 16, "random4", 8, "chain", "uint8", "int64", True, 0),
    ("H128 N16 B1 star", 128, "random1", 16, "star", "bool", "int32", True, 0),
    ("H16 N32 B3 not-closed", 16, "random3", 32, "random", "bool", "int64", False, 0),
    ("H16 N16 B2 padded", 16, "random2", 16, "random", "uint8", "int64", True, 2),
    ("H16 N64 B1 L32k", 16, "long1", 64, "random", "bool", "int32", True, 0),
]


def _out_like(q):
    return torch.empty(q.shape[0], q.shape[1], 512, dtype=q.dtype, device=q.device)


def _prefix_lens(spec_name: str, rng: random.Random) -> list[int]:
    count = int(spec_name[-1])
    if spec_name.startswith("long"):
        return [32768 + rng.randrange(4096) for _ in range(count)]
    return [rng.choice([0, 1, rng.randrange(2, 5000)]) for _ in range(count)]


def check_sglang_parity(spec, ctx: GateContext, reference=None, candidate_op=None, device: str = "cuda",
                        cases=PARITY_CASES) -> GateResult:
    """The SGLang backend's verify path vs SGLang's real Triton kernel, on SGLang-format inputs with
    fresh random trees and lengths every trial. `reference(fx) -> out` replaces SGLang's kernel
    (the CPU tests use the fp64 layout oracle); `candidate_op` replaces the CUDA kernel."""
    release_device_memory()
    loaded = "a reference passed in"
    if reference is None:
        try:
            extend, loaded = sglang_extend_attention()
        except Exception as err:  # noqa: BLE001 - any import failure means SGLang is not usable here
            return GateResult(gate=spec.name, kind=spec.kind, outcome=Outcome.SKIPPED,
                              reason=f"SGLang's extend_attention_fwd cannot be imported: {type(err).__name__}: {err}",
                              summary="skipped: sglang 0.5.23 is not importable on this machine")
        reference = lambda fx: sglang_triton_verify(fx, extend)  # noqa: E731
    if candidate_op is None:
        candidate_op = tree_verify_mla
    dtypes = {"bool": torch.bool, "uint8": torch.uint8, "int32": torch.int32, "int64": torch.int64}
    converter = VerifyConverter(8, 8 * 128, 128, 8 * 40000, device)

    def real(fx, t):  # graph-padding rows are checked for finiteness only: their keys are SGLang's dummies
        return t[: fx["real_requests"] * fx["num_draft_tokens"]]

    def case(name, H, lens_kind, N, kind, mask, qo, closed, padded):
        def make_inputs(seed, dev):
            lens = _prefix_lens(lens_kind, random.Random(seed))
            fx = make_verify_batch(H, lens, N, seed, device=dev, mask_dtype=dtypes[mask], qo_dtype=dtypes[qo],
                                   kind=kind, ancestor_closed=closed, padded=padded)
            fx["pool_for_reference"] = fx["pool"].clone()
            fx["pool_for_reference"][fx["out_cache_loc"]] = fx["k_extend"]  # SGLang saves the KV first too
            return fx

        return AccuracyCase(
            name=name, make_inputs=make_inputs,
            params={"H": H, "N": N, "tree": kind, "mask": mask, "qo_indptr": qo, "ancestor_closed": closed,
                    "padded_requests": padded},
            make_outputs=lambda fx: {"out": real(fx, _out_like(fx["q"]))})

    def oracle(fx):
        return {"out": real(fx, reference(dict(fx, pool=fx["pool_for_reference"])))}

    def candidate(fx, outs):
        full = _out_like(fx["q"])
        rows = outs["out"].shape[0]
        full[:rows] = outs["out"]  # the gate's poison: a row the backend leaves unwritten stays poisoned
        full[rows:] = float("nan")
        kdtree_sglang_verify(fx, converter, candidate_op, full)
        result = real(fx, full).clone()
        if not torch.isfinite(full[rows:].float()).all():
            result[:] = float("nan")  # non-finite padded rows fail the case
        outs["out"].copy_(result)

    result = accuracy_gate.check_accuracy(spec, [case(*c) for c in cases], candidate, oracle, ctx)
    result.details["sglang_kernel_loaded_from"] = loaded
    return result


# -- verify_speedup ------------------------------------------------------------------------------


def check_verify_speedup(spec, ctx: GateContext, preset_name: str = SPEED_PRESET, contexts=VERIFY_CONTEXTS,
                         batch: int = VERIFY_BATCH, budget: int = TREE_BUDGET, device: str = "cuda",
                         backends=("kernel", "triton"), with_converter: bool = True,
                         sm120: Optional[str] = "default") -> GateResult:
    """A whole verify step of the model (all layers' attention plus the rest), kernel backend vs
    Triton backend, interleaved in one process, at each context; step time broken down per backend.
    ``sm120`` names the backend of the sm_120 path, timed in the same rounds and reported as
    ``sm120_path_*`` ("default": `sm120_backend()`; None: not timed)."""
    model = shared_model(preset_name, device)
    cand_name, base_name = backends
    sm120_name = sm120_backend() if sm120 == "default" else sm120
    runners = tuple(backends) + ((sm120_name,) if sm120_name else ())
    others = {SM120: lambda s: s.step(sm120_name)} if sm120_name else None
    setups: dict[int, VerifySetup] = {}

    def make(context):
        def inputs(seed, dev):
            setups.pop(context, None)
            setups.clear()  # one pool at a time
            setups[context] = VerifySetup(model, context, batch, budget, seed, runners)
            return setups[context]
        return SpeedConfig(name=f"L{context_label(context)} B{batch} T{budget}", make_inputs=inputs,
                           refresh=lambda setup, seed: setup.refresh(seed),
                           params={"L": context, "B": batch, "T": budget, "H": model.config.num_heads,
                                   "layers": model.config.num_layers, "preset": preset_name})

    breakdown: dict[str, Any] = {}
    results = []

    def after_each(context: int, setup: VerifySetup):
        breakdown[context_label(context)] = {name: step_breakdown(setup, name, repeats=5) for name in backends}

    configs = [make(c) for c in contexts]
    for cfg in configs:  # one config per measurement: its pool is freed before the next
        ctx.progress(f"verify step {cfg.name}", None)
        timer = make_timer(device, cold_l2=False, lead_s=STEP_LEAD_S)
        measured = measure_speedup([cfg], lambda s: s.step(cand_name), lambda s: s.step(base_name), ctx,
                                   **speed_protocol(spec), timer=timer, others=others)
        res = judge_speedup(spec, measured, ctx)
        if setups:
            after_each(cfg.params["L"], next(iter(setups.values())))
        results.append(res)
        setups.clear()
    rows = [row for r in results for row in r.details.get("configs", [])]
    return _merge_speedups(spec, ctx, rows, results, breakdown, with_converter, contexts, device)


def _merge_speedups(spec, ctx, rows, results, breakdown, with_converter, contexts, device) -> GateResult:
    """One verdict over the per-config runs, with the step breakdown and the converter's share."""

    errors = [r for r in results if r.outcome is Outcome.ERROR]
    speedups = [r["speedup"] for r in rows if r.get("status") == "ok" and r.get("speedup") is not None]
    disagree = [r for r in rows if r.get("status") == "disagree"]
    figures = [
        Figure(name="median_speedup", value=statistics.median(speedups) if speedups else math.nan, unit="x",
               op=">=", threshold=spec.min_median_speedup, key=True),
        Figure(name="min_speedup", value=min(speedups) if speedups else math.nan, unit="x", op=">=",
               threshold=spec.min_each_speedup),
        Figure(name="disagreeing_configs", value=len(disagree), op="<=", threshold=0),
        Figure(name="configs_timed", value=len(speedups)),
    ]
    for row in rows:
        if row.get("speedup") is not None:
            figures.append(Figure(name=f"speedup_{context_label(row['params']['L'])}", value=row["speedup"], unit="x"))
    figures += _sm120_verify_figures(rows)
    for label, per_backend in breakdown.items():
        for name, parts in per_backend.items():
            figures.append(Figure(name=f"attention_share_{name}_{label}", value=parts["attention_share"]))
        steps = [per_backend[n]["step_ms"] for n in per_backend]
        if len(steps) == 2 and steps[0] > 0:  # eager wall clock, host enqueue included (host-bound at 4k)
            figures.append(Figure(name=f"eager_speedup_{label}", value=steps[1] / steps[0], unit="x"))
    converter: dict[str, Any] = {}
    if with_converter:
        for context in contexts:
            if context >= 32768:
                ctx.progress(f"SGLang converter vs kernel at L={context}", None)
                got = converter_fraction(context, VERIFY_BATCH, tree=TREE_BUDGET, device=device)
                converter[context_label(context)] = got
                figures.append(Figure(name=f"converter_fraction_{context_label(context)}", value=got["fraction"]))
    summary = "; ".join(r.summary for r in results)
    details = {"configs": rows, "step_breakdown_ms": breakdown, "converter": converter,
               "timer": results[0].details.get("timer") if results else None}
    if errors:
        return GateResult(gate=spec.name, kind=spec.kind, outcome=Outcome.ERROR, figures=figures,
                          summary="; ".join(r.summary for r in errors), details=details)
    return verdict(spec.name, spec.kind, figures, summary, **details)


def _sm120_verify_figures(rows: list[dict[str, Any]]) -> list[Figure]:
    """The sm_120 path's verify-step figures (reported), where it was timed: per context
    ``sm120_path_speedup_<L>`` and the median over contexts; a disagreeing or stale one fails."""
    sides = [(row, row["others"][SM120]) for row in rows if SM120 in (row.get("others") or {})]
    if not sides:
        return []
    ok = [(row, side) for row, side in sides if side.get("status") == "ok" and side.get("speedup") is not None]
    figures = [Figure(name=f"{SM120}_speedup_{context_label(row['params']['L'])}", value=side["speedup"], unit="x")
               for row, side in ok]
    figures += [
        Figure(name=f"{SM120}_median_speedup", value=statistics.median(s["speedup"] for _, s in ok) if ok else None,
               unit="x"),
        Figure(name=f"{SM120}_disagreeing_configs", value=sum(s.get("status") == "disagree" for _, s in sides),
               op="<=", threshold=0),
        Figure(name=f"{SM120}_stale_configs", value=sum(s.get("status") == "stale" for _, s in sides),
               op="<=", threshold=0)]
    return figures


def context_label(context: int) -> str:
    """'32k' for 32768, '100' for 100: how figures name a context length."""
    return f"{context // 1024}k" if context % 1024 == 0 else str(context)


# -- decode_speedup ------------------------------------------------------------------------------
# The decode gate runs the decode benchmark (`kdtree.bench.decode`, also `python -m kdtree.tools.decode`):
# every backend with CUDA graphs (verify steps and the draft model's decode passes) and eagerly,
# in interleaved rounds from one prefilled state. The thresholds and targets hold the medians of
# the graph arms: the kernel backend against the Triton backend as SGLang serves it.
def _decode_figures(record: dict[str, Any], cand: str, base: str, sm120: Optional[str],
                    modes: tuple[str, ...]) -> tuple[dict[str, float], dict[str, Any]]:
    """The gate's figures from a decode record: per context the median ratio of tokens/s of the
    deciding mode (graphs where run), its interval, the eager ratio, the sm_120 path's, the spread
    (max/min over rounds) of every arm that decides, and tokens agreement."""
    figures: dict[str, float] = {}
    same = 1.0
    rounds, spreads = [], []
    deciding = "graph" if "graph" in modes else modes[0]
    for ctx_rec in record["contexts"]:
        label = context_label(ctx_rec["context"])
        arms = ctx_rec["arms"]

        def median(backend, mode):
            return arms[f"{backend}-{mode}"]["tokens_per_s"]["median"]

        for mode in modes:
            prefix = "" if mode == deciding else f"{mode}_"
            figures[f"{prefix}decode_speedup_{label}"] = median(cand, mode) / median(base, mode)
            figures[f"{prefix}{cand}_tokens_per_s_{label}"] = median(cand, mode)
            figures[f"{prefix}{base}_tokens_per_s_{label}"] = median(base, mode)
            interval = ctx_rec["speedups"].get(f"{cand}-{mode}/{base}-{mode}")
            if interval:
                figures[f"{prefix}decode_speedup_{label}_low"] = interval["low"]
                figures[f"{prefix}decode_speedup_{label}_high"] = interval["high"]
            if sm120:
                figures[f"{prefix}{SM120}_decode_speedup_{label}"] = median(sm120, mode) / median(base, mode)
                figures[f"{prefix}{SM120}_tokens_per_s_{label}"] = median(sm120, mode)
            for backend in (cand, base):
                if not arms[f"{backend}-{mode}"]["same_tokens"]:
                    same = 0.0
        if sm120:
            figures[f"{SM120}_same_tokens_{label}"] = float(all(arms[f"{sm120}-{m}"]["same_tokens"] for m in modes))
        if "graph" in modes and "eager" in modes:
            figures[f"graph_gain_{cand}_{label}"] = median(cand, "graph") / median(cand, "eager")
            figures[f"graph_gain_{base}_{label}"] = median(base, "graph") / median(base, "eager")
        deciders = [cand, base] + ([sm120] if sm120 else [])
        spread = max(arms[f"{b}-{deciding}"]["tokens_per_s"]["spread"] for b in deciders)
        figures[f"decode_spread_{label}"] = spread
        spreads.append(spread)
        rounds += [len(arm["rounds"]) for arm in arms.values()]
        for backend in deciders:  # the step breakdown of every arm stays in the details (the record)
            figures[f"accepted_per_step_{backend}_{label}"] = arms[f"{backend}-{deciding}"]["mean_accepted"]
    figures["decode_spread_max"] = max(spreads) if spreads else math.nan
    figures["rounds_per_arm"] = min(rounds) if rounds else 0
    figures["new_tokens_per_request"] = record["config"]["new_tokens"]
    figures["same_tokens"] = same
    return figures, {"deciding_mode": deciding}


def check_decode_speedup(spec, ctx: GateContext, preset_name: str = SPEED_PRESET, runs=DECODE_RUNS,
                         new_tokens: int = DECODE_NEW_TOKENS, device: str = "cuda", backends=("kernel", "triton"),
                         drafter: str = "ddtree", budget: int = TREE_BUDGET, sm120: Optional[str] = "default",
                         rounds: int = DECODE_ROUNDS, modes=("graph", "eager"), breakdown: bool = True,
                         time_budget_s: Optional[float] = DECODE_TIME_BUDGET_S) -> GateResult:
    """End-to-end speculative decode tokens/s, kernel vs Triton backend as SGLang serves it, with
    CUDA graphs and eager, through the decode benchmark (`kdtree.bench.decode.run_decode`): same
    prompts, same start state, `rounds` interleaved rounds per arm, every round in the details.
    ``sm120`` names the sm_120 path's backend, decoded in the same rounds and reported as
    ``sm120_path_decode_speedup_<L>`` ("default": the benchmark's ``sm120``; None: not run)."""
    from kdtree.bench.decode import DecodeConfig, run_decode  # noqa: PLC0415
    from kdtree.bench.decode_report import decode_table  # noqa: PLC0415

    cand, base = backends
    sm120_name = "sm120" if sm120 == "default" else sm120
    if "triton" in backends and str(device).startswith("cuda"):
        try:
            from kdtree.bench.decode_triton import load_kernels  # noqa: PLC0415

            load_kernels()
        except Exception as err:  # noqa: BLE001 - any import failure means SGLang's kernels are not usable here
            return GateResult(gate=spec.name, kind=spec.kind, outcome=Outcome.SKIPPED,
                              reason=f"SGLang's Triton kernels cannot be loaded: {type(err).__name__}: {err}",
                              summary="skipped: the Triton backend as SGLang serves it needs sglang 0.5.23's kernels")
    model = shared_model(preset_name, device)
    names = tuple(backends) + ((sm120_name,) if sm120_name else ())
    config = DecodeConfig(contexts=[c for c, _ in runs], batches=[b for _, b in runs], budget=budget, drafter=drafter,
                          new_tokens=new_tokens, rounds=rounds, backends=names, modes=tuple(modes), baseline=base,
                          preset=preset_name, device=device, seed=ctx.fresh_seed() % (1 << 31), breakdown=breakdown,
                          time_budget_s=time_budget_s)
    record = run_decode(config, model=model, progress=lambda label: ctx.progress(f"decode: {label}", None))
    figures, extra = _decode_figures(record, cand, base, sm120_name, tuple(modes))
    details = {"drafter": drafter, "budget": budget, "new_tokens": new_tokens, "preset": preset_name,
               "rounds": rounds, **extra, "table": decode_table(record), "decode": record,
               "plot": _decode_plot(record, ctx)}
    return check_metric(spec, figures, ctx, details=details)


def _decode_plot(record: dict[str, Any], ctx: GateContext) -> str:
    """The PNG of tokens/s against context per arm, written into the phase's results folder when the
    run has one (its name, relative to that folder), or why it was not drawn."""
    from kdtree.bench.decode_report import save_plot  # noqa: PLC0415

    if ctx.artifacts_dir is None:
        return "not drawn: the run has no results folder"
    name = time.strftime("decode-%Y%m%dT%H%M%SZ.png", time.gmtime(record["started"]))
    try:
        save_plot(record, ctx.artifacts_dir / name)
    except ImportError as err:
        return f"not drawn: matplotlib is not importable here ({err}); python -m kdtree.tools.decode --from-json renders it"
    return name
