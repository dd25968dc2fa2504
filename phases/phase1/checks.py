"""Phase 1's work: what each gate of `kdtree.phases.phase1.spec.SPEC` runs, bound to this project.

Every function takes (spec, ctx) and returns the GateResult of a generic mechanism from
`kdtree.gates`, fed with this project's kernel, baselines, oracle and engine. torch and the
project's GPU code are imported here: the orchestrator imports this module only when a gate
runs (`kdtree.phases.phase1.CHECKS` names the checks as strings).
"""

from __future__ import annotations

import random
import statistics
import sys
from typing import Any

import torch

from kdtree.bench import timing
from kdtree.bench.accuracy_cases import ACCURACY_CASES
from kdtree.bench.cases import case_args, make_case, make_pool, oracle, pool_slots_for, uniform_case
from kdtree.bench.coverage_cases import accuracy_cases as coverage, device_variants
from kdtree.bench.flashinfer_peer import SM120_SMEM_PER_SM
from kdtree.bench.layouts import time_layouts
from kdtree.bench.roofline import Shape, floor_seconds, floors
from kdtree.bench.sanitize_cases import DONE_MARKER
from kdtree.bench.speed import SpeedConfig, measure_speedup, speed_protocol
from kdtree.bench.structured_cases import dominant_key_case, row_scale
from kdtree.bench.token_probe import (
    counted_backend, decoy_step, margin_report, probe_model, same_length, screened_step,
)
from kdtree.engine import build_model, generate
from kdtree.gates import accuracy as accuracy_gate, build as build_gate, sanitizer as sanitizer_gate
from kdtree.gates import speedup as speedup_gate, token_exact as token_exact_gate
from kdtree.gates.accuracy import AccuracyCase
from kdtree.gates.base import GateContext, GateResult
from kdtree.gates.build import BuildOutput
from kdtree.gates.metric import check_metric
from kdtree.gates.token_exact import RunStats, Stream
from kdtree.kernels import triton_baseline, tree_verify_mla
from kdtree.kernels.jit import compile_arch
from kdtree.kernels.naive import tree_verify_mla_naive
from kdtree.phases.phase1.peers import add_flashmla_figures, add_peer_figures
from kdtree.phases.phase1.sm120 import (
    PREFIX as SM120, add_mma_ceiling_figures, extension_smem_bytes, hold_smem, sm120_path, variants_by_config,
)

# Structured cases (`kdtree.bench.structured_cases.dominant_key_case`): keys that dominate their rows at the tail of
# the prefix, at both sides of every 32-key tile edge (every split boundary of every split count),
# at the first and last tree slot, plus rows that target a slot they must not see. Sized so that
# T x H x 8 targets hold every marked key (about (L+T)/16 of them). L past 8192 in each.
STRUCTURED_CASES = [
    ("dominant H32 T16 L32k", 32, [(16, 32768)], "random"),
    ("dominant H8 T64 B2 L9k", 8, [(64, 9000), (40, 12000)], "random"),
    ("dominant H128 T1 L15k", 128, [(1, 15000)], "chain"),
    ("dominant star H16 T300 L2000", 16, [(300, 2000)], "star"),
    ("dominant mixed H16", 16, [(5, 9000), (33, 100), (1, 0)], "random"),
]



def _workload(spec, ctx: GateContext) -> dict:
    """The gate's workload in the spec for this run: its "quick" one on a quick run where it has one."""
    return spec.workload["quick" if ctx.quick and "quick" in spec.workload else "full"]


def jittered(reqs: list[tuple[int, int]], seed: int) -> list[tuple[int, int]]:
    """The requests with each prefix of 100+ keys lengthened by 0..31 keys, drawn from the seed:
    shapes vary from trial to trial, so no shape tells a candidate it is inside the gate."""
    return [(t, l + ((seed >> (5 * i)) % 32 if l >= 100 else 0)) for i, (t, l) in enumerate(reqs)]


