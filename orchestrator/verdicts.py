"""Whether a gate's recorded outcome is what its own figures and thresholds say.

A gate passes only when it measured something against a threshold and every thresholded figure
meets its threshold (`kdtree.gates.base.verdict`). The runner holds every result to that before
recording it (a check that reports ``passed`` beside a missed figure is recorded ``failed``), and
the store checks it again on every load: a record whose gate claims a pass its figures do not
support, or whose figure carries another threshold than the spec it ran under, was edited and
is damaged.
"""

from __future__ import annotations

from typing import Any, Optional

from kdtree.gates.base import GateResult, Outcome, fmt_number


def _spec_thresholds(spec: Optional[dict[str, Any]], gate: str) -> dict[str, tuple[str, float]]:
    """figure name -> (op, value) of a metric gate's thresholds in the recorded spec."""
    if not isinstance(spec, dict):
        return {}
    for g in spec.get("gates") or []:
        if isinstance(g, dict) and g.get("name") == gate:
            out = {}
            for t in g.get("thresholds") or []:
                if isinstance(t, dict) and "figure" in t and "op" in t and "value" in t:
                    out[t["figure"]] = (t["op"], t["value"])
            return out
    return {}


def outcome_problem(result: GateResult, spec: Optional[dict[str, Any]] = None) -> Optional[str]:
    """Why ``result``'s outcome disagrees with its figures and thresholds (None: it agrees).

    ``spec`` is the phase spec as recorded with the run (a metric gate's thresholds are checked
    against its figures' thresholds).
    """
    for fig in result.figures:
        want = _spec_thresholds(spec, result.gate).get(fig.name)
        if want is not None and fig.threshold is not None and (fig.op, fig.threshold) != want:
            return (f"gate {result.gate!r} records figure {fig.name!r} against {fig.op} "
                    f"{fmt_number(fig.threshold)} but the spec it ran under says {want[0]} "
                    f"{fmt_number(want[1])}")
    if result.outcome is not Outcome.PASSED:
        return None
    checked = [f for f in result.figures if f.ok is not None]
    missed = [f for f in checked if not f.ok]
    if missed:
        return (f"gate {result.gate!r} is recorded as passed but its figure "
                f"{missed[0].render()} misses its threshold")
    if not checked:
        return f"gate {result.gate!r} is recorded as passed but measured nothing against a threshold"
    return None


def hold_to_figures(result: GateResult) -> GateResult:
    """``result``, with a ``passed`` outcome that a missed figure contradicts turned ``failed``."""
    if result.outcome is not Outcome.PASSED:
        return result
    missed = [f for f in result.figures if f.ok is False]
    if not missed:
        return result
    return result.model_copy(update={
        "outcome": Outcome.FAILED,
        "summary": f"reported passed, but {'; '.join(f.render() for f in missed[:3])}"})
