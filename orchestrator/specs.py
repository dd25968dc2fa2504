"""The orchestrator's records and the plan spec (pydantic v2, unknown fields forbidden).

`PhaseSpec` and the gate specs live in `kdtree.gates.spec` (phase modules build them without
importing the orchestrator) and are re-exported here. This module adds:

- `PlanSpec`: which phase modules make the plan, in order, and where its markdown lives;
- `RunRecord`: one run of one phase, as stored under ``plans/results/<phase>/<run_id>.json``,
  with `GitInfo`, `DeviceInfo` and `Versions`, the machine facts every figure is stored with,
  and `TargetResult`, each gate target evaluated on the run's figures.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kdtree.gates.base import Comparator, GateResult, Outcome
from kdtree.gates.spec import GateSpec, PhaseSpec  # noqa: F401 - re-exported

# 2: GitInfo.head / sha_source, RunRecord.targets; 3: RunRecord.seq and RunRecord.log (1 and 2
# still load).
SCHEMA_VERSION = 3


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _relative(path: str, what: str) -> str:
    if not path or path.startswith("/") or ".." in path.split("/"):
        raise ValueError(f"{what} {path!r} must be a path relative to the repo root")
    return path


class PlanSpec(_Strict):
    """A plan: phase modules (import paths) in the order they must pass, and its files.

    Each phase module exports ``SPEC`` (a `PhaseSpec`) and ``CHECKS`` (gate name -> check).
    """

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    title: str = ""
    markdown: str  # the plan's prose + orchestrator-owned blocks
    phases: list[str] = Field(min_length=1)  # import paths, e.g. "kdtree.phases.phase1"
    results_dir: str = "plans/results"
    changelog: str = "CHANGELOG.md"
    # Seconds any gate may run before it is stopped (a timeout outcome), unless the gate's spec
    # names its own `time_limit_s` or the command line gives --gate-timeout; None: no limit.
    gate_timeout_s: Optional[float] = Field(None, gt=0)

    @field_validator("markdown", "results_dir", "changelog")
    @classmethod
    def _paths_relative(cls, v: str, info) -> str:
        return _relative(v, info.field_name)

    @field_validator("phases")
    @classmethod
    def _unique_modules(cls, v: list[str]) -> list[str]:
        dup = sorted({m for m in v if v.count(m) > 1})
        if dup:
            raise ValueError(f"phase modules listed twice: {dup}")
        return v


class PhaseState(str, enum.Enum):
    """A phase's state. Only ``passed`` lets the next phase run without ``--force``."""

    PENDING = "pending"  # no full run recorded
    PASSED = "passed"  # every gate passed
    FAILED = "failed"  # some gate failed or is not implemented
    ERROR = "error"  # some gate raised / measured nothing / ran past its time limit
    INCOMPLETE = "incomplete"  # some gates skipped (e.g. no GPU), the rest passed
    STALE = "stale"  # passed/incomplete, but its inputs or spec changed since


def state_of(results: list[GateResult]) -> PhaseState:
    """The state a set of gate outcomes amounts to (no staleness: that needs the working tree)."""
    outcomes = {r.outcome for r in results}
    if not results:
        return PhaseState.ERROR
    if outcomes & {Outcome.ERROR, Outcome.TIMEOUT}:
        return PhaseState.ERROR
    if outcomes & {Outcome.FAILED, Outcome.NOT_IMPLEMENTED}:
        return PhaseState.FAILED
    if Outcome.SKIPPED in outcomes:
        return PhaseState.INCOMPLETE
    return PhaseState.PASSED


class GitInfo(_Strict):
    """Which commit holds the files a run tested.

    ``sha`` is a commit only when its tree holds exactly the input files the run hashed: HEAD's,
    when HEAD's tree matched at the start of the run (``sha_source`` "head"), or the commit a
    checkpoint found in the history for the recorded inputs hash ("checkpoint"). Otherwise it is
    None and the run's commit is unknown (``head`` still says what HEAD was, for the record): a
    GPU host whose copy of ``.git`` lags the files it was sent must not name the wrong commit.
    Records written before this rule (no ``sha_source``) name HEAD and ``dirty``.
    """

    sha: Optional[str] = None  # None: unknown (see above) or not a git repository
    dirty: Optional[bool] = None  # the working tree differed from HEAD (untracked files count)
    branch: Optional[str] = None  # None: detached HEAD or no repository
    head: Optional[str] = None  # HEAD when the run started, whether or not its tree matched
    sha_source: Optional[Literal["head", "checkpoint"]] = None

    @property
    def short(self) -> str:
        """``1a2b3c4d5e``, ``unknown`` (HEAD's tree did not hold the inputs) or ``no-git``."""
        if self.sha is None:
            return "unknown" if self.head else "no-git"
        legacy_dirty = self.sha_source is None and self.dirty
        return self.sha[:10] + ("+dirty" if legacy_dirty else "")


