"""``orchestrate report``: the plan as one self-contained HTML page people can look at.

The page (jinja2 template ``templates/report.html.j2``, inline CSS, inline SVG, no JavaScript,
nothing fetched from the network) shows the plan's phases in order, each phase's state as
`orchestrate status` judges it (deciding run, staleness, the latest full run on every device),
each gate's outcome with its figures against their thresholds and its targets met / not met,
and, for each gate's key figure and each figure a target names, a chart of its value across
every recorded run of the phase (one line per device, the x axis by date and commit) with the
threshold and the targets drawn as lines (`kdtree.orchestrator.reportchart`).

Everything comes from the run records through the result store and the phase states
(`kdtree.orchestrator.state.plan_status`), so a damaged record is refused here as everywhere.
The page is written atomically, by default to ``<results_dir>/report.html``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from kdtree.gates.base import GateResult
from kdtree.gates.spec import PhaseSpec
from kdtree.orchestrator.errors import Refusal
from kdtree.orchestrator.evidence import skipped, why_not_deciding
from kdtree.orchestrator.plan import Plan
from kdtree.orchestrator.reportchart import Chart, Point, RefLine, Series, render_svg
from kdtree.orchestrator.specs import RunRecord
from kdtree.orchestrator.state import PhaseStatus, plan_status
from kdtree.orchestrator.store import NewerRecord, ResultStore
from kdtree.orchestrator.targets import fmt_number, target_text
from kdtree.orchestrator.views import key_figure_text, targets_view, when

TEMPLATES = Path(__file__).parent / "templates"
REPORT_NAME = "report.html"


def default_report_path(plan: Plan) -> Path:
    """Where `orchestrate report` writes without ``--out``: ``<results_dir>/report.html``."""
    return plan.results_path / REPORT_NAME


@dataclass
class ChartView:
    """One chart of a gate: the figure it follows and its SVG markup."""

    figure: str
    why: str  # "key figure", "target", or both
    svg: str
    points: int
    devices: list[str]


@dataclass
class GateView:
    """A gate as the page shows it: its outcome and figures in the deciding run, its targets
    there, and its charts across every recorded run."""

    name: str
    kind: str
    description: str
    outcome: str  # in the deciding run; "not run" without one
    key: str
    summary: str
    figures: list[dict[str, Any]] = field(default_factory=list)
    targets: list[dict[str, Any]] = field(default_factory=list)
    charts: list[ChartView] = field(default_factory=list)


@dataclass
class PhaseView:
    """A phase as the page shows it: its state now, the deciding run, the latest full run per
    device and its gates."""

    id: str
    title: str
    objective: str
    state: str
    run: Optional[dict[str, Any]]
    runs: int
    stale_reasons: list[str]
    not_deciding: list[str]
    devices: list[dict[str, Any]]
    partial: Optional[str]
    gates: list[GateView]
    targets_now: bool
    unreadable: str = ""  # its records cannot be read here (a newer orchestrate wrote one)


def _short(record: RunRecord) -> str:
    git = record.git
    return git.sha[:7] if git.sha else git.short


def _figure_row(fig) -> dict[str, Any]:
    value = "NaN" if fig.value is None else f"{fmt_number(fig.value)}{fig.unit}"
    threshold = f"{fig.op} {fmt_number(fig.threshold)}{fig.unit}" if fig.ok is not None else ""
    return {"name": fig.name, "value": value, "threshold": threshold,
            "ok": {True: "ok", False: "miss", None: ""}[fig.ok], "key": fig.key}


def _chart_figures(spec_gate, records: list[RunRecord]) -> list[tuple[str, str]]:
    """(figure, why) to chart for a gate: its key figure, then each figure its targets name."""
    out: dict[str, list[str]] = {}
    for rec in reversed(records):
        result = rec.result(spec_gate.name)
        fig = result.key_figure() if result is not None else None
        if fig is not None:
            out[fig.name] = ["key figure"]
            break
    for t in spec_gate.targets:
        reasons = out.setdefault(t.figure, [])
        if "target" not in reasons:
            reasons.append("target")
    return [(name, " and ".join(why)) for name, why in out.items()]


def _tooltip(rec: RunRecord, result: GateResult, fig) -> str:
    flags = [w for w, on in (("partial run", rec.partial), ("forced", rec.forced),
                             ("inputs changed while it ran", rec.inputs_changed_during_run)) if on]
    return (f"{fig.render()}\nrun {rec.run_id} ({rec.state.value}{', ' + ', '.join(flags) if flags else ''})\n"
            f"{when(rec)}, commit {rec.git.short}\n{rec.device.label}; gate {result.outcome.value}")


def figure_chart(phase: PhaseSpec, gate: str, figure: str, records: list[RunRecord]) -> Optional[Chart]:
    """The chart of ``figure`` of ``gate`` across ``records`` (oldest first); None when no run
    recorded a value of it."""
    slots: list[tuple[str, str]] = []
    by_device: dict[str, Series] = {}
    thresholds: list[Optional[float]] = []
    threshold_label, unit = "", ""
    for rec in records:
        result = rec.result(gate)
        fig = next((f for f in result.figures if f.name == figure), None) if result is not None else None
        if fig is None or fig.value is None:
            continue
        slot = len(slots)
        slots.append((rec.started_at.strftime("%m-%d"), _short(rec)))
        unit = unit or fig.unit
        series = by_device.setdefault(rec.device.label, Series(rec.device.label))
        series.points.append(Point(slot, fig.value, _tooltip(rec, result, fig), fig.ok))
        has_threshold = fig.threshold is not None and fig.op is not None
        thresholds.append(fig.threshold if has_threshold else None)
        if has_threshold:
            threshold_label = f"threshold {fig.op} {fmt_number(fig.threshold)}{fig.unit}"
    if not slots:
        return None
    lines = []
    if any(v is not None for v in thresholds):
        lines.append(RefLine("threshold", threshold_label, tuple(thresholds)))
    spec_gate = next((g for g in phase.gates if g.name == gate), None)
    for t in spec_gate.targets if spec_gate is not None else []:
        if t.figure == figure:
            label = f"target {t.op} {fmt_number(t.value)}{t.unit or unit}" + (f" ({t.note})" if t.note else "")
            lines.append(RefLine("target", label, (t.value,) * len(slots)))
    return Chart(title=f"{gate}: {figure}", unit=unit, slots=slots, series=list(by_device.values()),
                 lines=lines)


def _run_view(rec: RunRecord) -> dict[str, Any]:
    return {"run_id": rec.run_id, "when": when(rec), "commit": rec.git.short, "device": rec.device.label,
            "state": rec.state.value, "passed": rec.passed_count, "total": len(rec.results),
            "skipped": skipped(rec), "forced": rec.forced, "partial": rec.partial,
            "versions": ", ".join(f"{k} {v}" for k, v in rec.versions.items())}


def phase_view(st: PhaseStatus, records: list[RunRecord]) -> PhaseView:
    """What the page shows of one phase (see the module docstring)."""
    spec, rec = st.phase.spec, st.record
    targets, targets_now = targets_view(rec, spec) if rec is not None else ([], False)
    gates = []
    for g in spec.gates:
        result = rec.result(g.name) if rec is not None else None
        view = GateView(name=g.name, kind=g.kind, description=g.description,
                        outcome=result.outcome.value if result is not None else "not run",
                        key=key_figure_text(result) if result is not None else "",
                        summary=(result.summary or result.reason or "") if result is not None else "",
                        figures=[_figure_row(f) for f in result.figures] if result is not None else [],
                        targets=[{"text": target_text(t), "status": t.status}
                                 for t in targets if t.gate == g.name])
        for figure, why in _chart_figures(g, records):
            chart = figure_chart(spec, g.name, figure, records)
            if chart is not None:
                view.charts.append(ChartView(figure, why, render_svg(chart), chart.points,
                                             [s.label for s in chart.series]))
            else:
                view.charts.append(ChartView(figure, why, "", 0, []))
        gates.append(view)
    devices = [{**_run_view(r), "decides": rec is not None and r.run_id == rec.run_id,
                "why": "" if rec is None or r.run_id == rec.run_id else why_not_deciding(r, rec)}
               for r in st.by_device]
    partial = None
    if st.partial is not None:
        partial = (f"run {st.partial.run_id} ({when(st.partial)}) ran only "
                   + ", ".join(f"{r.gate}={r.outcome.value}" for r in st.partial.results)
                   + "; it does not change the state")
    return PhaseView(id=st.phase.id, title=spec.title, objective=spec.objective, state=st.state.value,
                     run=_run_view(rec) if rec is not None else None, runs=len(records),
                     stale_reasons=list(st.stale_reasons), not_deciding=list(st.not_deciding),
                     devices=devices, partial=partial, gates=gates, targets_now=targets_now,
                     unreadable=st.unreadable)


@dataclass
class Report:
    """A rendered report: its HTML and what it shows."""

    html: str
    phases: list[PhaseView]

    @property
    def charts(self) -> int:
        return sum(1 for p in self.phases for g in p.gates for c in g.charts if c.svg)


def _readable_records(store: ResultStore, st: PhaseStatus) -> list[RunRecord]:
    """The phase's records; none when a newer orchestrate wrote one (its status says so)."""
    if st.unreadable:
        return []
    try:
        return store.records(st.phase.id)
    except NewerRecord:
        return []


