"""Plain views of phases and runs, shared by `status --json`, the plan blocks and commit messages."""

from __future__ import annotations

from typing import Any, Optional

from kdtree.gates.base import GateResult
from kdtree.gates.spec import PhaseSpec
from kdtree.orchestrator.specs import RunRecord, TargetResult
from kdtree.orchestrator.targets import shown_targets, target_text


def key_figure_text(result: GateResult) -> str:
    """``speedup 4.2x >= 3.0x`` for the gate's key figure; the reason when it measured nothing."""
    fig = result.key_figure()
    if fig is not None:
        return fig.render()
    return result.reason or result.summary or ""


def gate_line(result: GateResult) -> str:
    """``accuracy: passed, rel_l2 0.003 <= 0.01``."""
    text = key_figure_text(result)
    return f"{result.gate}: {result.outcome.value}" + (f", {text}" if text else "")


def when(record: RunRecord) -> str:
    return record.started_at.strftime("%Y-%m-%d %H:%M UTC")


def plots_of(result: GateResult) -> list[str]:
    plots = result.details.get("plots") if isinstance(result.details, dict) else None
    return [str(p) for p in plots] if isinstance(plots, list) else []


def gate_json(result: GateResult) -> dict[str, Any]:
    return {
        "gate": result.gate, "kind": result.kind, "outcome": result.outcome.value,
        "key_figure": key_figure_text(result), "summary": result.summary, "reason": result.reason,
        "figures": [f.model_dump(mode="json") for f in result.figures],
        "duration_s": round(result.duration_s, 3), "plots": plots_of(result),
    }


def target_json(t: TargetResult) -> dict[str, Any]:
    return {**t.model_dump(mode="json"), "text": target_text(t)}


def targets_view(record: RunRecord, spec: Optional[PhaseSpec]) -> tuple[list[TargetResult], bool]:
    """The record's targets and whether they were evaluated now (a record from before targets)."""
    if spec is None:
        return list(record.targets), False
    return shown_targets(record, spec)


def run_json(record: Optional[RunRecord], spec: Optional[PhaseSpec] = None) -> Optional[dict[str, Any]]:
    """A run for machines; ``spec`` (the current phase spec) evaluates an old record's targets."""
    if record is None:
        return None
    targets, evaluated_now = targets_view(record, spec)
    return {
        "run_id": record.run_id, "state": record.state.value,
        "started_at": record.started_at.isoformat(), "ended_at": record.ended_at.isoformat(),
        "git_sha": record.git.sha, "dirty": record.git.dirty, "git_head": record.git.head,
        "git_sha_source": record.git.sha_source, "commit": record.git.short,
        "device": record.device.label,
        "device_info": record.device.model_dump(mode="json"),
        "versions": record.versions.model_dump(mode="json"),
        "forced": record.forced, "forced_over": record.forced_over, "partial": record.partial,
        "gates_selected": record.gates_selected, "inputs_hash": record.inputs_hash,
        "spec_hash": record.spec_hash, "gates": [gate_json(r) for r in record.results],
        "targets": [target_json(t) for t in targets], "targets_evaluated_now": evaluated_now,
    }
