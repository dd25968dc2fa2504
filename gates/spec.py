"""Pydantic specs: one GateSpec kind per generic gate, and PhaseSpec (a named set of gates).

PhaseSpec lives here, at the bottom of the dependency order, so that phase modules can build
their SPEC without importing the orchestrator (orchestrator -> phases -> gates). Every model
forbids unknown fields, so a typo in a spec fails at load with the field path in the message.
Thresholds are stated here, in the spec, and recorded with every run: changing one makes the
phase stale.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kdtree.gates.base import Comparator, requirement_error


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Target(_Strict):
    """A figure the phase aims for beyond its thresholds ("best in the field"): ``figure op value``.

    Evaluated on the gate's recorded figures after it runs and recorded as met / not met / not
    measured with the margin. A target never changes the gate's outcome or the phase's state, and
    is not part of the spec hash: changing one makes no phase stale.
    """

    figure: str
    op: Comparator
    value: float
    unit: str = ""
    note: str = ""  # what it compares with, e.g. "vs FlashInfer FA2 MLA, chain mask"


class GateSpecBase(_Strict):
    """What every gate has: a name unique in its phase, a description, its requirements, its targets."""

    kind: str
    name: str = Field(pattern=r"^[a-z][a-z0-9_\-]*$")
    description: str = ""
    requires: list[str] = Field(default_factory=list)  # see kdtree.gates.base.KNOWN_REQUIREMENTS
    targets: list[Target] = Field(default_factory=list)
    # The benchmark's parameters as data (sizes, contexts, batches, trees, trials, by "full" and
    # "quick" where a quick run measures less): what the gate's measurement runs, where a reader
    # of the spec sees it.
    workload: dict[str, Any] = Field(default_factory=dict)
    # Seconds the gate may run before the orchestrator stops it (a timeout outcome); None: the
    # plan's default. Not part of the spec hash: it bounds the run, not what is measured.
    time_limit_s: Optional[float] = Field(None, gt=0)

    @field_validator("requires")
    @classmethod
    def _known_requirements(cls, requires: list[str]) -> list[str]:
        problems = [p for p in map(requirement_error, requires) if p]
        if problems:
            raise ValueError("; ".join(problems))
        return requires


class BuildGateSpec(GateSpecBase):
    """Compile with nvcc for each arch and hold ptxas' resource report against limits."""

    kind: Literal["build"] = "build"
    archs: list[str] = Field(default_factory=lambda: ["sm_90", "sm_120"], min_length=1)
    max_registers: int = Field(255, ge=1, le=255)
    max_spill_bytes: int = Field(0, ge=0)
    max_stack_bytes: int = Field(0, ge=0)
    max_shared_bytes: int = Field(101376, ge=0)  # sm_120's per-block limit
    forbidden_sass: list[str] = Field(default_factory=lambda: ["HGMMA", "UTCHMMA", "UTCQMMA"])
    # Only entry functions whose name contains one of these are held to the limits (and their SASS
    # to required_sass); the others are listed, unchecked. Empty: every function.
    only_kernels: list[str] = Field(default_factory=list)
    required_sass: list[str] = Field(default_factory=list)  # opcodes that must appear in the checked kernels


class AccuracyGateSpec(GateSpecBase):
    """Candidate vs an independent oracle on fresh random cases; buffers poisoned with a fresh
    payload, left stale or not passed at all (`kdtree.gates.accuracy`)."""

    kind: Literal["accuracy"] = "accuracy"
    trials: int = Field(3, ge=2)  # fresh seeds per case; >= 2 so no case is seen only once
    max_rel_l2: float = Field(1e-2, gt=0)  # ||out - ref|| / ||ref|| over a whole output
    max_abs_rel: float = Field(2e-2, gt=0)  # max |out - ref| / max |ref|: the output's own scale
    max_abs: Optional[float] = Field(None, gt=0)  # an absolute max |out - ref|, only where stated
    max_row_rel: Optional[float] = Field(None, gt=0)  # per row: ||out_r - ref_r|| / the row's scale
    check_lse: bool = True
    max_lse_abs: float = Field(1e-2, gt=0)