def render_report(plan: Plan, now: Optional[datetime] = None) -> Report:
    """The report page for ``plan``, from its run records (``now``: the time it names)."""
    import jinja2  # noqa: PLC0415 - only this command pays for it
    from markupsafe import Markup  # noqa: PLC0415 - jinja2's own dependency

    store = ResultStore(plan.results_path)
    statuses = plan_status(plan, store)
    phases = [phase_view(st, _readable_records(store, st)) for st in statuses]
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    now = now or datetime.now(timezone.utc)
    html = env.get_template("report.html.j2").render(
        plan=plan.spec, phases=phases, generated=now.strftime("%Y-%m-%d %H:%M UTC"),
        records=sum(p.runs for p in phases), results_dir=plan.spec.results_dir, Markup=Markup)
    return Report(html, phases)


def write_report(plan: Plan, out: Optional[Path] = None) -> tuple[Path, Report]:
    """Render the report and write it atomically to ``out`` (default `default_report_path`)."""
    from kdtree.fsutil import atomic_write_text  # noqa: PLC0415

    path = Path(out) if out is not None else default_report_path(plan)
    if path.is_dir():
        raise Refusal(f"--out {path} is a folder; name the file to write, e.g. {path / REPORT_NAME}")
    if path.parent.exists() and not path.parent.is_dir():
        raise Refusal(f"--out {path}: {path.parent} is not a folder")
    report = render_report(plan)
    try:
        atomic_write_text(path, report.html)
    except OSError as exc:
        raise Refusal(f"the report could not be written to {path} ({exc.strerror or exc}); "
                      "choose another place with --out FILE") from None
    return path, report


def shown_path(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it, else absolute."""
    path = Path(os.path.abspath(path))
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
