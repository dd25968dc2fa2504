"""Phase 3's gates: the spec on the CPU; on the GPU each gate passes on the real captured path
and fails, for the stated reason, on broken candidates (a launch that syncs, one that allocates,
one whose split ranges are frozen at the capture-time lengths, a graph step that allocates, a
launch whose replay equals its eager call but both are wrong)."""

from __future__ import annotations

import pytest

from kdtree.bench import graph_cases
from kdtree.bench.verify_step import StepInputs
from kdtree.gates.base import GateContext, Outcome
from kdtree.orchestrator.plan import resolve_check
from kdtree.phases import phase3
from kdtree.phases.phase3 import checks as phase3_checks

SPEC = phase3.SPEC


def fig(result, name):
    return next(f for f in result.figures if f.name == name)


def test_every_gate_has_a_real_check():
    assert set(phase3.CHECKS) == {g.name for g in SPEC.gates}
    assert all(resolve_check(ref).__module__ == "kdtree.phases.phase3.checks" for ref in phase3.CHECKS.values())


def test_thresholds_are_the_phases_and_the_issues_targets_are_set():
    held = {t.figure: (t.op, t.value) for t in SPEC.gate("capture_clean").thresholds}
    assert held["host_syncs_in_capture"] == ("==", 0) and held["allocations_in_capture"] == ("==", 0)
    assert held["allocations_in_replay"] == ("==", 0)
    assert SPEC.gate("replay_equal").max_rel_l2 == 0.0 and SPEC.gate("replay_equal").replays >= 16
    assert SPEC.gate("replay_speedup").min_replay_speedup == 1.2
    targets = {t.figure: (t.op, t.value) for g in SPEC.gates for t in g.targets}
    assert targets == {"replay_speedup_b1": (">=", 1.5), "captured_launch_loss_max": ("<=", 0.05),
                       "packed_mask_ratio_128k": (">=", 100.0)}  # the verify mask's bytes (issue 30)


def test_the_buffer_target_is_held_on_the_verify_masks_bytes_and_the_whole_buffers_stay_reported():
    from kdtree.gates.base import Figure, GateResult, Outcome
    from kdtree.orchestrator.targets import evaluate_target

    (target,) = SPEC.gate("capture_clean").targets
    assert "mask_buffer_ratio_128k" in target.note and "reported" in target.note
    rows = _buffers()
    packed = min(r["mask_only_ratio"] for r in rows)
    whole = min(r["ratio"] for r in rows)
    assert packed > 1000 and whole < 100  # ~2056x and ~4x: the target reads the first
    result = GateResult(gate="capture_clean", kind="metric", outcome=Outcome.PASSED,
                        figures=[Figure(name="packed_mask_ratio_128k", value=packed),
                                 Figure(name="mask_buffer_ratio_128k", value=whole)])
    assert evaluate_target("capture_clean", target, result).status == "met"
    result.figures[0] = Figure(name="packed_mask_ratio_128k", value=whole)  # a mask as big as the buffers
    assert evaluate_target("capture_clean", target, result).status == "not met"


def test_buffer_comparison_is_sglangs_mask_over_our_buffers():
    rows = {(r["batch"], r["tree"]): r for r in _buffers()}
    r = rows[(8, 64)]
    assert r["sglang_mask_bytes"] == 8 * 64 * (131072 + 64)
    assert r["ratio"] == pytest.approx(r["sglang_mask_bytes"] / r["graph_buffer_bytes"])
    assert 15 < r["ratio"] < 17 and rows[(1, 512)]["ratio"] > 100
    assert r["graph_mask_bytes"] == 8 * 64 * 2 * 4  # the packed mask: two words a row


def _buffers():
    w = SPEC.gate("capture_clean").workload["full"]
    return graph_cases.buffer_comparison(w["buffer_context"], w["buffer_buckets"])


