"""Rendering the plan's orchestrator-owned blocks from the recorded runs (jinja2 templates).

The blocks are ``status`` (one row per phase) and ``results-<phase>`` (the deciding run's gates,
figures against thresholds, its targets met / not met with their margins, machine facts, plot
links, and the latest full run on every device). They are a function of the run records and the
phase specs only — no clock, no working-tree state — so ``plan --check`` is stable;
`orchestrate status` is where freshness against the working tree is shown.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kdtree.orchestrator.evidence import deciding_run, latest_by_device, skipped, why_not_deciding
from kdtree.orchestrator.errors import Refusal
from kdtree.fsutil import atomic_write_text
from kdtree.orchestrator.markers import MarkerError, replace_blocks
from kdtree.orchestrator.plan import Plan
from kdtree.orchestrator.specs import RunRecord, TargetResult
from kdtree.orchestrator.store import ResultStore
from kdtree.orchestrator.targets import fmt_number
from kdtree.orchestrator.textfile import read_text
from kdtree.orchestrator.views import key_figure_text, plots_of, targets_view, when

TEMPLATES = Path(__file__).parent / "templates"


def block_names(plan: Plan) -> list[str]:
    return ["status"] + [f"results-{p.id}" for p in plan.phases]


def _cell(value: Any) -> str:
    return str(value).replace("\r", " ").replace("\n", " ").replace("|", "\\|").strip()


def _env():
    import jinja2  # noqa: PLC0415 - only rendering commands pay for it

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=False,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined)
    env.filters["cell"] = _cell
    return env


def _target_row(t: TargetResult) -> dict[str, Any]:
    goal = f"{t.figure} {t.op} {fmt_number(t.target)}{t.unit}" + (f" ({t.note})" if t.note else "")
    if t.status == "not measured":
        return {"gate": t.gate, "goal": goal, "measured": "—", "status": "not measured",
                "margin": t.reason or ""}
    margin = ("+" if t.margin >= 0 else "") + f"{fmt_number(t.margin)}{t.unit}"
    if t.ratio is not None:
        margin += f" ({t.ratio:.2f}x the target)" if t.status == "met" else f" ({t.ratio:.2f} of the target)"
    return {"gate": t.gate, "goal": goal, "measured": f"{fmt_number(t.measured)}{t.unit}",
            "status": t.status, "margin": margin}


def _device_row(r: RunRecord, decider: RunRecord) -> dict[str, Any]:
    n = skipped(r)
    return {"device": r.device.label, "run_id": r.run_id, "when": when(r), "state": r.state.value,
            "gates": f"{r.passed_count}/{len(r.results)}" + (f" ({n} skipped)" if n else ""),
            "sha": r.git.short,
            "decides": "**yes**" if r.run_id == decider.run_id else f"no: {why_not_deciding(r, decider)}"}


def _phase_view(plan: Plan, phase, store: ResultStore) -> dict[str, Any]:
    records = store.records(phase.id)
    run = deciding_run(records)
    partial = records[-1] if records and records[-1].partial else None
    md_dir = os.path.dirname(plan.spec.markdown)
    view: dict[str, Any] = {"id": phase.id, "title": phase.spec.title, "run": None, "partial": None}
    if partial is not None:
        view["partial"] = {"run_id": partial.run_id, "when": when(partial),
                           "gates": [f"{r.gate}={r.outcome.value}" for r in partial.results]}
    if run is None:
        view.update(state="pending", passed=0, total=len(phase.spec.gates))
        return view
    gates, plots = [], []
    for r in run.results:
        others = [f.render() for f in r.figures if f is not r.key_figure()]
        if r.reason and r.key_figure() is not None:
            others.append(r.reason)
        gates.append({"name": r.gate, "kind": r.kind, "outcome": r.outcome.value,
                      "key": key_figure_text(r), "others": "; ".join(others)})
        for p in plots_of(r):
            plots.append({"name": os.path.basename(p), "href": os.path.relpath(p, md_dir or ".")})
    targets, targets_now = targets_view(run, phase.spec)
    v = run.versions
    view.update(
        state=run.state.value, passed=run.passed_count, total=len(run.results),
        run={"run_id": run.run_id, "when": when(run), "sha": run.git.short,
             "device": run.device.label, "driver": run.device.driver,
             "duration": f"{run.duration_s:.1f} s", "forced": run.forced,
             "forced_over": ", ".join(run.forced_over),
             "versions": ", ".join(f"{k} {val}" for k, val in v.items() if k != "kdtree"),
             "inputs_hash": run.inputs_hash, "spec_hash": run.spec_hash},
        gates=gates, plots=plots, targets=[_target_row(t) for t in targets], targets_now=targets_now,
        devices=[_device_row(r, run) for r in latest_by_device(records)])
    return view


def render_blocks(plan: Plan, store: ResultStore | None = None) -> dict[str, str]:
    """The content of every block, by name."""
    store = store or ResultStore(plan.results_path)
    env = _env()
    views = [_phase_view(plan, p, store) for p in plan.phases]
    blocks = {"status": env.get_template("status.md.j2").render(
        phases=views, results_dir=plan.spec.results_dir.rstrip("/") + "/")}
    results = env.get_template("results.md.j2")
    for view in views:
        blocks[f"results-{view['id']}"] = results.render(phase=view)
    return blocks


def rendered_plan(plan: Plan, store: ResultStore | None = None) -> tuple[str, str]:
    """(current text, text with every block re-rendered) of the plan markdown."""
    path = plan.markdown_path
    if not path.exists() and not path.is_dir():
        raise MarkerError(f"the plan markdown {plan.spec.markdown} does not exist; create it with the "
                          f"blocks {', '.join(block_names(plan))}")
    current = read_text(path, f"the plan markdown {plan.spec.markdown}")
    return current, replace_blocks(current, render_blocks(plan, store), where=plan.spec.markdown)


def write_plan(plan: Plan, store: ResultStore | None = None) -> bool:
    """Re-render the plan markdown in place (atomically). True if it changed."""
    current, new = rendered_plan(plan, store)
    if new == current:
        return False
    try:
        atomic_write_text(plan.markdown_path, new)
    except OSError as exc:
        raise Refusal(f"the plan markdown {plan.markdown_path} cannot be written "
                      f"({exc.strerror or exc}); make it and its folder writable (an immutable file: "
                      "`lsattr` shows `i`, `chattr -i` clears it), then run `orchestrate plan`") from None
    return True
