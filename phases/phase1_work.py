"""Phase 1's work: what each gate of `phase1_kernel.SPEC` runs, bound to this project.

Every function takes (spec, ctx) and returns the GateResult of a generic mechanism from
`kdtree.gates`, fed with this project's kernel, baselines, oracle and engine. torch and the
project's GPU code are imported inside the functions, so importing the phase stays cheap.
"""

from __future__ import annotations

import statistics
import sys
from typing import Any

from kdtree.gates.base import GateContext, GateResult

# Edge cases of DESIGN section 4 plus random mixes: (name, H, [(T_b, L_b) per request], tree kind).
ACCURACY_CASES = [
    ("random H8 T16 L1000", 8, [(16, 1000)], "random"),
    ("T1 L0 H16", 16, [(1, 0)], "random"),
    ("chain H1 T5 L37", 1, [(5, 37)], "chain"),
    ("star H16 T300 L50", 16, [(300, 50)], "star"),
    ("mixed H128", 128, [(7, 300), (1, 5), (40, 0)], "random"),
    ("T1024 H8 L200", 8, [(1024, 200)], "random"),
    ("T1024 H128 L64", 128, [(1024, 64)], "chain"),
    ("H64 T64 B2 L4096", 64, [(64, 4096), (64, 4000)], "random"),
    ("H16 T33 L16k", 16, [(33, 16384)], "random"),
    ("H8 T4 L32k", 8, [(4, 32768)], "random"),
    ("odd H3", 3, [(17, 77), (3, 1), (2, 0)], "random"),
    ("H128 T256 L2000", 128, [(256, 2000)], "random"),
    ("B8 mixed H8", 8, list(zip([1, 4, 9, 16, 33, 64, 2, 100], [0, 5, 100, 999, 3000, 31, 7, 12])), "random"),
]

# Speed configs at L >= 32k (the targets are stated there): (H, T, B, L).
SPEED_CONFIGS = [(8, 16, 1, 32768), (8, 64, 1, 32768), (64, 16, 1, 32768), (64, 64, 1, 32768),
                 (8, 16, 8, 32768), (64, 16, 8, 32768), (16, 4, 8, 32768), (128, 16, 1, 32768),
                 (16, 512, 1, 32768), (8, 1024, 1, 32768), (8, 16, 1, 131072), (16, 64, 1, 131072)]
SPEED_CONFIGS_QUICK = SPEED_CONFIGS[:4]
SCATTER_CONFIGS = [(8, 16, 1, 131072), (64, 16, 8, 32768), (16, 512, 1, 32768), (128, 64, 1, 32768)]


def _kernel_inputs(H: int, reqs: list[tuple[int, int]], kind: str, seed: int, device: str) -> dict[str, Any]:
    from kdtree.tools.cases import make_case  # noqa: PLC0415

    return make_case(H, reqs, kind, seed, device=device)


def check_build(spec, ctx: GateContext) -> GateResult:
    from kdtree.gates.build import BuildOutput, check_build as run  # noqa: PLC0415
    from kdtree.kernels.jit import compile_arch  # noqa: PLC0415

    def compile_one(arch: str) -> BuildOutput:
        ctx.progress(f"nvcc {arch}", None)
        b = compile_arch(arch)
        return BuildOutput(ptxas_log=b.ptxas_log, sass=b.sass, returncode=b.returncode, command=b.command,
                           dynamic_smem_bytes=b.dynamic_smem_bytes, dynamic_smem_required=True,
                           dynamic_smem_source="the compiled object's kdtree_smem_records")

    return run(spec, compile_one, ctx)