def _kernel_inputs(H: int, reqs: list[tuple[int, int]], kind: str, seed: int, device: str) -> dict[str, Any]:
    return make_case(H, jittered(reqs, seed), kind, seed, device=device)


def _structured_inputs(H: int, reqs: list[tuple[int, int]], kind: str, seed: int, device: str) -> dict[str, Any]:
    return dominant_key_case(H, jittered(reqs, seed), kind, seed, device=device)


def check_build(spec, ctx: GateContext) -> GateResult:
    def compile_one(arch: str) -> BuildOutput:
        ctx.progress(f"nvcc {arch}", None)
        b = compile_arch(arch)
        return BuildOutput(ptxas_log=b.ptxas_log, sass=b.sass, returncode=b.returncode, command=b.command,
                           dynamic_smem_bytes=b.dynamic_smem_bytes, dynamic_smem_required=True,
                           dynamic_smem_source="the compiled object's kdtree_smem_records")

    return build_gate.check_build(spec, compile_one, ctx)


def check_accuracy(spec, ctx: GateContext, candidate_fn=None, cases=None, structured=None) -> GateResult:
    """The kernel (or `candidate_fn`, same signature) vs the fp64 oracle on ACCURACY_CASES (random)
    and STRUCTURED_CASES (dominant keys, `cases`); `cases` / `structured` replace them.
    Per-row errors are held relative to `cases.row_scale`."""
    own_kernel = candidate_fn is None
    if own_kernel:
        candidate_fn = tree_verify_mla

    def case(name, H, reqs, kind, make=_kernel_inputs, label="random"):
        return AccuracyCase(
            name=name, params={"H": H, "requests": reqs, "tree": kind, "inputs": label},
            may_allocate=("out",),
            make_inputs=lambda seed, device: make(H, reqs, kind, seed, device),
            make_outputs=lambda inp: {
                "out": torch.empty(inp["q"].shape[0], inp["q"].shape[1], 512, dtype=torch.bfloat16,
                                   device=inp["q"].device),
                "lse": torch.empty(inp["q"].shape[0], inp["q"].shape[1], dtype=torch.float32,
                                   device=inp["q"].device)})

    def candidate(inp, outs):
        fn = inp.get("launch") or candidate_fn  # coverage cases force a variant / split count
        out = fn(inp["q"], inp["kv_cache"], inp["qo_indptr"], inp["kv_indptr"], inp["kv_indices"],
                 inp["tree_mask"], inp["sm_scale"], out=outs.get("out"), lse=outs.get("lse"))
        return {"out": out}

    def reference(inp):
        out, lse = oracle(inp)
        return {"out": out, "lse": lse}

    all_cases = [case(*c) for c in (ACCURACY_CASES if cases is None else cases)]
    all_cases += [case(*c, make=_structured_inputs, label="dominant keys")
                  for c in (STRUCTURED_CASES if structured is None else structured)]
    if own_kernel and cases is None:  # every variant the device runs, split counts of other GPUs, slots past 2^31
        all_cases += coverage(ACCURACY_CASES, device_variants(ctx.device))
    return accuracy_gate.check_accuracy(spec, all_cases, candidate, reference, ctx, row_scale=lambda inp, exp: {"out": row_scale(inp)})


def _token_prompts(rng, vocab: int, n: int) -> list[list[int]]:
    """n prompts: even ones random tokens, odd ones a short motif repeated (prompt lookup drafts well)."""
    prompts = []
    for i in range(n):
        length = rng.randint(4, 48)
        motif = [rng.randrange(vocab) for _ in range(rng.randint(2, 6))]
        prompts.append([motif[j % len(motif)] if i % 2 else rng.randrange(vocab) for j in range(length)])
    return prompts