def test_phase_module_imports_no_torch():
    import subprocess
    import sys

    code = ("import sys; import kdtree.phases.phase3; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# --- GPU ------------------------------------------------------------------------------------------
GPU = GateContext(device="cuda")
SMALL_LAUNCH = ((1, 4, 8192, 8, None), (3, 16, 2048, 16, None), (2, 64, 1024, 16, "base32"))
SMALL_STEP = ((2, 8, 1024),)


def small(name, **update):
    return SPEC.gate(name).model_copy(update={"replays": 6, **update})


@pytest.mark.gpu
def test_gpu_replay_equal_passes_on_the_real_path():
    r = phase3_checks.check_replay_equal(small("replay_equal"), GPU, launch_buckets=SMALL_LAUNCH, step_buckets=SMALL_STEP)
    assert r.outcome is Outcome.PASSED, r.summary
    assert fig(r, "worst_rel_l2").value == 0 and fig(r, "bucket_plan_vs_oracle_rel_l2").value < 1e-2
    assert fig(r, "replays_compared").value == 6 * (len(SMALL_LAUNCH) + len(SMALL_STEP))


def frozen_ranges(plan):
    """Splits cut from the kv_indptr seen first (the capture-time lengths): a frozen grid."""
    real = graph_cases.bucket_launch(plan)
    first = {}

    def fn(inputs, outputs):
        if not first:  # the first call is the warm-up on the static buffers, just before capture
            first.update(indptr=inputs["kv_indptr"], frozen=inputs["kv_indptr"].clone())
        indptr = first["frozen"] if inputs["kv_indptr"] is first["indptr"] else inputs["kv_indptr"]
        real({**inputs, "kv_indptr": indptr}, outputs)
    return fn


@pytest.mark.gpu
def test_gpu_replay_equal_fails_on_ranges_frozen_at_capture():
    r = phase3_checks.check_replay_equal(small("replay_equal"), GPU, launch_candidate=frozen_ranges,
                                       launch_buckets=SMALL_LAUNCH, step_buckets=(), with_oracle=False)
    assert r.outcome is Outcome.FAILED and not fig(r, "worst_rel_l2").ok
    assert fig(r, "allocations_in_capture").ok and fig(r, "capture_failures").ok  # only the replays are wrong
    assert "replay" in r.summary  # the replays are what fail (wrong values, or NaN lse where it is finite)


def leaky(plan):
    """Replays equal their eager calls, but every row sees the whole tree: only the oracle sees it."""
    real = graph_cases.bucket_launch(plan)

    def fn(inputs, outputs):
        inputs["tree_mask"].fill_(-1)
        real(inputs, outputs)
    return fn


@pytest.mark.gpu
def test_gpu_replay_equal_fails_when_replay_and_eager_are_wrong_together():
    r = phase3_checks.check_replay_equal(small("replay_equal"), GPU, launch_candidate=leaky,
                                       launch_buckets=SMALL_LAUNCH[1:2], step_buckets=())
    assert r.outcome is Outcome.FAILED
    assert fig(r, "worst_rel_l2").ok and not fig(r, "bucket_plan_vs_oracle_rel_l2").ok
    assert "off the oracle" in r.summary


def clean_kwargs():
    return dict(launch_buckets=SMALL_LAUNCH, step_buckets=SMALL_STEP, with_converter=None, engine_steps=3)


@pytest.mark.gpu
def test_gpu_capture_clean_passes_on_the_real_path():
    r = phase3_checks.check_capture_clean(SPEC.gate("capture_clean"), GPU, **clean_kwargs())
    assert r.outcome is Outcome.PASSED, r.summary
    assert fig(r, "allocations_in_capture").value == 0 and fig(r, "allocations_in_replay").value == 0
    assert fig(r, "engine_graph_steps").value >= 3


def syncing(plan):
    real = graph_cases.bucket_launch(plan)

    def fn(inputs, outputs):
        if int(inputs["kv_indptr"][-1]) < 0:  # a device-to-host read before the launch
            raise AssertionError
        real(inputs, outputs)
    return fn


@pytest.mark.gpu
def test_gpu_capture_clean_fails_on_a_launch_that_syncs():
    r = phase3_checks.check_capture_clean(SPEC.gate("capture_clean"), GPU, launch_candidate=syncing, **clean_kwargs())
    assert r.outcome is Outcome.FAILED
    assert fig(r, "host_syncs_in_capture").value >= 1 and not fig(r, "host_syncs_in_capture").ok
    assert "host sync during capture" in r.summary


def allocating(plan):
    from kdtree.kernels.cuda_op import launch

    def fn(inputs, outputs):
        out = launch(inputs["q"], inputs["kv_cache"], inputs["qo_indptr"], inputs["kv_indptr"], inputs["kv_indices"],
                     inputs["tree_mask"], graph_cases.SM_SCALE, plan=plan)  # no out=: the launch allocates it
        outputs["out"].copy_(out)
        outputs["lse"].zero_()
    return fn


@pytest.mark.gpu
def test_gpu_capture_clean_fails_on_a_launch_that_allocates():
    r = phase3_checks.check_capture_clean(SPEC.gate("capture_clean"), GPU, launch_candidate=allocating, **clean_kwargs())
    assert r.outcome is Outcome.FAILED
    assert fig(r, "allocations_in_capture").value > 0 and not fig(r, "allocations_in_capture").ok
    assert "allocations during capture" in r.summary


@pytest.mark.gpu
def test_gpu_capture_clean_fails_on_graph_steps_that_allocate():
    from kdtree.engine.decode.graph_capture import VerifyGraphs

    class Cloning(VerifyGraphs):
        def verify_logits(self, *args):
            out = super().verify_logits(*args)
            return None if out is None else out.clone()

    r = phase3_checks.check_capture_clean(SPEC.gate("capture_clean"), GPU, graphs_factory=Cloning, **clean_kwargs())
    assert r.outcome is Outcome.FAILED
    assert fig(r, "allocations_in_replay").value > 0 and "allocations_in_replay" in r.summary


@pytest.mark.gpu
def test_gpu_replay_speedup_measures_every_figure():
    # speed is not asserted here (tiny sizes); the gate's figures and agreement checks are
    r = phase3_checks.check_replay_speedup(SPEC.gate("replay_speedup").model_copy(update={"repeats": 3}), GPU,
                                         preset_name="tiny", batches=(1,), context=1024, tree=8,
                                         loss_buckets=((1, 16),), loss_contexts=(32768,), decode_new_tokens=6)
    assert r.outcome in (Outcome.PASSED, Outcome.FAILED), r.summary
    names = {f.name for f in r.figures}
    assert {"replay_speedup", "replay_speedup_b1", "decode_graph_speedup", "captured_launch_loss_max"} <= names
    assert fig(r, "logit_disagreements").value == 0 and fig(r, "decode_same_tokens").value == 1
    assert fig(r, "captured_launch_disagreements").value == 0


def test_launch_inputs_keep_their_shapes_and_vary_what_a_graph_must_not_freeze():
    import torch

    from kdtree.engine.decode.graph_capture import Bucket
    from kdtree.kernels.reference import tree_verify_mla_reference

    bucket = Bucket(3, 16, 256)
    draws = [graph_cases.launch_inputs(bucket, 2, seed, "cpu") for seed in range(12)]
    assert len({tuple((k, tuple(v.shape), v.dtype) for k, v in d.items()) for d in draws}) == 1
    lives = {int((d["qo_indptr"][1:] > d["qo_indptr"][:-1]).sum()) for d in draws}
    lens = {int(d["kv_indptr"][1] - d["qo_indptr"][1]) for d in draws}
    assert len(lives) > 1 and 0 in lens and 256 in lens and len(lens) > 3  # padded requests; L from 0 to max
    assert any(int(d["qo_indptr"][-1]) < bucket.rows for d in draws)  # padded rows
    for d in draws[:4]:  # the live part is a valid op-contract call
        qo, kv = d["qo_indptr"].tolist(), d["kv_indptr"].tolist()
        live = sum(1 for b in range(3) if qo[b + 1] > qo[b])
        n, k = qo[live], kv[live]
        out = tree_verify_mla_reference(d["q"][:n].contiguous(), d["kv_cache"], d["qo_indptr"][: live + 1],
                                        d["kv_indptr"][: live + 1], d["kv_indices"][:k].contiguous(),
                                        d["tree_mask"][:n].contiguous(), graph_cases.SM_SCALE)
        assert torch.isfinite(out.float()).all()
        assert len(set(d["kv_indices"][:k].tolist())) == k  # fresh, distinct slots


@pytest.mark.slow
def test_step_draws_keep_their_shapes_and_use_disjoint_slots():
    from kdtree.engine import build_model, preset
    from kdtree.engine.decode.graph_capture import STAGE_FIELDS, Bucket

    setup = StepInputs(build_model(preset("tiny"), seed=0), Bucket(2, 8, 512))
    draws = [setup.draw(seed, "cpu") for seed in range(8)]
    assert len({(tuple(d["stage"].shape), tuple(d["kv_indices"].shape)) for d in draws}) == 1
    r = setup.bucket.rows
    for d in draws:
        stage = d["stage"].view(-1)
        slots = stage[2 * r: 3 * r].tolist()
        qo = stage[STAGE_FIELDS * r: STAGE_FIELDS * r + 3].tolist()
        kv = stage[STAGE_FIELDS * r + 3:].tolist()
        live_slots = slots[: qo[-1]]
        prefixes = d["kv_indices"][: kv[-1]].tolist()
        assert setup.scratch not in prefixes and set(slots[qo[-1]:]) <= {setup.scratch}
        tree_positions = set(stage[5 * r: 5 * r + qo[-1]].tolist())
        prefix_slots = {s for i, s in enumerate(prefixes) if i not in tree_positions}
        assert not prefix_slots & set(live_slots)  # a tree slot is never another request's prefix
