"""Running a phase's gates and recording the run.

`run_phase` checks the plan order, gathers the machine facts, runs each gate through
`kdtree.gates.base.run_check`, evaluates the gates' targets (`kdtree.orchestrator.targets`) and
writes one `RunRecord` atomically. Before the first gate it checks that the record and the plan
can be written; the inputs are observed at the start and at the end (content hash and file
metadata), and a run whose inputs changed in between names no commit and never decides.

Each gate runs isolated (`kdtree.orchestrator.gatecall`): its output goes to the run's log file
``<results_dir>/<phase>/<run_id>.log`` (named in the record; removed when nothing was printed),
its working folder is the project root, its changes to ``os.environ`` are undone, and it runs at
most its time limit (`time_limit`), past which it is recorded as a ``timeout`` outcome. A
result that claims a pass its figures contradict is recorded as failed
(`kdtree.orchestrator.verdicts`), and what JSON cannot hold is converted
(`kdtree.orchestrator.jsonsafe`).

Interruption policy: if the run is stopped by Ctrl-C (KeyboardInterrupt) before its first gate
or during a gate, **nothing is written** — the previous records and the plan stay exactly as
they were — and `RunInterrupted` is raised. A gate that raises any other exception, or calls
``sys.exit()``, is an ``error`` outcome and the run is recorded as such. Once the gates ran,
any failure to build or store the record rescues it (`kdtree.orchestrator.preflight`).

The caller holds the run lock (`kdtree.orchestrator.lock`) and re-renders the plan afterwards.
"""

from __future__ import annotations

import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional, Protocol, Sequence

from kdtree.gates.base import GateContext, GateResult, Outcome, needs_cuda, run_check
from kdtree.orchestrator import device as device_facts
from kdtree.orchestrator.errors import Refusal, RunInterrupted
from kdtree.orchestrator.gatecall import GateTimeout, isolated_call
from kdtree.orchestrator.gitinfo import git_info
from kdtree.orchestrator.inputs import InputsIndex
from kdtree.orchestrator.lock import HOLDER_SUFFIX, LOCK_NAME
from kdtree.orchestrator.plan import Plan
from kdtree.orchestrator.jsonsafe import plain_result
from kdtree.orchestrator.preflight import require_writable, rescue_results, write_record
from kdtree.orchestrator.sources import require_own_sources
from kdtree.orchestrator.specs import DeviceInfo, RunRecord, Versions, state_of
from kdtree.orchestrator.state import blockers, describe_blockers, plan_status
from kdtree.orchestrator.store import ResultStore, new_run_id
from kdtree.orchestrator.targets import evaluate_targets
from kdtree.orchestrator.verdicts import hold_to_figures


class Reporter(Protocol):
    """What the runner tells a progress display."""

    def phase_started(self, phase: str, gates: Sequence[str]) -> None: ...
    def gate_started(self, gate: str) -> None: ...
    def gate_progress(self, gate: str, message: str, fraction: Optional[float]) -> None: ...
    def gate_finished(self, result: GateResult) -> None: ...


class SilentReporter:
    """A reporter that shows nothing (tests, library use)."""

    def phase_started(self, phase: str, gates: Sequence[str]) -> None: ...
    def gate_started(self, gate: str) -> None: ...
    def gate_progress(self, gate: str, message: str, fraction: Optional[float]) -> None: ...
    def gate_finished(self, result: GateResult) -> None: ...


def select_gates(plan: Plan, phase_id: str, names: Sequence[str]) -> list[str]:
    """The gate names a run covers (all, in spec order, when ``names`` is empty)."""
    phase = plan.phase(phase_id)
    known = [g.name for g in phase.spec.gates]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise Refusal(f"phase {phase_id} has no gate {', '.join(map(repr, unknown))}; "
                      f"its gates are {', '.join(known)}")
    return [n for n in known if n in names] if names else known


def wants_cuda(phase, selected: Sequence[str]) -> bool:
    """Whether a gate of the run asks for a CUDA device (only then is torch imported)."""
    return any(needs_cuda(list(phase.spec.gate(n).requires)) for n in selected)


