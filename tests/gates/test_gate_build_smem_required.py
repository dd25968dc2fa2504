"""Build gate, dynamic shared memory read from the binary: with ``dynamic_smem_required`` an entry
kernel that the figures do not name fails (it would otherwise count as 0 bytes), and the
figures' source is recorded. Synthetic ptxas logs, no nvcc needed."""

from __future__ import annotations

from kdtree.gates.base import GateContext, Outcome, run_check
from kdtree.gates.build import BuildOutput, check_build
from kdtree.gates.spec import BuildGateSpec
from ptxas_logs import ptxas_log

LOG = ptxas_log("sm_90", ("_Z4big1v", 100, 0, 1), ("_Z4big2v", 90, 0, 1))


def _gate(figures: dict, required: bool):
    spec = BuildGateSpec(name="build", archs=["sm_90"], max_spill_bytes=0, max_stack_bytes=0,
                         max_shared_bytes=101376, forbidden_sass=[])
    out = BuildOutput(ptxas_log=LOG, dynamic_smem_bytes=figures, dynamic_smem_required=required,
                      dynamic_smem_source="records in the object")
    return run_check(spec, lambda s, c: check_build(s, lambda arch: out, c), GateContext(device="cpu"))


def test_a_kernel_missing_from_the_binary_figures_fails_when_they_are_required():
    result = _gate({"_Z4big1v": 90000}, required=True)
    assert result.outcome is Outcome.FAILED
    assert "_Z4big2v: no dynamic shared-memory figure for this kernel (records in the object do not name it)" \
        in result.summary
    assert result.details["dynamic_smem_sources"] == {"sm_90": "records in the object"}


def test_complete_figures_pass_and_optional_ones_keep_the_old_behaviour():
    assert _gate({"_Z4big1v": 90000, "_Z4big2v": 0}, required=True).outcome is Outcome.PASSED
    assert _gate({"_Z4big1v": 90000}, required=False).outcome is Outcome.PASSED
    over = _gate({"_Z4big1v": 101377, "_Z4big2v": 0}, required=True)
    assert over.outcome is Outcome.FAILED and "101377 B dynamic > 101376 B" in over.summary