class DecisionScreenSpec(_Strict):
    """Decisions screened with the reference alone, so that a small error of the op's softmax
    scale changes tokens while rounding noise does not.

    The phase draws fresh prompts and trees, and keeps every decision (a tree node's greedy
    token) whose reference margin stays above ``noise_multiple`` times the margin change that
    ``noise_draws`` draws of rounding-sized noise (``noise_ulps`` bf16 ulps on every op output and, with
    ``softmax_ulps``, on every softmax weight before PV, as a flash kernel's bf16 P rounds)
    cause there; a kept decision is *sensitive* when the reference itself, run with the scale
    off by ``scale_drift`` (either sign), picks another token, by more than that noise too. The
    candidate must reproduce the reference's token at every kept decision, and the screen must
    find ``min_sensitive`` sensitive decisions for each sign: it screens fresh trees, up to
    ``max_rounds`` verify steps, until it has; where the phase's screen model is itself drawn at
    random, up to ``model_draws`` models are screened in turn (whether another is drawn depends on
    the reference's sensitive counts alone, never on the candidate).
    """

    scale_drift: float = Field(0.02, gt=0, lt=0.5)  # relative, applied as (1 + d) and (1 - d)
    noise_ulps: float = Field(1.0, gt=0)  # uniform noise amplitude per output element
    softmax_ulps: float = Field(0.0, ge=0)  # and per softmax weight before PV (bf16 P of a flash kernel)
    noise_draws: int = Field(12, ge=1)  # per-node noise in bf16 is bimodal: few draws miss its large mode
    noise_multiple: float = Field(4.0, ge=1)  # margins kept above this many times the noise
    tree_nodes: int = Field(1024, ge=2, le=1024)  # per prompt, at most (3/4 to all of it); deep trees see more keys
    min_sensitive: int = Field(8, ge=1)  # sensitive decisions per sign of the drift
    max_rounds: int = Field(3, ge=1)  # screened verify steps at most (per model draw)
    model_draws: int = Field(1, ge=1)  # screen models drawn at most, while too few decisions are sensitive


class TokenExactGateSpec(GateSpecBase):
    """Token streams (candidate, reference) per prompt and run must agree; first divergence
    reported. Optionally the op under test must have been called in every step, and the
    candidate's mean accepted length per step must match the reference's."""

    kind: Literal["token_exact"] = "token_exact"
    min_prompts: int = Field(16, ge=1)  # distinct prompts, whatever the number of runs over each
    max_new_tokens: int = Field(32, ge=1)
    min_exact_fraction: float = Field(1.0, ge=0, le=1)  # of prompts exact in every run
    min_op_calls_per_step: Optional[int] = Field(None, ge=1)  # in every step of every counted run
    max_accept_rel_diff: Optional[float] = Field(None, ge=0)  # |cand - ref| / ref, mean accepted
    max_margin_fraction: Optional[float] = Field(None, gt=0)  # logit drift / greedy margin, worst row
    # Oracle near-ties (`kdtree.gates.token_exact`): where the reference's top-1 / top-2 logit margin
    # is below tie_margin, a correct bf16 kernel's rounding can pick the runner-up; such a flip (to
    # the runner-up exactly) is reported as a near-tie, not a divergence, in at most
    # max_near_tie_prompts prompts. Rows under tie_margin are also left out of max_margin_fraction.
    tie_margin: Optional[float] = Field(None, gt=0)
    max_near_tie_prompts: int = Field(1, ge=0)
    screen: Optional[DecisionScreenSpec] = None  # a screened run: see DecisionScreenSpec


