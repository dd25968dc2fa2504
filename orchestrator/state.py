"""A phase's state now: its deciding run, judged against the current spec and working tree.

The deciding run is the newest full run, except that a run which skipped gates never overrides
one of the same code and spec that ran them (`kdtree.orchestrator.evidence`).

- ``pending``: no full run; the outcomes of the deciding run give ``passed``, ``failed``,
  ``error`` or ``incomplete`` (see `kdtree.orchestrator.specs.state_of`);
- a run whose input files changed while its gates ran never decides (`not_deciding` says why);
- ``stale``: that run passed (or was incomplete) but the phase's spec hash or inputs hash is no
  longer the one it saw.

A partial run (``--gate``) never decides the state; it is shown beside it, and so is the latest
full run on every device. A phase with a record written by a newer orchestrate is ``error``
with `PhaseStatus.unreadable` saying so; the other phases are judged as usual.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from kdtree.orchestrator.evidence import changed_during_run, deciding_run, full_runs, latest_by_device
from kdtree.orchestrator.inputs import InputsIndex, unmatched_globs
from kdtree.orchestrator.plan import Phase, Plan
from kdtree.orchestrator.specs import PhaseState, RunRecord
from kdtree.orchestrator.store import NewerRecord, ResultStore


@dataclass
class PhaseStatus:
    """Everything `status`, the order check and checkpoints need to know about one phase."""

    phase: Phase
    state: PhaseState
    record: Optional[RunRecord]  # the deciding run
    partial: Optional[RunRecord]  # a partial run newer than every full run
    spec_hash: str
    inputs_hash: str
    input_files: int
    stale_reasons: list[str] = field(default_factory=list)
    newest: Optional[RunRecord] = None  # the newest full run (may differ from ``record``)
    by_device: list[RunRecord] = field(default_factory=list)  # newest full run per device, newest first
    # Why newer full runs do not decide (their inputs changed while they ran), newest first.
    not_deciding: list[str] = field(default_factory=list)
    # Why the phase's records cannot be read here (one was written by a newer orchestrate);
    # the state is then ``error`` and nothing else about the phase is known.
    unreadable: str = ""

    @property
    def passed_and_fresh(self) -> bool:
        return self.state is PhaseState.PASSED

    @property
    def fresh(self) -> bool:
        return self.record is not None and not self.stale_reasons


def stale_reasons(record: RunRecord, spec_hash: str, inputs_hash: str,
                  changed: Optional[list[str]] = None) -> list[str]:
    """Why ``record`` no longer describes the phase (empty: it still does); ``changed`` names the
    input files changed since the record's commit, where known."""
    reasons = []
    if record.spec_hash != spec_hash:
        reasons.append(f"the phase spec changed (spec hash {record.spec_hash} -> {spec_hash})")
    if record.inputs_hash != inputs_hash:
        text = f"its input files changed (inputs hash {record.inputs_hash} -> {inputs_hash})"
        if changed:
            more = f" and {len(changed) - _NAMED} more" if len(changed) > _NAMED else ""
            text += f" since commit {record.git.short}: {', '.join(changed[:_NAMED])}{more}"
        reasons.append(text)
    return reasons


_NAMED = 5  # changed input files a stale reason names


def _changed_files(record: RunRecord, globs: list[str], index: InputsIndex) -> Optional[list[str]]:
    """The phase's input files changed since the commit the record names, when it names one whose
    tree held the run's inputs (`GitInfo.sha_source`); None otherwise."""
    git = record.git
    if not git.sha or git.sha_source not in ("head", "checkpoint"):
        return None
    return index.changed_since(git.sha, globs)


def phase_status(phase: Phase, store: ResultStore, index: InputsIndex,
                 globs: Optional[list[str]] = None) -> PhaseStatus:
    """The status of one phase (see module docstring); ``globs``: its input globs (default: the
    spec's, as `Plan.input_globs` gives them)."""
    globs = list(phase.spec.inputs) if globs is None else globs
    try:
        records = store.records(phase.id)
    except NewerRecord as exc:
        return PhaseStatus(phase, PhaseState.ERROR, None, None, phase.spec.spec_hash(), "", 0,
                           unreadable=str(exc))
    full = full_runs(records)
    record = deciding_run(records)
    partial = records[-1] if records and records[-1].partial else None
    spec_hash = phase.spec.spec_hash()
    inputs_hash, n_files = index.hash_of(globs)
    after = [r for r in full if record is None or r.order > record.order]
    ignored = [f"run {r.run_id} does not decide: {changed_during_run(r)}; run "
               f"`orchestrate run {phase.id}` again" for r in reversed(after) if r.inputs_changed_during_run]
    if record is None:
        return PhaseStatus(phase, PhaseState.PENDING, None, partial, spec_hash, inputs_hash, n_files,
                           newest=full[-1] if full else None, by_device=latest_by_device(records),
                           not_deciding=ignored)
    changed = _changed_files(record, globs, index) if record.inputs_hash != inputs_hash else None
    reasons = stale_reasons(record, spec_hash, inputs_hash, changed)
    state = record.state
    if reasons and state in (PhaseState.PASSED, PhaseState.INCOMPLETE):
        state = PhaseState.STALE
    return PhaseStatus(phase, state, record, partial, spec_hash, inputs_hash, n_files, reasons,
                       newest=full[-1], by_device=latest_by_device(records), not_deciding=ignored)


def plan_status(plan: Plan, store: Optional[ResultStore] = None,
                index: Optional[InputsIndex] = None) -> list[PhaseStatus]:
    """Every phase's status, in plan order. An input glob that matches no file is a warning."""
    store = store or ResultStore(plan.results_path)
    index = index or InputsIndex(plan.root, plan.is_git)
    for p in plan.phases:
        for glob in unmatched_globs(index.files, list(p.spec.inputs)):
            store.warn(f"phase {p.id}: its inputs glob {glob!r} matches no file (a typo, or files git "
                       "ignores?); its runs do not depend on what it was meant to match")
    return [phase_status(p, store, index, plan.input_globs(p)) for p in plan.phases]


def blockers(statuses: list[PhaseStatus], phase_id: str) -> list[PhaseStatus]:
    """The earlier phases that are not passed-and-fresh, which block ``phase_id``."""
    out = []
    for st in statuses:
        if st.phase.id == phase_id:
            return out
        if not st.passed_and_fresh:
            out.append(st)
    raise KeyError(phase_id)


def describe_blockers(blocking: list[PhaseStatus], phase_id: str) -> str:
    """The refusal message for running ``phase_id`` past ``blocking``."""
    first = blocking[0]
    why = first.state.value
    if first.unreadable:
        why += f" ({first.unreadable})"
    elif first.stale_reasons:
        why += ": " + "; ".join(first.stale_reasons)
    elif first.record is not None:
        why += f" (run {first.record.run_id})"
    others = ""
    if len(blocking) > 1:
        others = f" (also not passed-and-fresh: {', '.join(b.phase.id for b in blocking[1:])})"
    return (f"{phase_id} is blocked by {first.phase.id}, which is {why}{others}. Phases run in "
            f"plan order: run `orchestrate run {first.phase.id}` until it passes, or pass --force "
            f"to run {phase_id} anyway (the run records that it was forced).")