def check_accuracy(spec, ctx: GateContext, candidate_fn=None, cases=None) -> GateResult:
    """The kernel (or `candidate_fn`, same signature) vs the fp64 oracle on ACCURACY_CASES."""
    import torch  # noqa: PLC0415

    from kdtree.gates.accuracy import AccuracyCase, check_accuracy as run  # noqa: PLC0415
    from kdtree.phases.phase1_coverage import accuracy_cases as coverage  # noqa: PLC0415
    from kdtree.tools.cases import oracle  # noqa: PLC0415

    own_kernel = candidate_fn is None
    if own_kernel:
        from kdtree.kernels import tree_verify_mla as candidate_fn  # noqa: PLC0415

    def case(name, H, reqs, kind):
        return AccuracyCase(
            name=name, params={"H": H, "requests": reqs, "tree": kind},
            make_inputs=lambda seed, device: _kernel_inputs(H, reqs, kind, seed, device),
            make_outputs=lambda inp: {
                "out": torch.empty(inp["q"].shape[0], inp["q"].shape[1], 512, dtype=torch.bfloat16,
                                   device=inp["q"].device),
                "lse": torch.empty(inp["q"].shape[0], inp["q"].shape[1], dtype=torch.float32,
                                   device=inp["q"].device)})

    def candidate(inp, outs):
        (inp.get("launch") or candidate_fn)(inp["q"], inp["kv_cache"], inp["qo_indptr"], inp["kv_indptr"], inp["kv_indices"],
                     inp["tree_mask"], inp["sm_scale"], out=outs["out"], lse=outs.get("lse"))

    def reference(inp):
        out, lse = oracle(inp)
        return {"out": out, "lse": lse}

    gate_cases = [case(*c) for c in (cases or ACCURACY_CASES)]
    if own_kernel and cases is None:  # every variant, split counts of other GPUs, slots past 2^31 elements
        gate_cases += coverage(ACCURACY_CASES)
    return run(spec, gate_cases, candidate, reference, ctx)


def check_token_exact(spec, ctx: GateContext, backend: str = "cuda", device: str = "cuda",
                      drafters=(("ddtree", 64), ("ngram", 16))) -> GateResult:
    """Tree speculative decoding through `backend` vs plain greedy decoding with the oracle."""
    import random  # noqa: PLC0415

    from kdtree.engine import build_model, generate  # noqa: PLC0415
    from kdtree.gates.token_exact import check_token_exact as run  # noqa: PLC0415

    rng = random.Random(ctx.fresh_seed())
    model = build_model(None, 0, device, None)
    vocab = model.config.vocab_size
    prompts = []
    for i in range(spec.min_prompts):
        n = rng.randint(4, 48)
        motif = [rng.randrange(vocab) for _ in range(rng.randint(2, 6))]
        prompts.append([motif[j % len(motif)] if i % 2 else rng.randrange(vocab) for j in range(n)])
    ctx.progress("greedy decoding with the reference backend", 0.1)
    ref = generate(prompts, model=model, drafter="none", backend="reference", max_new_tokens=spec.max_new_tokens)
    streams = []
    details = {}
    for k, (drafter, budget) in enumerate(drafters):
        ctx.progress(f"tree speculative decoding ({drafter}, budget {budget}) with {backend}", 0.4 + 0.3 * k)
        cand = generate(prompts, model=model, drafter=drafter, budget=budget, backend=backend,
                        max_new_tokens=spec.max_new_tokens)
        details[f"{drafter}_mean_accepted"] = cand.mean_accepted
        streams += [(f"{drafter}:{i}", c, r) for i, (c, r) in enumerate(zip(cand.tokens, ref.tokens))]
    result = run(spec, streams, ctx)
    result.details.update(details)
    return result


class _Pool:
    """One random bf16 pool of >= 8 GB per gate run, shared by its configs."""

    def __init__(self, gb: float):
        from kdtree.tools.cases import make_pool, pool_slots_for  # noqa: PLC0415

        self.tensor = make_pool(pool_slots_for(gb))


def _gpu_timer():
    """The tools' timer (`kdtree.tools.timing.gpu_timer`): L2 wiped (by reading) and a GPU
    busy-wait queued before each call, so the events measure GPU time, not host enqueue time."""
    from kdtree.tools.timing import gpu_timer  # noqa: PLC0415

    return gpu_timer()


