"""Checkpoints: re-render the plan, log what newly passed, and (``--commit``) commit the tree.

A checkpoint reports one run: the latest full run of ``--phase``, or else of the phase run most
recently. It refuses when that run is stale against the working tree (the commit must hold the
code the gates ran on), outside a git repository, and in the middle of a merge, rebase,
cherry-pick or revert. A detached HEAD is allowed and reported.

The commit stages the whole working tree (``git add -A``, .gitignore respected, the run lock
excluded) and runs the repository's hooks. Its message::

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

from dataclasses import dataclass, field
from typing import Optional

from kdtree.orchestrator.changelog import update_changelog
from kdtree.orchestrator.errors import Refusal
from kdtree.orchestrator.gitinfo import in_progress_operation, open_repo
from kdtree.orchestrator.lock import LOCK_NAME
from kdtree.orchestrator.plan import Plan
from kdtree.orchestrator.render import write_plan
from kdtree.orchestrator.specs import PhaseState, RunRecord
from kdtree.orchestrator.state import PhaseStatus, plan_status
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


def commit_message(title: str, record: RunRecord, note: Optional[str] = None) -> str:
    """The checkpoint commit message: subject, optional note, one line per gate, trailers."""
    n, total = record.passed_count, len(record.results)
    counts = f"{n}/{total} gates" if record.state is PhaseState.PASSED else f"{n}/{total} gates passed"
    subject = f"checkpoint: {record.phase} {title} {record.state.value} ({counts})"
    parts = [subject]
    if note and note.strip():
        parts.append(note.strip())
    if record.forced:
        parts.append(f"Forced past {', '.join(record.forced_over)}, which were not passed-and-fresh.")
    parts.append("\n".join(gate_line(r) for r in record.results))
    gates = ", ".join(f"{r.gate}={r.outcome.value}" for r in record.results)
    parts.append(f"Run: {record.run_id}\nPhase: {record.phase}\nGates: {gates}\n"
                 f"Device: {record.device.label}")
    return "\n\n".join(parts) + "\n"


def _reported(statuses: list[PhaseStatus], phase_id: Optional[str], plan: Plan) -> PhaseStatus:
    if phase_id is not None:
        plan.phase(phase_id)  # a Refusal for an unknown phase
        st = next(s for s in statuses if s.phase.id == phase_id)
        if st.record is None:
            raise Refusal(f"{phase_id} has no full run to checkpoint; run `orchestrate run {phase_id}` first")
        return st
    ran = [s for s in statuses if s.record is not None]
    if not ran:
        raise Refusal("no phase has a full run to checkpoint; run `orchestrate run PHASE` first")
    return max(ran, key=lambda s: (s.record.ended_at, s.record.run_id))


def checkpoint(plan: Plan, phase_id: Optional[str] = None, *, commit: bool = False,
               note: Optional[str] = None) -> CheckpointResult:
    """Run a checkpoint (see module docstring). The caller holds the run lock."""
    if not plan.is_git:
        raise Refusal(f"{plan.root} is not a git repository; a checkpoint needs one")
    repo = open_repo(plan.root)
    op = in_progress_operation(repo)
    if op:
        raise Refusal(f"the repository is in the middle of {op}; finish or abort it, then checkpoint")
    statuses = plan_status(plan)
    st = _reported(statuses, phase_id, plan)
    rec = st.record
    if st.stale_reasons:
        raise Refusal(f"run {rec.run_id} of {st.phase.id} is stale against the working tree: "
                      + "; ".join(st.stale_reasons)
                      + f". Run `orchestrate run {st.phase.id}` again so the checkpoint holds the "
                      "code its gates ran on.")

    plan_changed = write_plan(plan)
    newly = [(s.phase.spec.title, s.record) for s in statuses if s.state is PhaseState.PASSED]
    lines = update_changelog(plan.changelog_path, newly)
    message = commit_message(st.phase.spec.title, rec, note)
    result = CheckpointResult(phase=st.phase.id, run_id=rec.run_id, plan_changed=plan_changed,
                              changelog_lines=lines, message=message,
                              detached=repo.head.is_detached)
    if not commit:
        return result

    lock_rel = f"{plan.spec.results_dir}/{LOCK_NAME}"
    repo.git.add("-A", "--", ".")
    if repo.head.is_valid() and repo.git.diff("--cached", "--name-only", "--", lock_rel).strip():
        repo.git.reset("-q", "--", lock_rel)  # the run lock is never part of a checkpoint
    elif not repo.head.is_valid() and repo.git.ls_files("--cached", "--", lock_rel).strip():
        repo.git.rm("-q", "--cached", "--", lock_rel)
    has_head = repo.head.is_valid()
    staged = repo.git.diff("--cached", "--name-only") if has_head else repo.git.ls_files("--cached")
    if not staged.strip():
        result.nothing_to_commit = True
        return result
    repo.git.commit("-m", message)
    sha = repo.head.commit.hexsha
    result.commit_sha = sha
    rows = repo.git.diff_tree("--no-commit-id", "--name-status", "-r", "--root", sha)
    result.files = [r for r in rows.splitlines() if r.strip()]
    return result
