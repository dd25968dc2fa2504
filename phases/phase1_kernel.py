"""Phase 1: the owned MLA tree-verify CUDA kernel, its baselines and its benchmark.

The gates prove it builds for sm_90 and sm_120 within sm_120's limits (no spills, no stack,
<= 101376 B shared memory, no Hopper/Blackwell-datacenter-only instructions), matches the fp64
oracle, is token-exact, beats the Triton baseline engines run today by the stated margin (and
plain torch), gains nothing from contiguous slots it would lose on scattered ones, and is clean
under compute-sanitizer.

The checks live in `phase1_work`: each feeds a generic mechanism of `kdtree.gates` with this
project's kernel, baselines, oracle and engine.
"""

from __future__ import annotations

from kdtree.gates.spec import (
    AccuracyGateSpec, BuildGateSpec, MetricGateSpec, PhaseSpec, SanitizerGateSpec, SpeedupGateSpec,
    Threshold, TokenExactGateSpec,
)

SPEC = PhaseSpec(
    id="phase1",
    title="kernel",
    objective=("An owned MLA tree-verify attention kernel (mma.sync, cp.async / bulk copy; nothing "
               "sm_120 lacks) that reads the shared latent once for all heads and is at least 20x "
               "faster than the Triton kernel sm_120 users run today."),
    deliverables=[
        "kernels/csrc: the CUDA kernel and its pybind11 binding; kdtree.kernels.tree_verify_mla",
        "kdtree.kernels.naive and kdtree.kernels.triton_baseline: the baselines, same signature",
        "a benchmark over DESIGN 3b's configs and the DDTree grid, with roofline fractions and plots",
    ],
    inputs=["kernels/**/*.py", "kernels/csrc/**", "phases/phase1_kernel.py", "phases/phase1_work.py",
            "phases/phase1_coverage.py", "tools/**/*.py", "tools/microbench/**", "engine/**/*.py", "gates/**/*.py"],
    gates=[
        BuildGateSpec(
            name="build", requires=["nvcc"], archs=["sm_90", "sm_120"],
            max_spill_bytes=0, max_stack_bytes=0, max_shared_bytes=101376,
            forbidden_sass=["HGMMA", "UTCHMMA", "UTCQMMA", "UTCMMA"],
            description="nvcc for sm_90 and sm_120; ptxas: no spills, no stack, smem within sm_120's limit; "
                        "no wgmma/tcgen05 in the SASS"),
        AccuracyGateSpec(
            name="accuracy", requires=["cuda"], trials=3, max_rel_l2=1e-2, max_abs=5e-2,
            check_lse=True, max_lse_abs=1e-2,
            description="vs the fp64 oracle on fresh random cases and the edge cases, outputs poisoned first"),
        TokenExactGateSpec(
            name="token_exact", requires=["cuda"], min_prompts=16, max_new_tokens=32,
            min_exact_fraction=1.0,
            description="greedy tree-verify decoding with the kernel == with the oracle, every prompt"),
        SpeedupGateSpec(
            name="speedup", requires=["cuda", "triton"], baseline="triton",
            min_median_speedup=20.0, min_each_speedup=5.0,
            min_roofline_median=0.5, min_roofline_each=0.35,
            description="vs kdtree.kernels.triton_baseline, interleaved, over the benchmark configs; "
                        "fraction of the roofline floor reached"),
        SpeedupGateSpec(
            name="speedup_naive", requires=["cuda"], baseline="naive",
            min_median_speedup=2.0, min_each_speedup=1.0,
            description="vs plain torch bf16 (kdtree.kernels.naive): never slower, 2x at the median"),
        MetricGateSpec(
            name="scatter", requires=["cuda"],
            thresholds=[Threshold(figure="scatter_slowdown", op="<=", value=1.05, unit="x")],
            description="median time on randomly scattered slots / on contiguous slots, same shapes"),
        SanitizerGateSpec(
            name="sanitizer", requires=["cuda", "compute-sanitizer"], tools=["memcheck", "racecheck"],
            max_errors=0, description="compute-sanitizer over a small driver: zero errors per tool"),
    ],
)

from kdtree.phases import phase1_work as _work  # noqa: E402

CHECKS = {
    "build": _work.check_build,
    "accuracy": _work.check_accuracy,
    "token_exact": _work.check_token_exact,
    "speedup": _work.check_speedup,
    "speedup_naive": _work.check_speedup_naive,
    "scatter": _work.check_scatter,
    "sanitizer": _work.check_sanitizer,
}
