"""Gate targets: evaluated on a gate's recorded figures, shown met / not met with the margin.

A gate's thresholds decide its outcome (and so the phase's state); its targets
(`kdtree.gates.spec.Target`) say how far the work is from the best in the field and decide
nothing. `evaluate_targets` runs after the gates and its results are stored in the run record.
A target is "not measured" (with the reason) when its gate did not run, was skipped, is not
implemented, ended in error, or recorded no such figure or a NaN.
"""

from __future__ import annotations

from typing import Optional

from kdtree.gates.base import GateResult, Outcome, compare, fmt_number  # noqa: F401 - fmt_number re-exported
from kdtree.gates.spec import PhaseSpec, Target
from kdtree.orchestrator.specs import RunRecord, TargetResult


def _margin(value: float, op: str, target: float) -> tuple[float, Optional[float]]:
    if op in (">=", ">"):
        ratio = value / target if target > 0 and value >= 0 else None
        return value - target, ratio
    if op in ("<=", "<"):
        ratio = target / value if value > 0 and target >= 0 else None
        return target - value, ratio
    return -abs(value - target), None


def _not_measured(gate: str, t: Target, reason: str) -> TargetResult:
    return TargetResult(gate=gate, figure=t.figure, op=t.op, target=t.value, unit=t.unit,
                        note=t.note, status="not measured", reason=reason)


def evaluate_target(gate: str, t: Target, result: Optional[GateResult]) -> TargetResult:
    """One target against one gate's result (None: the gate did not run)."""
    if result is None:
        return _not_measured(gate, t, "the gate did not run in this run")
    if result.outcome in (Outcome.SKIPPED, Outcome.NOT_IMPLEMENTED):
        return _not_measured(gate, t, f"the gate was {result.outcome.value}: "
                                      f"{result.reason or result.summary or 'no reason given'}")
    if result.outcome is Outcome.ERROR:
        return _not_measured(gate, t, f"the gate ended in error: {result.summary or 'no summary'}"[:300])
    fig = next((f for f in result.figures if f.name == t.figure), None)
    if fig is None:
        return _not_measured(gate, t, f"the gate recorded no figure {t.figure!r}")
    if fig.value is None:
        return _not_measured(gate, t, f"the figure {t.figure!r} is NaN (nothing was measured)")
    margin, ratio = _margin(fig.value, t.op, t.value)
    return TargetResult(gate=gate, figure=t.figure, op=t.op, target=t.value, unit=t.unit or fig.unit,
                        note=t.note, status="met" if compare(fig.value, t.op, t.value) else "not met",
                        measured=fig.value, margin=margin, ratio=ratio)


def evaluate_targets(spec: PhaseSpec, results: list[GateResult]) -> list[TargetResult]:
    """Every target of every gate of ``spec``, in spec order, against ``results``."""
    by_gate = {r.gate: r for r in results}
    return [evaluate_target(g.name, t, by_gate.get(g.name)) for g in spec.gates for t in g.targets]


def shown_targets(record: RunRecord, current: PhaseSpec) -> tuple[list[TargetResult], bool]:
    """The targets to show for ``record``, and whether they were evaluated now.

    A record written since targets exist (schema 2) shows what it stored. An older record stored
    none: the current spec's targets are evaluated on the figures it recorded (for the gates it
    ran), so its distance to the targets is visible too; the caller says so.
    """
    if record.schema_version >= 2:
        return list(record.targets), False
    ran = {r.gate for r in record.results}
    return [t for t in evaluate_targets(current, record.results) if t.gate in ran], True


def target_text(t: TargetResult) -> str:
    """``median_speedup 11.4x >= 20x: not met (-8.62x, 0.57 of the target)``."""
    goal = f"{t.figure} {t.op} {fmt_number(t.target)}{t.unit}"
    if t.status == "not measured":
        return f"{goal}: not measured ({t.reason})"
    text = f"{t.figure} {fmt_number(t.measured)}{t.unit} {t.op} {fmt_number(t.target)}{t.unit}: {t.status}"
    sign = "+" if t.margin >= 0 else ""
    extra = f"{sign}{fmt_number(t.margin)}{t.unit}"
    if t.ratio is not None:
        extra += f", {t.ratio:.2f}x the target" if t.status == "met" else f", {t.ratio:.2f} of the target"
    return f"{text} ({extra})"
