"""Which recorded run decides a phase's state, and the latest run on each device.

"Newest" is by the records' order (`RunRecord.order`: the per-repository sequence number, not a
clock). The newest full run decides, with two rules for runs of the same code and spec (same
inputs hash and spec hash):

- a run that skipped gates (say on a machine without a GPU) never overrides an earlier full run
  of that code that ran more of them: among the runs of the newest run's code and spec, the one
  with the fewest skipped gates decides, the newest of those on a tie;
- but a run in which a gate failed (state ``failed`` or ``error``) is never outranked by an
  older run: when one is newer than that candidate, the newest such run decides, whatever it
  skipped.

Once the code or the spec changes, the newest run decides again, whatever it skipped. Partial
runs (``--gate``) never decide. This is a function of the records alone, so the plan renders the
same everywhere.
"""

from __future__ import annotations

from typing import Optional

from kdtree.gates.base import Outcome
from kdtree.orchestrator.specs import PhaseState, RunRecord

FAILING = (PhaseState.FAILED, PhaseState.ERROR)


def skipped(record: RunRecord) -> int:
    """How many of the run's gates were skipped."""
    return sum(1 for r in record.results if r.outcome is Outcome.SKIPPED)


def same_code(a: RunRecord, b: RunRecord) -> bool:
    """Whether two runs tested the same input files under the same spec."""
    return a.inputs_hash == b.inputs_hash and a.spec_hash == b.spec_hash


def full_runs(records: list[RunRecord]) -> list[RunRecord]:
    return [r for r in records if not r.partial]


def changed_during_run(record: RunRecord) -> str:
    """Why a run whose inputs changed while it ran cannot decide ("" when they did not)."""
    if not record.inputs_changed_during_run:
        return ""
    files = record.inputs_changed
    named = f" ({', '.join(files[:5])}{' and more' if len(files) > 5 else ''})" if files else ""
    return (f"its input files changed while its gates ran{named}, so it did not test one tree "
            "(an edit reverted before the end counts)")


def deciding_run(records: list[RunRecord]) -> Optional[RunRecord]:
    """The run that decides the phase's state (see module docstring); None without a full run."""
    full = [r for r in full_runs(records) if not r.inputs_changed_during_run]
    if not full:
        return None
    peers = [r for r in full if same_code(r, full[-1])]
    fewest = min(skipped(r) for r in peers)
    chosen = [r for r in peers if skipped(r) == fewest][-1]
    failing = [r for r in peers if r.state in FAILING and r.order > chosen.order]
    return failing[-1] if failing else chosen


def latest_by_device(records: list[RunRecord]) -> list[RunRecord]:
    """The newest full run on each device (by its label), newest first, and the deciding run
    too when an incomplete newer run on its own device hides it."""
    newest: dict[str, RunRecord] = {}
    for r in full_runs(records):
        newest[r.device.label] = r
    rows = list(newest.values())
    decider = deciding_run(records)
    if decider is not None and all(r.run_id != decider.run_id for r in rows):
        rows.append(decider)
    return sorted(rows, key=lambda r: r.order, reverse=True)


def complete_peer(record: RunRecord, records: list[RunRecord]) -> Optional[RunRecord]:
    """The newest full run of ``record``'s code and spec that skipped no gate, if ``record`` skipped any."""
    if not skipped(record) or deciding_run(records) is record:
        return None
    peers = [r for r in full_runs(records) if same_code(r, record) and not skipped(r)
             and not r.inputs_changed_during_run]
    return peers[-1] if peers else None


def why_not_deciding(record: RunRecord, decider: RunRecord) -> str:
    """Why ``record`` does not decide the state while ``decider`` does (for the listings)."""
    if record.inputs_changed_during_run:
        return changed_during_run(record)
    if same_code(record, decider) and decider.state in FAILING and decider.order > record.order:
        return (f"run {decider.run_id} is newer and a gate failed in it on the same inputs "
                f"({decider.state.value})")
    if same_code(record, decider) and skipped(record) > skipped(decider):
        return (f"it skipped {skipped(record)} gate(s) that run {decider.run_id} ran on the same "
                "inputs")
    if record.order < decider.order:
        return f"run {decider.run_id} is newer"
    return (f"it tested other inputs or another spec than the newest full run, whose code run "
            f"{decider.run_id} decides")
