"""Phase 2: the kernel as the verify path of the engine and of SGLang, gated end to end.

Gates: the engine's speculative decoding on the kernel backend is token-exact against plain greedy
decoding on the oracle (prompts of 32k tokens included); the SGLang backend's verify output
matches SGLang's own Triton kernel on SGLang-format inputs; one whole verify step of a
DeepSeek-V3-shaped model (16 heads = one TP-8 shard, kv_lora_rank 512, rope 64) is faster on the
kernel backend than on the Triton backend at 4k, 32k and 128k; and end-to-end speculative decoding
is faster at 32k and 128k. Thresholds (here, in the spec) say the phase is done; `TARGETS` are the
issue's goals, recorded and shown, never blocking. Both speed gates also run the sm_120 path
(`sm120`: the variant compute capability 12.0 dispatches, forced) in the same rounds and
report its speedups as ``sm120_path_*``; the thresholds and targets hold the default dispatch.

The checks live in `checks`.
"""

from __future__ import annotations

from kdtree.gates.spec import (
    AccuracyGateSpec, MetricGateSpec, PhaseSpec, SpeedupGateSpec, Target, Threshold, TokenExactGateSpec,
)
from kdtree.phases import with_targets

SPEC = PhaseSpec(
    id="phase2",
    title="backend",
    objective=("The kernel as the verify path of a serving stack: the engine's attention backend sends "
               "tree-verify attention, the drafter's passes and chunked prefill to the kernel, and an SGLang "
               "0.5.23 backend (a TritonAttnBackend subclass, registered as a plugin) sends MLA target verify "
               "to it; decoding stays token-exact and gets faster at long context."),
    deliverables=[
        "kdtree.engine: the kernel backend (verify, draft/decode, prefill as 1024-row chain trees), "
        "`python -m kdtree.engine generate --backend kernel|triton|torch`",
        "kdtree.integrations.sglang: converter (GPU, preallocated, no host sync), backend subclass, "
        "`sglang.srt.plugins` entry point, extra kdtree-engine[sglang]",
        "the dsv3-tp8 model preset: DeepSeek-V3 / Kimi-K2 attention as one TP-8 shard",
    ],
    versions=["torch", "triton", "nvcc", "sglang"],  # recorded with every run, besides python and the orchestrator
    inputs=["bench/**/*.py", "engine/**/*.py", "engine/kv/csrc/**", "kernels/**/*.py", "kernels/csrc/**", "integrations/**/*.py",
            "phases/__init__.py", "phases/models.py", "phases/phase2/**/*.py", "gates/**/*.py"],
    gates=[
        TokenExactGateSpec(
            name="token_exact", requires=["cuda"], min_prompts=16, max_new_tokens=32, min_exact_fraction=1.0,
            tie_margin=0.1, max_near_tie_prompts=1,
            description="tree speculative decoding (DDTree budget 64 and ngram budget 16) on the kernel backend "
                        "== plain greedy decoding on the oracle backend, bf16, 16 prompts of which 2 have "
                        ">= 32768 tokens (figure longest_prompt >= 32768); first divergence reported. A flip "
                        "to the oracle's runner-up where its top-1/top-2 margin is < 0.1 logits is a near-tie "
                        "(bf16 rounding moves a margin by a few hundredths of a logit, far below the "
                        "median margin, so any correct kernel picks the runner-up there about half the "
                        "time), reported and allowed in at most 1 prompt"),
        AccuracyGateSpec(
            name="sglang_parity", requires=["cuda", "triton"], trials=3, max_rel_l2=1e-2, max_abs=5e-2,
            check_lse=False,
            description="the SGLang backend's MLA target-verify path (KV write, converter, kernel) vs SGLang "
                        "0.5.23's own extend_attention_fwd, same SGLang-format inputs: fresh random trees and "
                        "lengths per trial, bool/uint8 masks, int32/int64 qo_indptr, a mask that is not "
                        "ancestor-closed, CUDA-graph padding rows (finite), a 32k prefix; outputs poisoned"),
        SpeedupGateSpec(
            name="verify_speedup", requires=["cuda", "triton"], baseline="triton backend",
            min_median_speedup=2.0, min_each_speedup=1.2, warmup=3, repeats=15, agree_max_rel_l2=2e-2,
            description="one whole verify step of the dsv3-tp8 model (8 layers; every layer's attention, "
                        "projections, MLPs, KV writes, head, metadata), B=2, a 64-node tree, kernel backend vs "
                        "Triton backend interleaved, at L = 4k, 32k, 128k; logits agree first; the step's GPU "
                        "time (CUDA events, each step queued behind a 30 ms GPU busy-wait so that the Python "
                        "enqueue is hidden, as in a CUDA-graph replay); eager wall-clock ratios "
                        "(eager_speedup_*), step time broken down (attention, conversion, rest) and the SGLang "
                        "converter's share of one kernel call in the details; the sm_120 path's step timed in "
                        "the same rounds (sm120_path_speedup_*, reported; it must agree too)"),
        MetricGateSpec(
            name="decode_speedup", requires=["cuda", "triton"],
            thresholds=[
                Threshold(figure="decode_speedup_32k", op=">=", value=1.5, unit="x"),
                Threshold(figure="decode_speedup_128k", op=">=", value=1.5, unit="x"),
                Threshold(figure="same_tokens", op="==", value=1.0),
                Threshold(figure="rounds_per_arm", op=">=", value=5),
                Threshold(figure="new_tokens_per_request", op=">=", value=64),
            ],
            description="end-to-end DDTree speculative decoding (budget 64, 64 new tokens per request) of the "
                        "dsv3-tp8 model through the decode benchmark (kdtree.bench.decode, python -m "
                        "kdtree.tools.decode): after one shared prefill, every arm decodes the same requests from "
                        "the same state, 5 interleaved rounds each, every round recorded: the kernel backend and "
                        "the Triton backend as SGLang 0.5.23 serves MLA (its extend kernel for verify with static "
                        "buffers sized for the bucket, its decode kernel for the draft passes), each with CUDA "
                        "graphs (verify steps and draft decode passes captured once per bucket and replayed) and "
                        "eagerly, at L = 32k (B=2) and 128k (B=1). decode_speedup_* is the ratio of median decode "
                        "tokens/s with graphs (its Hodges-Lehmann interval as _low/_high; eager_decode_speedup_* "
                        "beside it), decode_spread_* the largest max/min over rounds of the arms that decide; all "
                        "emit the same tokens; the sm_120 path decoded in the same rounds "
                        "(sm120_path_decode_speedup_*, reported); a step breakdown per arm (GPU time of attention, "
                        "rest of model, drafting, conversion; host time not hidden behind the GPU)"),
    ],
)