def check_token_exact(spec, ctx: GateContext, backend: str = "cuda", device: str = "cuda",
                      drafters=(("ddtree", 64), ("ngram", 16)), op_under_test=None,
                      reference_backend: str = "reference", decoy_path: int = 20) -> GateResult:
    """Tree speculative decoding through `backend` vs plain greedy decoding with the oracle, on
    ``spec.min_prompts`` fresh prompts, per drafter; plus one verify step per prompt on a decoy tree
    (`trees`), whose tokens change under a wrong tree mask.

    `op_under_test` (default `kdtree.kernels.tree_verify_mla`) is the op whose calls are counted in
    every verify step (`tokens.CountedBackend`); the mean accepted length per step of each
    speculative run is held against the same run with `reference_backend`; the decoy step's logits
    are held against the reference's on the same KV (``margin_report``: how close the candidate
    came to changing a token there, as a fraction of the greedy margin); with ``spec.screen``, one
    verify step per round on random trees over a softmax-scale probe model, whose tokens must be
    the reference's wherever rounding noise cannot change them (`tokens.screened_step`).
    """
    if op_under_test is None:
        op_under_test = tree_verify_mla
    seed = ctx.fresh_seed()
    rng = random.Random(seed)
    model = build_model(None, 0, device, None)
    prompts = _token_prompts(rng, model.config.vocab_size, spec.min_prompts)
    ctx.progress("greedy decoding with the reference backend", 0.05)
    greedy_new = max(spec.max_new_tokens, decoy_path + 2)
    greedy = generate(prompts, model=model, drafter="none", backend=reference_backend, max_new_tokens=greedy_new,
                      record_margins=True)
    same_length("greedy decoding", greedy.tokens, prompts)
    ref_tokens = [t[: spec.max_new_tokens] for t in greedy.tokens]
    streams, runs, details = [], [], {"seed": seed}
    for k, (drafter, budget) in enumerate(drafters):
        label = f"{drafter}:{budget}"
        ctx.progress(f"tree speculative decoding ({label}) with {backend} and {reference_backend}", 0.2 + 0.5 * k / len(drafters))
        name, log = counted_backend(backend, op_under_test)
        cand = generate(prompts, model=model, drafter=drafter, budget=budget, backend=name,
                        max_new_tokens=spec.max_new_tokens, on_step=lambda n, log=log: log.mark_step())
        base = generate(prompts, model=model, drafter=drafter, budget=budget, backend=reference_backend,
                        max_new_tokens=spec.max_new_tokens)
        same_length(f"{label} speculative decoding", cand.tokens, ref_tokens)
        streams += [Stream(f"p{i}", label, c, r, margins, runner_up) for i, (c, r, margins, runner_up)
                    in enumerate(zip(cand.tokens, ref_tokens, greedy.margins, greedy.runner_up))]
        runs.append(RunStats(label, log.steps[1:], cand.mean_accepted, base.mean_accepted))  # [0]: prefill
        details[f"{drafter}_mean_accepted"] = cand.mean_accepted
    ctx.progress(f"decoy verify step with {backend}", 0.8)
    tree_seed = rng.getrandbits(31)
    ref_step, pool = decoy_step(model, reference_backend, prompts, greedy.tokens, decoy_path, tree_seed)
    name, log = counted_backend(backend, op_under_test)
    cand_step, _ = decoy_step(model, name, prompts, greedy.tokens, decoy_path, tree_seed, pool=pool)
    log.mark_step()
    same_length("decoy verify", cand_step.tokens, ref_step.tokens)
    # the reference is the oracle's verify step on the same trees and KV (it should accept the
    # whole greedy path; what it did accept is in the details)
    streams += [Stream(f"p{i}", "decoy", c, r) for i, (c, r) in enumerate(zip(cand_step.tokens, ref_step.tokens))]
    decoy_margins = margin_report(cand_step.logits, ref_step.logits, spec.tie_margin)
    runs.append(RunStats("decoy", log.steps, sum(cand_step.emitted) / len(prompts),
                         sum(ref_step.emitted) / len(prompts), decoy_margins["fraction"]))
    details["decoy_reference_emitted"] = ref_step.emitted
    details["decoy_margins"] = decoy_margins
    if spec.screen is not None:
        ctx.progress(f"screened verify step with {backend}", 0.9)
        name, log = counted_backend(backend, op_under_test)
        sensitive: dict[str, int] = {}
        draws = []
        cand_tokens: list[list[int]] = [[] for _ in prompts]
        ref_tokens: list[list[int]] = [[] for _ in prompts]
        # a probe model whose margins are wide can find too few scale-sensitive decisions for the
        # screen to mean anything; another draw is made on the reference's counts alone
        for _ in range(spec.screen.model_draws):
            screened = screened_step(probe_model(model.device, rng.getrandbits(31)), reference_backend, name,
                                     prompts, spec.screen, rng, on_round=log.mark_step)
            same_length("screened verify", screened.candidate, screened.reference)
            for i, (c, r) in enumerate(zip(screened.candidate, screened.reference)):
                cand_tokens[i] += c
                ref_tokens[i] += r
            sensitive = {k: sensitive.get(k, 0) + v for k, v in screened.sensitive.items()}
            draws.append(screened.details)
            if min(sensitive.values()) >= spec.screen.min_sensitive:
                break
        streams += [Stream(f"p{i}", "scale-screen", c, r) for i, (c, r) in enumerate(zip(cand_tokens, ref_tokens)) if r]
        runs.append(RunStats("scale-screen", log.steps, sensitive=sensitive))
        details["scale_screen"] = draws[0] if len(draws) == 1 else {"model_draws": draws, "sensitive": sensitive}
    details["decoy_path_len"] = decoy_path
    result = token_exact_gate.check_token_exact(spec, streams, ctx, runs=runs)
    result.details.update(details)
    return result