class DeviceInfo(_Strict):
    """Where the gates ran."""

    kind: str  # "cpu" or "cuda"
    name: str
    compute_capability: Optional[str] = None  # "9.0"
    driver: Optional[str] = None
    host: str = ""

    @property
    def label(self) -> str:
        """``NVIDIA H200 (sm_90)`` / ``cpu (x86_64)``."""
        if self.compute_capability:
            return f"{self.name} (sm_{self.compute_capability.replace('.', '')})"
        return self.name


class Versions(_Strict):
    """Software the figures depend on: python, the orchestrator (``kdtree``, the kdtree-engine
    distribution) and what the phase declares in `PhaseSpec.versions`; None where not installed
    or not declared."""

    python: str
    kdtree: Optional[str] = None
    torch: Optional[str] = None
    cuda: Optional[str] = None  # torch's CUDA runtime
    triton: Optional[str] = None
    nvcc: Optional[str] = None
    packages: dict[str, Optional[str]] = Field(default_factory=dict)  # other declared distributions

    def items(self) -> list[tuple[str, str]]:
        """(name, version) of everything recorded, in a stable order."""
        fixed = [(k, getattr(self, k)) for k in ("python", "kdtree", "torch", "cuda", "triton", "nvcc")]
        return [(k, v) for k, v in fixed + sorted(self.packages.items()) if v]


class TargetResult(_Strict):
    """One target of a gate, evaluated on the figure the gate recorded (never blocks anything)."""

    gate: str
    figure: str
    op: Comparator
    target: float
    unit: str = ""
    note: str = ""
    status: Literal["met", "not met", "not measured"]
    measured: Optional[float] = None
    # How far past (+) or short of (-) the target the figure is, in the figure's unit, and the
    # ratio measured/target (target/measured for "<=" and "<"): >= 1 when met. None: not measured.
    margin: Optional[float] = None
    ratio: Optional[float] = None
    reason: Optional[str] = None  # why not measured


class RunRecord(BaseModel):
    """One run of one phase. Written once, atomically; a checkpoint may only fill in ``git.sha``."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    phase: str
    run_id: str
    # The run's place in this repository's history of runs (all phases): one more than the
    # highest recorded when it was written. Runs are ordered by it, not by a clock that may be
    # wrong; None in records written before it existed (they order by time, before any run
    # that has one).
    seq: Optional[int] = Field(None, ge=1)
    # The gates' output (stdout and stderr), relative to the project root; None: they printed nothing.
    log: Optional[str] = None
    state: PhaseState  # from the outcomes alone; staleness is judged later against the tree
    spec_hash: str
    spec: dict[str, Any]  # the PhaseSpec as run: every threshold the figures were held against
    inputs_hash: str
    input_files: int
    git: GitInfo
    device: DeviceInfo
    versions: Versions
    started_at: datetime
    ended_at: datetime
    forced: bool = False
    forced_over: list[str] = Field(default_factory=list)  # earlier phases that were not passed-and-fresh
    partial: bool = False  # only some gates ran (--gate); never decides the phase's state
    gates_selected: list[str] = Field(default_factory=list)
    # The inputs changed while the gates ran (content, or file metadata: an edit that was
    # reverted counts): the record does not describe one tree, so it never decides the state.
    inputs_changed_during_run: bool = False
    inputs_changed: list[str] = Field(default_factory=list)  # which input files, where known
    results: list[GateResult]
    targets: list[TargetResult] = Field(default_factory=list)  # empty in runs before targets existed

    @property
    def duration_s(self) -> float:
        return (self.ended_at - self.started_at).total_seconds()

    @property
    def order(self) -> tuple:
        """The key runs are ordered by, oldest first: the sequence number where the record has
        one (records without one come first, by time), then the start time and run id."""
        return (self.seq is not None, self.seq or 0, self.started_at, self.run_id)

    def result(self, gate: str) -> Optional[GateResult]:
        for r in self.results:
            if r.gate == gate:
                return r
        return None

    @property
    def passed_count(self) -> int:
        return sum(1 for r in self.results if r.passed)
