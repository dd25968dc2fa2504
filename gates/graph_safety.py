"""CUDA-graph safety gate: judges what `kdtree.bench.graph_replay` measured of a captured callable
replayed on fresh inputs against its eager calls.

Each case arrives as a `CaseReport`: its capture error (a host sync in capture is one), the
allocations made in capture and in replays, the worst replay-vs-eager rel-L2 and its problems,
and, when timed, the replay and eager time spreads. `summarize` holds them against the spec: no
capture failure, no allocation in capture (a case allowed to allocate from the graph's pool has
those reported as ``pool_allocations_in_capture``) or in any replay, every replay compared and
within ``spec.max_rel_l2``, and with ``spec.min_replay_speedup`` the median replay speedup.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Optional

from kdtree.gates.base import Figure, GateResult, Outcome, verdict
from kdtree.gates.spec import GraphSafetyGateSpec
from kdtree.gates.stats import Spread


@dataclass
class CaseReport:
    """What happened to one case; `summarize` turns a list of them into a GateResult."""

    name: str
    capture_error: Optional[str] = None
    host_sync: bool = False
    allocations: int = 0
    torch_allocations: int = 0  # what torch's capture machinery itself allocated (not counted)
    pool_allocations: int = 0  # capture allocations of a case that may allocate from the graph pool
    replay_allocations: int = 0  # allocations made by graph.replay() calls, over all replays
    replays: int = 0
    worst_rel_l2: float = 0.0
    problems: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    replay_s: Optional[Spread] = None
    eager_s: Optional[Spread] = None

    @property
    def speedup(self) -> Optional[float]:
        if self.replay_s is None or self.eager_s is None or self.replay_s.median <= 0:
            return None
        return self.eager_s.median / self.replay_s.median

    def as_row(self) -> dict[str, Any]:
        return {"case": self.name, "capture_error": self.capture_error, "host_sync": self.host_sync,
                "allocations_in_capture": self.allocations, "torch_capture_allocations": self.torch_allocations,
                "pool_allocations_in_capture": self.pool_allocations,
                "allocations_in_replay": self.replay_allocations, "replays": self.replays,
                "worst_rel_l2": None if math.isnan(self.worst_rel_l2) or math.isinf(self.worst_rel_l2)
                else self.worst_rel_l2,
                "problems": self.problems[:10], "seeds": self.seeds,
                "replay": self.replay_s.ms() if self.replay_s else None,
                "eager": self.eager_s.ms() if self.eager_s else None, "speedup": self.speedup}


def summarize(spec: GraphSafetyGateSpec, reports: list[CaseReport], **details: Any) -> GateResult:
    """The gate's result from per-case reports (no GPU needed).

    Figures: ``worst_rel_l2`` (key, replay vs eager, ``<= spec.max_rel_l2``), ``capture_failures``,
    ``allocations_in_capture`` and ``allocations_in_replay`` (all must be 0),
    ``pool_allocations_in_capture`` (cases allowed to allocate from the graph pool; recorded),
    ``replays_compared`` (every case's replays),
    and with ``spec.min_replay_speedup`` the median ``replay_speedup`` over cases.
    """
    if not reports:
        return GateResult(gate=spec.name, kind=spec.kind, outcome=Outcome.ERROR,
                          summary="no graph cases were given: measured nothing")
    rels = [r.worst_rel_l2 for r in reports]
    worst = math.nan if any(math.isnan(x) for x in rels) else max(rels)
    failures = [r for r in reports if r.capture_error]
    figures = [
        Figure(name="worst_rel_l2", value=worst, op="<=", threshold=spec.max_rel_l2, key=True),
        Figure(name="capture_failures", value=len(failures), op="<=", threshold=0),
        Figure(name="host_syncs_in_capture", value=sum(r.host_sync for r in reports)),
        Figure(name="allocations_in_capture", value=sum(r.allocations for r in reports), op="<=", threshold=0),
        Figure(name="allocations_in_replay", value=sum(r.replay_allocations for r in reports), op="<=", threshold=0),
        Figure(name="pool_allocations_in_capture", value=sum(r.pool_allocations for r in reports)),
        Figure(name="replays_compared", value=sum(r.replays for r in reports), op=">=",
               threshold=spec.replays * len(reports)),
    ]
    if spec.min_replay_speedup is not None:
        speedups = [r.speedup for r in reports if r.speedup is not None]
        figures.append(Figure(name="replay_speedup", value=statistics.median(speedups) if speedups else math.nan,
                              unit="x", op=">=", threshold=spec.min_replay_speedup))
    messages = []
    for r in reports:
        if r.capture_error:
            what = "host sync during capture" if r.host_sync else "capture failed"
            messages.append(f"{r.name}: {what}: {r.capture_error[:300]}")
        if r.allocations:
            messages.append(f"{r.name}: {r.allocations} allocations during capture")
        if r.replay_allocations:
            messages.append(f"{r.name}: {r.replay_allocations} allocations during {r.replays} replays")
        messages.extend(f"{r.name}: {p}" for p in r.problems[:2])
    result = verdict(spec.name, spec.kind, figures, "; ".join(messages[:4]),
                     cases=[r.as_row() for r in reports], **details)
    if messages and result.outcome is Outcome.PASSED:
        result.outcome = Outcome.FAILED
    return result