class SpeedupGateSpec(GateSpecBase):
    """Candidate and baseline timed interleaved in one process; outputs compared first."""

    kind: Literal["speedup"] = "speedup"
    baseline: str
    min_median_speedup: float = Field(gt=0)  # median over the configs
    min_each_speedup: float = Field(gt=0)  # every config
    trials: int = Field(3, ge=2)  # input sets per config, each fresh; rounds rotate among them
    warmup: int = Field(5, ge=0)
    repeats: int = Field(30, ge=3)
    agree_max_rel_l2: float = Field(2e-2, gt=0)  # candidate vs baseline, first and last timed call
    min_roofline_median: Optional[float] = Field(None, gt=0, le=1)  # floor / measured, median
    min_roofline_each: Optional[float] = Field(None, gt=0, le=1)
    max_roofline: float = Field(1.05, gt=0)  # above the floor => a measurement error


class SanitizerGateSpec(GateSpecBase):
    """compute-sanitizer tools over a small driver program: zero errors each."""

    kind: Literal["sanitizer"] = "sanitizer"
    tools: list[Literal["memcheck", "racecheck", "initcheck", "synccheck"]] = Field(
        default_factory=lambda: ["memcheck", "racecheck"], min_length=1)
    max_errors: int = Field(0, ge=0)
    timeout_s: float = Field(600, gt=0)


class GraphSafetyGateSpec(GateSpecBase):
    """A captured graph replays == eager on fresh inputs, with no host sync or allocation in capture."""

    kind: Literal["graph_safety"] = "graph_safety"
    replays: int = Field(8, ge=1)
    max_rel_l2: float = Field(1e-6, ge=0)
    min_replay_speedup: Optional[float] = Field(None, gt=0)
    warmup: int = Field(3, ge=0)  # eager calls before capture, and calls before timing
    repeats: int = Field(20, ge=3)  # timed replay/eager pairs when min_replay_speedup is set


class Threshold(_Strict):
    """One named figure held against a bound: ``figure op value``."""

    figure: str
    op: Comparator
    value: float
    unit: str = ""


class MetricGateSpec(GateSpecBase):
    """A check that reports named figures, each held against its threshold."""

    kind: Literal["metric"] = "metric"
    thresholds: list[Threshold] = Field(min_length=1)


GateSpec = Annotated[
    Union[BuildGateSpec, AccuracyGateSpec, TokenExactGateSpec, SpeedupGateSpec,
          SanitizerGateSpec, GraphSafetyGateSpec, MetricGateSpec],
    Field(discriminator="kind"),
]


class PhaseSpec(_Strict):
    """A phase of the plan: what it delivers, which files it depends on, and its gates."""

    id: str = Field(pattern=r"^[a-z][a-z0-9_\-]*$")
    title: str
    objective: str
    deliverables: list[str] = Field(default_factory=list)
    inputs: list[str] = Field(default_factory=list)  # file globs, relative to the repo root
    gates: list[GateSpec] = Field(min_length=1)
    # The software whose versions a run record stores besides python and the orchestrator:
    # "torch" (with its CUDA runtime), "triton", "nvcc", or any installed distribution's name.
    # Not part of the spec hash: declaring one more makes no record stale.
    versions: list[str] = Field(default_factory=list)

    @field_validator("gates")
    @classmethod
    def _unique_gate_names(cls, gates: list) -> list:
        seen: set[str] = set()
        for g in gates:
            if g.name in seen:
                raise ValueError(f"duplicate gate name {g.name!r}")
            seen.add(g.name)
        return gates

    @model_validator(mode="after")
    def _inputs_relative(self) -> "PhaseSpec":
        for pattern in self.inputs:
            if pattern.startswith("/") or ".." in pattern.split("/"):
                raise ValueError(f"input glob {pattern!r} must be relative to the repo root")
        return self

    def gate(self, name: str):
        for g in self.gates:
            if g.name == name:
                return g
        raise KeyError(f"phase {self.id} has no gate {name!r}; it has {[g.name for g in self.gates]}")

    def spec_hash(self) -> str:
        """Hash of the spec, thresholds included: a changed threshold makes the phase stale.

        Targets and versions are left out: they never decide a state, so changing one makes
        nothing stale.
        """
        blob = json.dumps(self.model_dump(mode="json", exclude={"versions": True,
                                                                 "gates": {"__all__": {"targets", "time_limit_s"}}}),
                          sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]