class _Pool:
    """One random bf16 pool of >= 8 GB per gate run, shared by its configs."""

    def __init__(self, gb: float):
        self.tensor = make_pool(pool_slots_for(gb))


def _gpu_timer():
    """The bench's timer (`kdtree.bench.timing.make_timer`): L2 wiped (by reading) and a GPU
    busy-wait queued before each call, so the events measure GPU time, not host enqueue time."""

    return timing.make_timer()


def refresh_queries(case: dict, seed: int) -> None:
    """New query values in place (same tensor, same shape): every output of the call changes."""

    case["q"].normal_(generator=torch.Generator(device=case["q"].device).manual_seed(seed))


def _device_smem(device) -> dict[str, int]:
    """Variant -> dynamic shared memory of the extension this CUDA device loads."""


    return extension_smem_bytes(torch.cuda.get_device_capability(torch.device(device)))


def _speed(spec, ctx: GateContext, baseline_name: str, candidate_fn=None, sm120_fn=None,
           mma_ceiling=None, smem_of=None, sm120_smem_per_sm=None) -> GateResult:
    """Kernel (or `candidate_fn`, same signature) vs baseline, each call timed by `_gpu_timer`, so
    the gate compares GPU time (host enqueue time is reported per side in the details). Queries
    are redrawn in place between timed rounds (`refresh_queries`).

    Against the Triton baseline it times two dispatches in the same rounds: this device's and the
    sm_120 path (`sm120`: `sm120_fn`, default `sm120_path`), each against FlashInfer FA2
    (the sm_120 path also against FA2 built with sm_120's shared memory per SM) and the default
    against FA3; then the mma.sync ceiling (`mma_ceiling`: a callable returning its rows, default
    `kdtree.bench.mma_ceiling.measure`) and the shared memory of the variants the sm_120 path
    launched (`smem_of(device)` -> variant -> bytes, default: the loaded extension's records); last
    the default against FlashMLA's dense decode (`peers.add_flashmla_figures`, reported)."""
    # looked up at call time, so a test may patch the baseline on its module
    baseline_fn = triton_baseline.tree_verify_mla_triton if baseline_name == "triton" else tree_verify_mla_naive
    sm120_op = sm120_fn or sm120_path
    smem_of = smem_of or _device_smem
    sm120_smem_per_sm = sm120_smem_per_sm or SM120_SMEM_PER_SM
    ctx.progress("measuring copy bandwidth and bf16 matmul rate", None)
    bw, rate = timing.measure_ceilings()
    workload = _workload(spec, ctx)
    pool = _Pool(workload["pool_gb"]).tensor

    def config(H, T, B, L):
        return SpeedConfig(
            name=f"H{H} T{T} B{B} L{L // 1024}k", params={"H": H, "T": T, "B": B, "L": L},
            make_inputs=lambda seed, device: uniform_case(H, T, B, L, "scattered", pool, seed),
            refresh=refresh_queries)

    configs = [config(*c) for c in workload["configs"]]
    op = candidate_fn or tree_verify_mla
    floor_s = lambda cfg: floor_seconds(Shape(**cfg.params), bw, rate)  # noqa: E731
    with_sm120 = baseline_name == "triton"
    others = {SM120: lambda c: sm120_op(*case_args(c))} if with_sm120 else None
    measured = measure_speedup(configs, lambda c: op(*case_args(c)), lambda c: baseline_fn(*case_args(c)), ctx,
                               **speed_protocol(spec), timer=_gpu_timer(), floor_s=floor_s, others=others)
    result = speedup_gate.judge_speedup(spec, measured, ctx)
    result.details["ceilings"] = {"copy_bytes_per_s": bw, "bf16_flops_per_s": rate}
    if with_sm120:
        def tensor_bound(cfg) -> bool:
            byte_s, flop_s = floors(Shape(**cfg.params), bw, rate)
            return flop_s >= byte_s

        timer = _gpu_timer()
        add_peer_figures(result, spec, configs, ctx, op, timer, floor_s, "fa2", tensor_bound,
                         others={SM120: sm120_op})
        add_peer_figures(result, spec, configs, ctx, op, timer, floor_s, "fa3", tensor_bound)
        add_peer_figures(result, spec, configs, ctx, sm120_op, timer, floor_s, "fa2", tensor_bound,
                         smem_per_sm=sm120_smem_per_sm, label="fa2_sm120smem", prefix=f"{SM120}_")
        ctx.progress("measuring the mma.sync ceiling", None)
        add_mma_ceiling_figures(result, configs, bw, measure=mma_ceiling)
        hold_smem(result, variants_by_config(configs), smem_of(ctx.device))
        add_flashmla_figures(result, spec, configs, ctx, op, timer, floor_s, tensor_bound)
    return result


