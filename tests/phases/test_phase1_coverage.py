"""Phase 1's coverage cases (issue 12 item 5), on the CPU: the accuracy gate's case list for the
owned kernel holds every variant on every case, split counts around the ones a 188-SM and a
132-SM card choose, and cases whose slots sit past 2^31 elements; a coverage case's inputs force
the launch it names."""

from __future__ import annotations

import dataclasses
import math

from kdtree.gates.base import GateContext
from kdtree.kernels.device_facts import DeviceFacts
from kdtree.kernels.launch_plan import VARIANTS, plan, runnable_variants
from kdtree.bench import coverage_cases as cov
from kdtree.phases import phase1
from kdtree.phases.phase1 import checks as phase1_checks


def _cases():
    return cov.coverage_cases(phase1_checks.ACCURACY_CASES)


def test_every_case_runs_through_every_variant_including_base32():
    forced = {(c.name.rsplit(" [", 1)[0], c.variant) for c in _cases() if c.variant and not c.min_slot}
    for name, *_ in phase1_checks.ACCURACY_CASES:
        assert {v for n, v in forced if n == name} == set(VARIANTS), name
    assert "base32" in VARIANTS


def test_split_counts_around_what_a_188_sm_card_chooses():
    name, H, reqs, _ = next(c for c in phase1_checks.ACCURACY_CASES if c[0] == "H16 T33 L16k")
    choice = plan(33, H, 1, math.ceil(33 / 32), 33 + 16384, DeviceFacts(188, (12, 0))).num_splits
    h200 = plan(33, H, 1, math.ceil(33 / 32), 33 + 16384, DeviceFacts(132, (9, 0))).num_splits
    assert choice != h200  # the H200 alone would never run the 188-SM card's choice
    got = {c.num_splits for c in _cases() if c.name.startswith(name + " [splits")}
    assert {choice - 1, choice, choice + 1, h200 - 1, h200, h200 + 1} <= got
    assert {188, 132} <= {c.num_splits for c in _cases() if c.name.startswith("H8 T4 L32k [splits")}


def test_cases_with_slots_past_2_to_the_31_elements():
    big = [c for c in _cases() if c.min_slot]
    assert big and all(c.min_slot * 576 >= 2**31 and c.pool_slots * 576 > 2**31 for c in big)
    assert {c.variant for c in big} == {None, *VARIANTS}
    small = dataclasses.replace(big[0], pool_slots=5000, min_slot=3000, requests=[(5, 40)])
    inputs = small.make_inputs(3, "cpu")
    assert int(inputs["kv_indices"].min()) >= 3000 and inputs["kv_cache"].shape[0] == 5000
    assert (inputs["launch"].variant, inputs["launch"].num_splits) == (big[0].variant, None)


def test_the_accuracy_gate_adds_them_for_the_owned_kernel_only(monkeypatch):
    seen = {}

    def record(spec, cases, candidate, oracle, ctx, **options):
        seen["names"] = [c.name for c in cases]
        return "recorded"

    import kdtree.gates.accuracy as accuracy

    monkeypatch.setattr(accuracy, "check_accuracy", record)
    spec = phase1.SPEC.gate("accuracy")
    assert phase1_checks.check_accuracy(spec, GateContext(device="cpu")) == "recorded"
    assert {c.name for c in _cases()} <= set(seen["names"])
    phase1_checks.check_accuracy(spec, GateContext(device="cpu"), candidate_fn=lambda *a, **k: None)
    assert not any("[" in n for n in seen["names"])  # another candidate: the plain cases only


def test_cases_follow_the_variants_the_device_runs():
    for cap, has_wgmma in [((9, 0), True), ((12, 0), False), ((8, 0), False)]:
        cases = cov.coverage_cases(phase1_checks.ACCURACY_CASES, runnable_variants(cap))
        variants = {c.variant for c in cases if c.variant}
        assert variants == set(runnable_variants(cap)), cap
        assert ("wgmma" in variants) is has_wgmma
        assert any(c.name.endswith("[wgmma]") for c in cases) is has_wgmma
    assert cov.device_variants("cpu") == list(VARIANTS)  # no device: the whole list (nothing runs)