def _speed(spec, ctx: GateContext, baseline_name: str) -> GateResult:
    """Kernel vs baseline, each call timed by `_gpu_timer`, so the gate compares GPU time (host
    enqueue time is reported per side in the details)."""
    from kdtree.gates.speedup import SpeedConfig, check_speedup  # noqa: PLC0415
    from kdtree.kernels import tree_verify_mla  # noqa: PLC0415
    from kdtree.tools.cases import case_args, uniform_case  # noqa: PLC0415
    from kdtree.tools.roofline import Shape, floor_seconds  # noqa: PLC0415
    from kdtree.tools.timing import measure_ceilings  # noqa: PLC0415

    if baseline_name == "triton":
        from kdtree.kernels.triton_baseline import tree_verify_mla_triton as baseline_fn  # noqa: PLC0415
    else:
        from kdtree.kernels.naive import tree_verify_mla_naive as baseline_fn  # noqa: PLC0415
    ctx.progress("measuring copy bandwidth and bf16 matmul rate", None)
    bw, rate = measure_ceilings()
    pool = _Pool(2.0 if ctx.quick else 8.0).tensor

    def config(H, T, B, L):
        return SpeedConfig(
            name=f"H{H} T{T} B{B} L{L // 1024}k", params={"H": H, "T": T, "B": B, "L": L},
            make_inputs=lambda seed, device: [uniform_case(H, T, B, L, "scattered", pool, seed + i) for i in range(3)])

    configs = [config(*c) for c in (SPEED_CONFIGS_QUICK if ctx.quick else SPEED_CONFIGS)]
    result = check_speedup(spec, configs, lambda c: tree_verify_mla(*case_args(c)),
                           lambda c: baseline_fn(*case_args(c)), ctx,
                           timer=_gpu_timer(),
                           floor_s=lambda cfg: floor_seconds(Shape(**cfg.params), bw, rate))
    result.details["ceilings"] = {"copy_bytes_per_s": bw, "bf16_flops_per_s": rate}
    return result


def check_speedup(spec, ctx: GateContext) -> GateResult:
    return _speed(spec, ctx, "triton")


def check_speedup_naive(spec, ctx: GateContext) -> GateResult:
    return _speed(spec, ctx, "naive")


def check_scatter(spec, ctx: GateContext) -> GateResult:
    """The kernel on scattered vs contiguous slots, same shapes, GPU time (`_gpu_timer`)
    interleaved; host enqueue time per layout in the details."""
    from kdtree.gates.metric import check_metric  # noqa: PLC0415
    from kdtree.kernels import tree_verify_mla  # noqa: PLC0415
    from kdtree.tools.cases import case_args, uniform_case  # noqa: PLC0415

    pool = _Pool(8.0).tensor
    timer = _gpu_timer()
    rows = []
    for H, T, B, L in SCATTER_CONFIGS:
        seed = ctx.fresh_seed()
        cases = {lay: [uniform_case(H, T, B, L, lay, pool, seed + i) for i in range(3)]
                 for lay in ("scattered", "contiguous")}
        times = {"scattered": [], "contiguous": []}
        host = {"scattered": [], "contiguous": []}
        for lay, sets in cases.items():
            for c in sets:
                tree_verify_mla(*case_args(c))
        for r in range(30):  # interleaved: scattered, contiguous, scattered, ...
            for lay, sets in cases.items():
                times[lay].append(timer(lambda c=sets[r % 3]: tree_verify_mla(*case_args(c))))
                host[lay].append(timer.host_seconds[-1])
        s, c = statistics.median(times["scattered"]), statistics.median(times["contiguous"])
        rows.append({"config": f"H{H} T{T} B{B} L{L}", "scattered_ms": s * 1e3, "contiguous_ms": c * 1e3,
                     "ratio": s / c, "scattered_host_us": statistics.median(host["scattered"]) * 1e6,
                     "contiguous_host_us": statistics.median(host["contiguous"]) * 1e6})
    slowdown = statistics.median(r["ratio"] for r in rows)
    return check_metric(spec, {"scatter_slowdown": slowdown,
                               "worst_scatter_slowdown": max(r["ratio"] for r in rows)}, ctx,
                        details={"configs": rows, "timer": timer.label, "lead_overruns": timer.overruns})


def check_sanitizer(spec, ctx: GateContext) -> GateResult:
    from kdtree.gates.sanitizer import check_sanitizer as run  # noqa: PLC0415
    from kdtree.tools.sanitize_driver import DONE_MARKER  # noqa: PLC0415

    return run(spec, [sys.executable, "-m", "kdtree.tools.sanitize_driver"], ctx, require_marker=DONE_MARKER)


