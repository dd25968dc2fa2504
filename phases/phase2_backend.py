"""Phase 2: an attention backend that routes tree-verify to the kernel, everything else to the baseline.

Gates: end-to-end speculative decoding is token-exact against the baseline backend, and the
verify step is faster by the stated margin. Until the backend exists, the checks report
``not-implemented``.
"""

from __future__ import annotations

from kdtree.gates.spec import PhaseSpec, SpeedupGateSpec, TokenExactGateSpec
from kdtree.phases import not_yet_checks

SPEC = PhaseSpec(
    id="phase2",
    title="backend",
    objective=("An attention backend for the engine's speculative loop that sends tree-verify "
               "attention to the phase 1 kernel and every other call (prefill, decode, draft) to "
               "the baseline, with identical tokens and a faster verify step."),
    deliverables=[
        "kdtree.engine backend: tree-verify -> kdtree.kernels.tree_verify_mla, the rest -> baseline",
        "end-to-end speculative decoding (draft tree, verify, accept) on the MLA model with either backend",
    ],
    inputs=["engine/**/*.py", "kernels/**/*.py", "kernels/csrc/**", "phases/phase2_backend.py",
            "gates/**/*.py"],
    gates=[
        TokenExactGateSpec(
            name="token_exact", requires=["cuda"], min_prompts=16, max_new_tokens=64,
            min_exact_fraction=1.0,
            description="speculative decoding with the kernel backend == with the baseline backend, "
                        "greedy, every prompt (first divergence reported)"),
        SpeedupGateSpec(
            name="speedup", requires=["cuda", "triton"], baseline="triton backend",
            min_median_speedup=5.0, min_each_speedup=2.0,
            description="one verify step (all layers' attention + the rest of the step) with the "
                        "kernel backend vs the Triton backend, interleaved, long contexts"),
    ],
)

_NO_BACKEND = "the kernel attention backend (kdtree.engine) does not exist yet"

CHECKS = not_yet_checks(SPEC, _NO_BACKEND)
