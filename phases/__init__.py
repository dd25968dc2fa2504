"""The plan's phases, one module each, in the order they must pass:

phase1_kernel, phase2_backend, phase3_graph, phase4_defrag.

Each module exports ``SPEC`` (a `kdtree.gates.spec.PhaseSpec`: objective, deliverables, input
globs and gates with their thresholds) and ``CHECKS`` (gate name -> ``check(spec, ctx) ->
GateResult``). Phase modules import no orchestrator code and keep torch imports inside their
check functions, so loading a SPEC is cheap. The plan that lists them is
`kdtree.orchestrator.plan.DEFAULT_PLAN`.
"""

from typing import Callable  # noqa: E402

from kdtree.gates.base import GateContext, GateResult, not_implemented  # noqa: E402
from kdtree.gates.spec import PhaseSpec  # noqa: E402


def not_yet_checks(spec: PhaseSpec, reason: str) -> dict[str, Callable[..., GateResult]]:
    """CHECKS for a phase whose work does not exist yet: every gate reports ``not-implemented``
    with `reason` (a failure, never a pass) until a real check replaces it."""

    def pending(gate_spec, ctx: GateContext) -> GateResult:
        return not_implemented(gate_spec.name, gate_spec.kind, reason)

    return {gate.name: pending for gate in spec.gates}


def with_targets(spec: PhaseSpec, targets: dict[str, list]) -> PhaseSpec:
    """``spec`` with ``targets[gate name]`` (a list of `kdtree.gates.spec.Target`) set on its gates.

    A name that is no gate of the spec is refused: a target that silently attaches to nothing
    would read as "not measured" forever."""
    unknown = set(targets) - {gate.name for gate in spec.gates}
    if unknown:
        raise ValueError(f"{spec.id}: targets name gates the spec lacks: {sorted(unknown)}")
    gates = [gate.model_copy(update={"targets": list(gate.targets) + list(targets.get(gate.name, []))})
             for gate in spec.gates]
    return spec.model_copy(update={"gates": gates})
