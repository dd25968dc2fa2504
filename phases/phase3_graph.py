"""Phase 3: the verify path captured in CUDA graphs.

Gates: replay equals eager on fresh inputs (bitwise: same kernel, same inputs), nothing in the
captured region syncs the host or allocates, and replay is faster than eager. Until the captured
path exists, the checks report ``not-implemented``.
"""

from __future__ import annotations

from kdtree.gates.spec import GraphSafetyGateSpec, MetricGateSpec, PhaseSpec, Threshold
from kdtree.phases import not_yet_checks

SPEC = PhaseSpec(
    id="phase3",
    title="graph capture",
    objective=("The verify step (attention metadata, kernel, accept) captured once per batch-size / "
               "tree-budget bucket into CUDA graphs and replayed with fresh inputs written into "
               "static buffers."),
    deliverables=[
        "static-buffer metadata for the backend (indptr, indices, packed masks) sized per bucket",
        "capture / replay in the speculative loop, with eager fallback outside the buckets",
    ],
    inputs=["engine/**/*.py", "kernels/**/*.py", "kernels/csrc/**", "phases/phase3_graph.py",
            "gates/**/*.py"],
    gates=[
        GraphSafetyGateSpec(
            name="replay_equal", requires=["cuda"], replays=16, max_rel_l2=0.0,
            description="each replay on fresh inputs == eager on the same inputs, bitwise"),
        MetricGateSpec(
            name="capture_clean", requires=["cuda"],
            thresholds=[
                Threshold(figure="host_syncs_in_capture", op="==", value=0),
                Threshold(figure="allocations_in_capture", op="==", value=0, unit=" B"),
            ],
            description="the captured region neither synchronises the host nor allocates device memory"),
        GraphSafetyGateSpec(
            name="replay_speedup", requires=["cuda"], replays=16, max_rel_l2=0.0,
            min_replay_speedup=1.2,
            description="median verify-step time, eager / replay, at small batch where launches dominate"),
    ],
)

_NO_CAPTURE = "the CUDA-graph verify path does not exist yet"

CHECKS = not_yet_checks(SPEC, _NO_CAPTURE)
