"""Checkpoints: re-render the plan, log what newly passed, and (``--commit``) commit the run.

A checkpoint reports one run: the newest full run of ``--phase``, or else of the phase run most
recently. It refuses when that run is stale against the working tree (the commit must hold the
code the gates ran on), when it skipped gates that a complete run of the same code ran (the
complete run keeps deciding the phase's state; ``--allow-incomplete`` checkpoints it anyway),
outside a git repository, when the environment would import the plan's code from elsewhere,
and in the middle of a merge, rebase, cherry-pick or revert. A detached HEAD is allowed and
reported.

When the reported run names no commit (its machine's HEAD did not hold the files it ran), the
checkpoint looks through HEAD's recent history for the commit whose tree has the run's inputs
hash and fills it into the record (`kdtree.orchestrator.provenance`).

The commit holds only what `kdtree.orchestrator.commitset` allows (the plan, the run records,
the changelog, the phase's input files; untracked files only with ``--include-untracked``) and
runs the repository's hooks. Its message::

    checkpoint: phase1 kernel passed (7/7 gates)

    <-m MESSAGE, if given>

    build: passed, spills 0 <= 0
    ...

    Run: 20261202T...-1a2b3c
    Phase: phase1
    Gates: build=passed, accuracy=passed, ...
    Device: NVIDIA H200 (sm_90)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from kdtree.orchestrator.changelog import update_changelog
from kdtree.orchestrator.commitset import (
    require_committable, require_staged, select, stage, working_tree_changes,
)
from kdtree.orchestrator.errors import Refusal
from kdtree.orchestrator.evidence import changed_during_run, complete_peer, deciding_run, latest_by_device, skipped
from kdtree.orchestrator.git import (
    GitError, IndexSnapshot, branch, commit_unit, describe_commit_failure, git_text, head_commit,
    in_progress_operation,
)
from kdtree.orchestrator.lock import LOCK_NAME
from kdtree.orchestrator.plan import Plan
from kdtree.orchestrator.provenance import find_commit
from kdtree.orchestrator.render import write_plan
from kdtree.orchestrator.sources import require_own_sources
from kdtree.orchestrator.specs import PhaseState, RunRecord
from kdtree.orchestrator.state import PhaseStatus, plan_status, stale_reasons
from kdtree.orchestrator.store import ResultStore
from kdtree.orchestrator.views import gate_line


@dataclass
class CheckpointResult:
    """What a checkpoint did."""

    phase: str
    run_id: str
    plan_changed: bool
    changelog_lines: list[str]
    message: str
    commit_sha: Optional[str] = None
    files: list[str] = field(default_factory=list)  # "M\tpath" rows of the commit
    detached: bool = False
    nothing_to_commit: bool = False
    filled_commit: Optional[str] = None  # the commit filled into the run's record
    left_out: list[str] = field(default_factory=list)  # untracked files not committed


def commit_message(title: str, record: RunRecord, note: Optional[str] = None,
                   decider: Optional[RunRecord] = None, others: Optional[list[RunRecord]] = None) -> str:
    """The checkpoint commit message: subject, optional note, one line per gate, trailers.

    ``others``: runs of other phases whose records the commit adds; the subject names their
    phases too, and the body lists them.
    """
    n, total = record.passed_count, len(record.results)
    counts = f"{n}/{total} gates" if record.state is PhaseState.PASSED else f"{n}/{total} gates passed"
    name = record.phase if not title.strip() or title.strip() == record.phase else f"{record.phase} {title.strip()}"
    subject = f"checkpoint: {name} {record.state.value} ({counts})"
    others = [o for o in others or [] if o.phase != record.phase]
    by_phase: dict[str, RunRecord] = {}
    for o in others:
        if o.phase not in by_phase or o.order > by_phase[o.phase].order:
            by_phase[o.phase] = o
    if by_phase:
        subject += "; with " + ", ".join(f"{p} {o.state.value}" for p, o in by_phase.items())
    parts = [subject]
    if note and note.strip():
        parts.append(note.strip())
    if record.forced:
        parts.append(f"Forced past {', '.join(record.forced_over)}, which were not passed-and-fresh.")
    if decider is not None and decider.run_id != record.run_id:
        parts.append(f"This run skipped {skipped(record)} gate(s); the phase's state stays decided by "
                     f"run {decider.run_id} ({decider.device.label}): {decider.state.value}.")
    parts.append("\n".join(gate_line(r) for r in record.results))
    if others:
        parts.append("Also in this commit: " + "; ".join(
            f"{o.phase} run {o.run_id} ({o.state.value}, {o.device.label})" for o in others))
    gates = ", ".join(f"{r.gate}={r.outcome.value}" for r in record.results)
    parts.append(f"Run: {record.run_id}\nPhase: {record.phase}\nGates: {gates}\n"
                 f"Device: {record.device.label}")
    return "\n\n".join(parts) + "\n"


def _reported(statuses: list[PhaseStatus], phase_id: Optional[str], plan: Plan) -> PhaseStatus:
    if phase_id is not None:
        plan.phase(phase_id)  # a Refusal for an unknown phase
        st = next(s for s in statuses if s.phase.id == phase_id)
        if st.newest is None:
            raise Refusal(f"{phase_id} has no full run to checkpoint; run `orchestrate run {phase_id}` first")
        return st
    ran = [s for s in statuses if s.newest is not None]
    if not ran:
        raise Refusal("no phase has a full run to checkpoint; run `orchestrate run PHASE` first")
    return max(ran, key=lambda s: s.newest.order)


def _fill_commit(plan: Plan, store: ResultStore, st: PhaseStatus, rec: RunRecord) -> Optional[str]:
    """Fill in the commit of a record that names none, when the history holds its inputs."""
    if rec.git.sha is not None:
        return None
    found = find_commit(plan.root, plan.input_globs(st.phase), rec.inputs_hash)
    if found is None:
        return None
    git = rec.git.model_copy(update={"sha": found, "sha_source": "checkpoint"})
    store.rewrite(rec.model_copy(update={"git": git}))
    return found


def cited_runs(plan: Plan, store: ResultStore) -> list[RunRecord]:
    """Every run the rendered plan (and so the changelog, which names deciding runs) cites: per
    phase, the deciding run, the latest full run on each device, and a newer partial run."""
    cited: dict[str, RunRecord] = {}
    for phase in plan.phases:
        records = store.records(phase.id)
        rows = latest_by_device(records)
        decider = deciding_run(records)
        if decider is not None:
            rows.append(decider)
        if records and records[-1].partial:
            rows.append(records[-1])
        for r in rows:
            cited[f"{r.phase}/{r.run_id}"] = r
    return list(cited.values())


def _plots(rec: RunRecord) -> list[str]:
    return [p for r in rec.results for p in (r.details.get("plots") or [])
            if isinstance(r.details, dict) and isinstance(p, str)]


def _commit_set(plan: Plan, st: PhaseStatus, rec: RunRecord, include_untracked: bool,
                store: ResultStore, include_records: bool = False):
    results_dir = plan.spec.results_dir.rstrip("/")
    cited = cited_runs(plan, store) + [rec]
    records = [f"{results_dir}/{r.phase}/{r.run_id}.json" for r in cited]
    plots = [p for r in cited for p in _plots(r)] + [r.log for r in cited if r.log]
    chosen = select(working_tree_changes(plan.root), plan_md=plan.spec.markdown,
                    changelog=plan.spec.changelog, phase_dir=f"{results_dir}/{st.phase.id}",
                    lock=f"{results_dir}/{LOCK_NAME}", input_globs=plan.input_globs(st.phase),
                    plots=plots + records, include_untracked=include_untracked,
                    results_dir=results_dir, include_records=include_records)
    chosen.required = sorted(set(records))
    require_committable(plan.root, chosen.required, chosen)
    return chosen


def checkpoint(plan: Plan, phase_id: Optional[str] = None, *, commit: bool = False,
               note: Optional[str] = None, include_untracked: bool = False,
               allow_incomplete: bool = False, include_records: bool = False) -> CheckpointResult:
    """Run a checkpoint (see module docstring). The caller holds the run lock."""
    if not plan.is_git:
        raise Refusal(f"{plan.root} is not a git repository; a checkpoint needs one")
    require_own_sources(plan.root, [p.module for p in plan.phases])
    op = in_progress_operation(plan.root)
    if op:
        raise Refusal(f"the repository is in the middle of {op}; finish or abort it, then checkpoint")
    store = ResultStore(plan.results_path)
    statuses = plan_status(plan, store)
    st = _reported(statuses, phase_id, plan)
    rec = st.newest
    if rec.inputs_changed_during_run:
        raise Refusal(f"run {rec.run_id} of {st.phase.id} cannot be checkpointed: "
                      f"{changed_during_run(rec)}. Run `orchestrate run {st.phase.id}` again without "
                      "editing its inputs meanwhile")
    reasons = stale_reasons(rec, st.spec_hash, st.inputs_hash)
    if reasons:
        raise Refusal(f"run {rec.run_id} of {st.phase.id} is stale against the working tree: "
                      + "; ".join(reasons)
                      + f". Run `orchestrate run {st.phase.id}` again so the checkpoint holds the "
                      "code its gates ran on.")
    peer = complete_peer(rec, store.records(st.phase.id))
    if peer is not None and not allow_incomplete:
        raise Refusal(f"run {rec.run_id} of {st.phase.id} ({rec.device.label}) skipped "
                      f"{skipped(rec)} gate(s), but run {peer.run_id} ({peer.device.label}) ran "
                      f"them all on the same inputs and still decides the phase's state "
                      f"({peer.state.value}). Pass --allow-incomplete to checkpoint the incomplete "
                      f"run anyway, or delete {store.path_of(rec)}")
    if commit:
        _commit_set(plan, st, rec, include_untracked, store, include_records)  # refuses before anything is written
    _require_writable(plan)

    filled = _fill_commit(plan, store, st, rec)
    if filled:
        statuses = plan_status(plan, store)
        st = next(s for s in statuses if s.phase.id == st.phase.id)
        rec = st.newest
    plan_changed = write_plan(plan, store)
    newly = [(s.phase.spec.title, s.record) for s in statuses if s.state is PhaseState.PASSED]
    lines = update_changelog(plan.changelog_path, newly)
    message = commit_message(st.phase.spec.title, rec, note, decider=st.record)
    result = CheckpointResult(phase=st.phase.id, run_id=rec.run_id, plan_changed=plan_changed,
                              changelog_lines=lines, message=message,
                              detached=branch(plan.root) is None, filled_commit=filled)
    if not commit:
        return result

    chosen = _commit_set(plan, st, rec, include_untracked, store, include_records)
    result.left_out = chosen.left_out
    others = _added_records(plan, store, chosen.to_add)
    if others:
        result.message = message = commit_message(st.phase.spec.title, rec, note, decider=st.record,
                                                  others=others)
    index = IndexSnapshot(plan.root)
    try:
        stage(plan.root, chosen.to_add)
        require_staged(plan.root, chosen.required)
        has_head = head_commit(plan.root) is not None
        staged = (git_text(plan.root, "diff", "--cached", "--name-only") if has_head
                  else git_text(plan.root, "ls-files", "--cached"))
        if not staged.strip():
            result.nothing_to_commit = True
            return result
    except BaseException:
        index.restore()
        raise
    try:
        commit_unit(plan.root, message, index)  # restores the index itself when nothing was committed
    except GitError as exc:
        raise Refusal(describe_commit_failure(exc) + _kept(plan)) from None
    sha = head_commit(plan.root)
    result.commit_sha = sha
    rows = git_text(plan.root, "diff-tree", "--no-commit-id", "--name-status", "-r", "--root",
                    "--relative", sha)
    result.files = [r for r in rows.splitlines() if r.strip()]
    return result


def _require_writable(plan: Plan) -> None:
    """Refuse before anything is written when the plan or the changelog cannot be replaced."""
    from kdtree.orchestrator.preflight import probe_file, probe_folder  # noqa: PLC0415

    for path, what in ((plan.markdown_path, "the plan markdown"), (plan.changelog_path, "the changelog")):
        real = Path(os.path.realpath(path))
        why = probe_folder(real.parent) or (probe_file(real) if real.exists() else None)
        if why:
            raise Refusal(f"{what} {real} cannot be written ({why}); make it and its folder writable "
                          "(an immutable file: `lsattr` shows `i`, `chattr -i` clears it), then "
                          "checkpoint again. Nothing was written")


def _added_records(plan: Plan, store: ResultStore, paths: list[str]) -> list[RunRecord]:
    """The run records among ``paths`` (being added by the commit), loaded."""
    from kdtree.orchestrator.store import RUN_ID_RE, load_record  # noqa: PLC0415

    results_dir = plan.spec.results_dir.rstrip("/") + "/"
    out = []
    for path in paths:
        if not path.startswith(results_dir) or not path.endswith(".json"):
            continue
        parts = path[len(results_dir):].split("/")
        if len(parts) == 2 and RUN_ID_RE.match(parts[1][:-5]) and (plan.root / path).is_file():
            out.append(load_record(plan.root / path))
    return sorted(out, key=lambda r: r.order)


def _kept(plan: Plan) -> str:
    return (f". Nothing was committed and the index is as it was before the checkpoint; the "
            f"rendered {plan.spec.markdown}, {plan.spec.changelog} and run records stay in the working "
            "tree for the next `orchestrate checkpoint --commit`")
