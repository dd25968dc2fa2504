"""Metric gate: named figures, measured elsewhere, each held against the spec's threshold."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from kdtree.gates.base import Figure, GateContext, GateResult, Outcome, verdict
from kdtree.gates.spec import MetricGateSpec


def check_metric(spec: MetricGateSpec, figures: Mapping[str, float], ctx: GateContext,
                 details: Optional[dict[str, Any]] = None) -> GateResult:
    """Hold ``figures[t.figure] t.op t.value`` for every threshold of the spec.

    A threshold whose figure is missing, or is not a number, makes the result an ``error`` naming
    it (the check measured less than the spec asks for). Figures the spec does not hold are
    recorded without a threshold. The first threshold's figure is the key figure.
    """
    missing = [t.figure for t in spec.thresholds if t.figure not in figures]
    bad = []
    out: list[Figure] = []
    for i, t in enumerate(spec.thresholds):
        if t.figure in missing:
            continue
        value = figures[t.figure]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            bad.append(f"{t.figure}={value!r}")
            continue
        out.append(Figure(name=t.figure, value=float(value), unit=t.unit, op=t.op, threshold=t.value, key=i == 0))
    held = {t.figure for t in spec.thresholds}
    for name, value in figures.items():
        if name not in held and isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append(Figure(name=name, value=float(value)))
    extra = dict(details or {})
    if missing or bad:
        parts = []
        if missing:
            parts.append(f"missing figures {missing} (the check reported {sorted(figures)})")
        if bad:
            parts.append(f"not numbers: {', '.join(bad)}")
        return GateResult(gate=spec.name, kind=spec.kind, outcome=Outcome.ERROR, figures=out,
                          summary="; ".join(parts), details={"missing": missing, **extra})
    nan = [f.name for f in out if f.threshold is not None and f.value is None]
    summary = f"{', '.join(nan)} not a number; " if nan else ""
    result = verdict(spec.name, spec.kind, out, "", **extra)
    if summary:
        result.summary = summary + result.summary
    return result
