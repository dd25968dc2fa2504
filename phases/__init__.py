"""The plan's phases, one package each, in the order they must pass: phase1 (kernel), phase2
(backend), phase3 (graph capture), phase4 (defrag); pyproject's ``[tool.orchestrate] phases``
lists them.

Each package exports ``SPEC`` (a `kdtree.gates.spec.PhaseSpec`: objective, deliverables, input
globs and gates with their thresholds, in its ``spec`` module) and ``CHECKS`` (gate name ->
``"module:function"`` of its check, ``check(spec, ctx) -> GateResult``, in its ``checks``
module). The orchestrator imports a check module only when one of its gates runs, so the
specs import no torch and loading the plan is cheap; the check modules import what they use at
their top. `models` holds what several phases measure on (the speed preset, the shared model).
"""

from typing import Callable

from kdtree.gates.base import GateContext, GateResult, not_implemented
from kdtree.gates.spec import PhaseSpec


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
