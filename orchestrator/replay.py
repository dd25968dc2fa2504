"""Replaying one gate of a recorded run with the seeds it drew, for diagnosis.

Every gate draws its inputs from `GateContext.fresh_seed`, and `run_check` records the seeds a gate
drew in its result (``details["seeds_drawn"]``; phase 1's token_exact gate also kept its one
``seed`` before that). `replay_gate` runs the gate again on this machine with those seeds handed
out first, in order, so a failing trial comes back with the same prompts, trees and tensors: the
way to tell a defect from bad luck. A replay is never recorded and never changes a phase's state;
the gate's outcome is returned to be read, not trusted as evidence (the inputs were chosen).
"""

from __future__ import annotations

from typing import Optional, Sequence

from kdtree.gates.base import GateContext, GateResult, run_check
from kdtree.orchestrator import device as device_facts
from kdtree.orchestrator.errors import Refusal
from kdtree.orchestrator.gatecall import in_project
from kdtree.orchestrator.plan import Plan
from kdtree.orchestrator.sources import require_own_sources
from kdtree.orchestrator.store import ResultStore


def recorded_seeds(plan: Plan, phase_id: str, gate: str, run_id: str) -> list[int]:
    """The seeds gate `gate` drew in run `run_id` of `phase_id`; a Refusal saying what is missing."""
    plan.phase(phase_id)
    records = ResultStore(plan.results_path).records(phase_id)
    record = next((r for r in records if r.run_id == run_id or r.run_id.startswith(run_id)), None)
    if record is None:
        known = ", ".join(r.run_id for r in records[-5:]) or "none"
        raise Refusal(f"phase {phase_id} has no run {run_id!r} (latest: {known}); see `orchestrate history {phase_id}`")
    result = next((g for g in record.results if g.gate == gate), None)
    if result is None:
        raise Refusal(f"run {record.run_id} of {phase_id} did not run gate {gate!r} "
                      f"(it ran {', '.join(g.gate for g in record.results)})")
    seeds = result.details.get("seeds_drawn")
    if seeds is None and "seed" in result.details:
        seeds = [result.details["seed"]]
    if not seeds:
        if record.schema_version >= 3:  # written when every seed drawn was kept
            raise Refusal(f"run {record.run_id}: gate {gate!r} drew no random seeds, so there is nothing "
                          f"to replay: it measures the same inputs every time. Run it again with "
                          f"`orchestrate run {phase_id} --gate {gate}`")
        raise Refusal(f"run {record.run_id}: gate {gate!r} recorded no seeds: it drew none (then "
                      f"`orchestrate run {phase_id} --gate {gate}` measures the same inputs again), or "
                      "the run predates kept seeds; pass the seeds with --seed if you know them")
    return [int(s) for s in seeds]


def replay_gate(plan: Plan, phase_id: str, gate: str, seeds: Sequence[int], device: str = "auto",
                progress=None) -> GateResult:
    """Run `gate` of `phase_id` once with `seeds` handed out first by `fresh_seed`. Records nothing."""
    phase = plan.phase(phase_id)
    require_own_sources(plan.root, [p.module for p in plan.phases])
    names = [g.name for g in phase.spec.gates]
    if gate not in names:
        raise Refusal(f"phase {phase_id} has no gate {gate!r}; its gates are {', '.join(names)}")
    resolved = device_facts.resolve_device(device)
    ctx = GateContext(device=resolved, requested_device=device, repo_root=plan.root,
                      replay_seeds=[int(s) for s in seeds], **({"progress": progress} if progress else {}))
    with in_project(plan.root):  # where `run` runs it, whatever folder the command was typed in
        return run_check(phase.spec.gate(gate), phase.checks.get(gate), ctx)


def replay_note(result: GateResult, seeds: Sequence[int]) -> Optional[str]:
    """A warning when the gate drew more seeds than were given (the rest were fresh)."""
    drawn = result.details.get("seeds_drawn", [])
    if len(drawn) > len(seeds):
        return (f"the gate drew {len(drawn)} seeds and {len(seeds)} were given: the last "
                f"{len(drawn) - len(seeds)} were fresh, so part of this trial is new")
    return None