def check_speedup(spec, ctx: GateContext) -> GateResult:
    return _speed(spec, ctx, "triton")


def check_speedup_naive(spec, ctx: GateContext) -> GateResult:
    return _speed(spec, ctx, "naive")


def check_scatter(spec, ctx: GateContext) -> GateResult:
    """The kernel on scattered vs contiguous slots, same shapes, GPU time (`_gpu_timer`)
    interleaved; host enqueue time per layout in the details."""

    workload = _workload(spec, ctx)
    pool = _Pool(workload["pool_gb"]).tensor
    timer = _gpu_timer()
    rows = [time_layouts(tree_verify_mla, H, T, B, L, pool, ctx.fresh_seed(), timer,
                         input_sets=workload["input_sets"], repeats=workload["repeats"])
            for H, T, B, L in workload["configs"]]
    slowdown = statistics.median(r["ratio"] for r in rows)
    return check_metric(spec, {"scatter_slowdown": slowdown,
                               "worst_scatter_slowdown": max(r["ratio"] for r in rows)}, ctx,
                        details={"configs": rows, "timer": timer.label, "lead_overruns": timer.overruns})


def check_sanitizer(spec, ctx: GateContext) -> GateResult:
    return sanitizer_gate.check_sanitizer(spec, [sys.executable, "-m", "kdtree.tools.sanitize_driver"], ctx, require_marker=DONE_MARKER)


