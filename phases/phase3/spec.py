"""Phase 3: the verify path captured in CUDA graphs, in the engine and in SGLang.

Gates: every captured launch and whole verify step replays == eager, bitwise, on fresh inputs
across each bucket's lengths, batch sizes and tree sizes (padded rows included), and the
bucket-planned launch matches the fp64 oracle; nothing in a capture synchronises the host (sync
debug mode "error"), the kernel launch and SGLang's converter allocate nothing even in capture,
and no replay or engine graph step allocates; a whole verify step replayed is faster than
eager at small batch, and decoding with graphs emits the same tokens. Thresholds (here) say the
phase is done; the targets are the issue's goals, recorded, never blocking.

The checks live in `checks`.
"""

from __future__ import annotations

from kdtree.gates.spec import GraphSafetyGateSpec, MetricGateSpec, PhaseSpec, Target, Threshold
from kdtree.phases import with_targets

# What the gates measure, as data. Launch buckets: (batch, tree, context, heads, forced variant);
# step buckets: (batch, tree, context) of the tiny model (positions up to 4096); the captured
# launch's loss: (batch, tree) buckets at 16 heads, at each bucket size, over lengths from
# max(32k, half + 1) to the size; graph buffers against SGLang's verify mask: (batch, tree) at 128k.
LAUNCH_BUCKETS = [(1, 4, 32768, 8, None), (4, 16, 4096, 16, None), (2, 64, 8192, 16, None),
                  (3, 32, 4096, 16, "base32"), (2, 128, 4096, 64, None)]
STEP_BUCKETS = [(1, 8, 4096), (4, 16, 4096), (2, 64, 2048)]
REPLAY_EQUAL = {"full": {"launch_buckets": LAUNCH_BUCKETS, "step_buckets": STEP_BUCKETS, "step_preset": "tiny"}}
CAPTURE_CLEAN = {"full": {"launch_buckets": LAUNCH_BUCKETS, "step_buckets": STEP_BUCKETS[:1], "step_preset": "tiny",
                          "engine_steps": 6, "buffer_context": 131072,
                          "buffer_buckets": [(8, 16), (8, 64), (1, 512), (8, 512)]}}
REPLAY_SPEEDUP = {"full": {"batches": [1, 4], "context": 4096, "tree": 16, "decode_new_tokens": 24,
                           "loss_buckets": [(1, 16), (1, 64), (4, 16), (4, 64)],
                           "loss_contexts": [32768, 65536, 131072], "loss_heads": 16}}

SPEC = PhaseSpec(
    id="phase3",
    title="graph capture",
    objective=("The verify step (attention metadata, kernel, every layer, head) captured once per batch-size / "
               "tree-budget / context bucket into CUDA graphs and replayed with fresh inputs written into "
               "static buffers, in the engine and through SGLang 0.5.23's graph API for target verify."),
    deliverables=[
        "kdtree.kernels.plan_bucket: one launch plan per bucket, split count weighed over the "
        "bucket's lengths, held and launched as it is (launch(plan=)) in graph mode",
        "kdtree.engine.decode.graph_capture: static buffers sized by tokens and tree words, capture per bucket with one "
        "shared memory pool, eager fallback; `python -m kdtree.engine generate --cuda-graph/--no-cuda-graph`",
        "kdtree.integrations.sglang: init_cuda_graph_state / init_forward_metadata_out_graph / _in_graph / "
        "get_cuda_graph_seq_len_fill_value for target verify",
    ],
    versions=["torch", "triton", "nvcc"],  # recorded with every run, besides python and the orchestrator
    inputs=["bench/**/*.py", "engine/**/*.py", "engine/kv/csrc/**", "kernels/**/*.py", "kernels/csrc/**", "integrations/**/*.py",
            "phases/__init__.py", "phases/models.py", "phases/phase3/**/*.py", "gates/**/*.py"],
    gates=[
        GraphSafetyGateSpec(
            name="replay_equal", requires=["cuda"], replays=16, max_rel_l2=0.0, workload=REPLAY_EQUAL,
            description="each replay on fresh inputs == eager on the same inputs, bitwise: kernel launches with "
                        "a bucket's plan (live requests 1..B, the rest padded; tree sizes 1..T with padded rows "
                        "whose mask rows are garbage; prefixes 0..L; fresh slots, q, KV; variants auto and base32) "
                        "and whole engine verify steps (metadata conversion, every layer, head); the bucket-planned "
                        "launch vs the fp64 oracle (bucket_plan_vs_oracle_rel_l2 <= 1e-2)"),
        MetricGateSpec(
            name="capture_clean", requires=["cuda"], workload=CAPTURE_CLEAN,
            thresholds=[
                Threshold(figure="host_syncs_in_capture", op="==", value=0),
                Threshold(figure="allocations_in_capture", op="==", value=0, unit=" B"),
                Threshold(figure="allocations_in_replay", op="==", value=0),
                Threshold(figure="capture_failures", op="==", value=0),
            ],
            description="captures under torch.cuda.set_sync_debug_mode('error'): no host sync; the kernel launch "
                        "and SGLang's converter allocate nothing even in capture (a model step's intermediates "
                        "come from the graph pool: pool_allocations_in_capture, recorded); the caching "
                        "allocator's counters unchanged over every replay and over the engine's graph steps; "
                        "our packed verify mask vs SGLang's verify mask at 128k (packed_mask_ratio_128k; the whole graph "
                        "buffers: mask_buffer_ratio_*)"),
        GraphSafetyGateSpec(
            name="replay_speedup", requires=["cuda"], replays=16, max_rel_l2=0.0, workload=REPLAY_SPEEDUP,
            min_replay_speedup=1.2, warmup=3, repeats=20,
            description="a whole verify step of the dsv3-tp8 model (8 layers, 16 heads, T=16), the engine's graph "
                        "path (staging copies + replay) vs its eager path on the kernel backend, interleaved, "
                        "host time included, median over B in {1, 4} at L=4k (logits agree first); decode "
                        "tokens/s with vs without graphs (same tokens); captured launch vs an eager launch "
                        "planned for the exact length, GPU time, L >= 32k (captured_launch_loss_*)"),
    ],
)

SPEC = with_targets(SPEC, {
    "replay_speedup": [
        Target(figure="replay_speedup_b1", op=">=", value=1.5, unit="x",
               note="whole verify step, replay vs eager, B=1, L=4k"),
        Target(figure="captured_launch_loss_max", op="<=", value=0.05,
               note="captured launch time / exact-length eager launch - 1, worst at L >= 32k"),
    ],
    "capture_clean": [
        Target(figure="packed_mask_ratio_128k", op=">=", value=100.0, unit="x",
               note="SGLang Triton's verify mask bytes / our verify mask's bytes (the packed ancestor mask), "
                    "same bucket, 128k, worst bucket; the whole graph buffers, which also hold the prefix slot "
                    "lists SGLang keeps too, are mask_buffer_ratio_128k (reported)"),
    ],
})

# gate -> its check, "module:function", imported when the gate runs (kdtree.orchestrator.plan)
CHECKS = {
    "replay_equal": "kdtree.phases.phase3.checks:check_replay_equal",
    "capture_clean": "kdtree.phases.phase3.checks:check_capture_clean",
    "replay_speedup": "kdtree.phases.phase3.checks:check_replay_speedup",
}