def run_phase(plan: Plan, phase_id: str, *, device: str = "auto", gates: Sequence[str] = (),
              force: bool = False, reporter: Optional[Reporter] = None,
              machine: Optional[tuple[DeviceInfo, Versions]] = None,
              gate_timeout: Optional[float] = None,
              warn: Callable[[str], None] = lambda message: None) -> RunRecord:
    """Run ``phase_id``'s gates (or the ``gates`` subset) and store the run; return its record.

    Refuses (`Refusal`) when an earlier phase is not passed-and-fresh, unless ``force``, when
    the environment would import the plan's code from outside the repository
    (`kdtree.orchestrator.sources`), and when the results folder or the plan cannot be written
    (`kdtree.orchestrator.preflight`), all before any gate runs. If the record cannot be written
    after the gates ran, it is saved elsewhere and `RecordNotWritten` says where.
    ``machine`` overrides the gathered device facts (for tests); ``gate_timeout`` is the time
    limit of gates whose spec names none (`time_limit`); ``warn`` gets the warnings about what
    the gates returned. See the module docstring for what happens on interruption.
    """
    reporter = reporter or SilentReporter()
    phase = plan.phase(phase_id)
    require_own_sources(plan.root, [p.module for p in plan.phases])
    selected = select_gates(plan, phase_id, gates)
    store = ResultStore(plan.results_path)
    try:
        statuses = plan_status(plan, store)
        blocking = blockers(statuses, phase_id)
        if blocking and not force:
            raise Refusal(describe_blockers(blocking, phase_id))
        require_writable(plan, phase_id)
        resolved = device_facts.resolve_device(device, wants_cuda(phase, selected))
        dev, vers = machine or (device_facts.device_info(resolved),
                                device_facts.versions(list(phase.spec.versions)))
        globs = plan.input_globs(phase)
        seen_before = InputsIndex(plan.root, plan.is_git).observe(globs)
        inputs_hash = seen_before.inputs_hash
        git = git_info(plan.root, plan.is_git, inputs=(globs, inputs_hash),
                       ignore=_lock_paths(plan))
    except KeyboardInterrupt:
        raise RunInterrupted(phase_id, None) from None
    started = datetime.now(timezone.utc)
    run_id = new_run_id(started)
    artifacts = store.phase_dir(phase_id)
    artifacts.mkdir(parents=True, exist_ok=True)
    log_path = artifacts / f"{run_id}.log"
    notes: list[str] = []

    reporter.phase_started(phase_id, selected)
    results: list[GateResult] = []
    try:
        for name in selected:
            spec = phase.spec.gate(name)
            ctx = GateContext(device=resolved, requested_device=device, repo_root=plan.root,
                              artifacts_dir=artifacts,
                              progress=lambda msg, frac=None, _n=name: reporter.gate_progress(_n, msg, frac))
            reporter.gate_started(name)
            limit = time_limit(spec, plan, gate_timeout)
            result = _call_gate(spec, phase.checks.get(name), ctx, log_path, plan, limit, phase_id)
            result = plain_result(hold_to_figures(result), notes.append)
            results.append(result)
            reporter.gate_finished(result)
    except BaseException:
        _drop(log_path)  # an interrupted run records nothing
        raise

    ended = datetime.now(timezone.utc)
    try:
        changed = InputsIndex(plan.root, plan.is_git).observe(globs).changed_since(seen_before)
        if changed:  # the gates did not run on one tree: no commit holds what they ran
            git = git.model_copy(update={"sha": None, "sha_source": None})
        partial = len(selected) < len(phase.spec.gates)
        record = RunRecord(
            phase=phase_id, run_id=run_id, seq=store.next_seq(), log=_log_of(log_path, plan),
            state=state_of(results),
            spec_hash=phase.spec.spec_hash(), spec=phase.spec.model_dump(mode="json"),
            inputs_hash=inputs_hash, input_files=seen_before.files, git=git, device=dev, versions=vers,
            started_at=started, ended_at=ended, forced=bool(force and blocking),
            forced_over=[b.phase.id for b in blocking], partial=partial,
            gates_selected=selected if partial else [],
            inputs_changed_during_run=bool(changed), inputs_changed=changed[:50], results=results,
            targets=evaluate_targets(phase.spec, results),
        )
        record.model_dump_json()  # proves it can be stored before anything is written
    except Exception as exc:  # noqa: BLE001 - after the gates ran, nothing may lose the run
        rescue_results(plan, phase_id, run_id, results, exc)
    for note in notes:
        warn(note)
    write_record(plan, store, record)
    return record


def time_limit(spec, plan: Plan, gate_timeout: Optional[float]) -> Optional[float]:
    """A gate's time limit: its spec's ``time_limit_s``, else ``--gate-timeout``, else the plan's
    ``gate_timeout_s`` (None: no limit)."""
    return spec.time_limit_s or gate_timeout or plan.spec.gate_timeout_s


def _call_gate(spec, check, ctx: GateContext, log_path: Path, plan: Plan, limit: Optional[float],
               phase_id: str) -> GateResult:
    """One gate through `run_check`, isolated (`kdtree.orchestrator.gatecall`)."""
    start = time.perf_counter()
    header = f"===== gate {spec.name} ({datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC) =====\n"
    try:
        with open(log_path, "a", encoding="utf-8") as fh:
            fh.write(header)
    except OSError:
        pass
    try:
        return isolated_call(lambda: run_check(spec, check, ctx), log_path=log_path, root=plan.root,
                             time_limit_s=limit)
    except GateTimeout as exc:
        return GateResult(gate=spec.name, kind=spec.kind, outcome=Outcome.TIMEOUT,
                          summary=f"timeout: {exc}", reason=str(exc),
                          duration_s=time.perf_counter() - start,
                          details={"time_limit_s": exc.limit_s})
    except KeyboardInterrupt:
        raise RunInterrupted(phase_id, spec.name) from None
    except SystemExit as exc:  # a check that calls sys.exit() is a defect of the check
        return GateResult(gate=spec.name, kind=spec.kind, outcome=Outcome.ERROR,
                          summary=f"the check called sys.exit({exc.code!r})",
                          traceback=traceback.format_exc(), duration_s=time.perf_counter() - start)


def _log_of(log_path: Path, plan: Plan) -> Optional[str]:
    """The log's path relative to the project root, or None (and no file) when nothing was printed."""
    try:
        if log_path.stat().st_size == 0 or _only_headers(log_path):
            _drop(log_path)
            return None
    except OSError:
        return None
    return log_path.relative_to(plan.root).as_posix()


def _only_headers(path: Path) -> bool:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return all(line.startswith("===== gate ") for line in fh)


def _drop(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def _lock_paths(plan: Plan) -> tuple[str, ...]:
    lock = f"{plan.spec.results_dir.rstrip('/')}/{LOCK_NAME}"
    return (lock, lock + HOLDER_SUFFIX)