# The targets (not blocking): figure names of the gates above, the bound, and the gate.
# The lead moves these into the spec's `targets` field once gates/spec.py has it.
TARGETS = {
    "decode_speedup_32k": {"gate": "decode_speedup", "op": ">=", "value": 3.0, "unit": "x",
                           "note": "median decode tokens/s with CUDA graphs, kernel / SGLang's Triton backend"},
    "decode_speedup_128k": {"gate": "decode_speedup", "op": ">=", "value": 5.0, "unit": "x",
                            "note": "median decode tokens/s with CUDA graphs, kernel / SGLang's Triton backend"},
    "sm120_path_decode_speedup_32k": {"gate": "decode_speedup", "op": ">=", "value": 2.5, "unit": "x",
                                      "note": "the sm_120 path forced, with CUDA graphs, / SGLang's Triton backend"},
    "decode_spread_max": {"gate": "decode_speedup", "op": "<", "value": 1.15,
                          "note": "max/min tokens/s over rounds, worst arm that decides, every context"},
    "converter_fraction_32k": {"gate": "verify_speedup", "op": "<", "value": 0.10,
                               "note": "SGLang converter GPU time / one kernel call, same batch"},
    "converter_fraction_128k": {"gate": "verify_speedup", "op": "<", "value": 0.10},
    "exact_fraction": {"gate": "token_exact", "op": ">=", "value": 1.0},
}

_by_gate: dict[str, list] = {}
for _figure, _t in TARGETS.items():
    _by_gate.setdefault(_t["gate"], []).append(
        Target(figure=_figure, op=_t["op"], value=_t["value"], unit=_t.get("unit", ""), note=_t.get("note", "")))
SPEC = with_targets(SPEC, _by_gate)

# gate -> its check, "module:function", imported when the gate runs (kdtree.orchestrator.plan)
CHECKS = {
    "token_exact": "kdtree.phases.phase2.checks:check_token_exact",
    "sglang_parity": "kdtree.phases.phase2.checks:check_sglang_parity",
    "verify_speedup": "kdtree.phases.phase2.checks:check_verify_speedup",
    "decode_speedup": "kdtree.phases.phase2.checks:check_decode_speedup",
}
