"""The gate framework: outcomes, results, figures, the context a check runs in, and `run_check`.

A gate is a pydantic spec (its thresholds, see `kdtree.gates.spec`) plus a check function
``check(spec, ctx) -> GateResult``. `run_check` is the only way a check is run:

- a requirement the machine lacks (``cuda``, ``nvcc``, ``sm>=80``, ``triton``, ...) gives
  ``skipped`` with the reason, and the phase is incomplete, never passed;
- an exception inside the check gives ``error`` with the traceback, never ``passed``;
- a ``passed`` result that carries no figure ("measured nothing") is turned into ``error``;
- KeyboardInterrupt and SystemExit propagate: an interrupted run is the runner's business.

This module imports neither torch nor anything else of the project but the toolkit locator
(`kdtree.cuda_toolkit`, which lives in the root package for that reason).
"""

from __future__ import annotations

import enum
import math
import os
import re
import shutil
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kdtree import cuda_toolkit


class Outcome(str, enum.Enum):
    """What a gate concluded. Only ``passed`` counts towards a passing phase."""

    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"
    ERROR = "error"
    NOT_IMPLEMENTED = "not-implemented"
    TIMEOUT = "timeout"  # ran past its time limit (the orchestrator stops it)


Comparator = Literal[">=", "<=", ">", "<", "=="]


def compare(value: float, op: Comparator, threshold: float) -> bool:
    """``value op threshold``; NaN never satisfies any comparison."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return False
    return {
        ">=": value >= threshold,
        "<=": value <= threshold,
        ">": value > threshold,
        "<": value < threshold,
        "==": value == threshold,
    }[op]


class Figure(BaseModel):
    """One measured number, optionally held against a threshold (``value op threshold``)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    value: Optional[float]
    unit: str = ""
    threshold: Optional[float] = None
    op: Optional[Comparator] = None
    key: bool = False  # the figure `orchestrate status` shows for the gate

    @field_validator("value", mode="before")
    @classmethod
    def _nan_to_none(cls, v: Any) -> Any:
        if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
            return None  # JSON has no NaN; None reads as "not a number" and never passes
        return v

    @property
    def ok(self) -> Optional[bool]:
        """True/False against the threshold; None when the figure has no threshold."""
        if self.threshold is None or self.op is None:
            return None
        return self.value is not None and compare(self.value, self.op, self.threshold)

    def render(self) -> str:
        """``speedup 4.2x >= 3.0x`` style text."""
        val = "NaN" if self.value is None else fmt_number(self.value)
        text = f"{self.name} {val}{self.unit}"
        if self.threshold is not None and self.op is not None:
            mark = "" if self.ok else " (miss)"
            text += f" {self.op} {fmt_number(self.threshold)}{self.unit}{mark}"
        return text


def fmt_number(x: float) -> str:
    """A figure's value as reports write it (3 significant digits, no needless exponent)."""
    if x == 0:
        return "0"
    ax = abs(x)
    if ax >= 1000 or ax < 1e-3:
        return f"{x:.3g}"
    if ax >= 100:
        return f"{x:.0f}"
    if ax >= 10:
        return f"{x:.1f}"
    return f"{x:.3g}"


class GateResult(BaseModel):
    """The outcome of one gate with everything it measured."""

    model_config = ConfigDict(extra="forbid")

    gate: str
    kind: str
    outcome: Outcome
    summary: str = ""
    figures: list[Figure] = Field(default_factory=list)
    reason: Optional[str] = None  # why skipped / not implemented
    traceback: Optional[str] = None  # set for ``error``
    duration_s: float = 0.0
    details: dict[str, Any] = Field(default_factory=dict)  # JSON-able extras (per-case rows, ...)

    @property
    def passed(self) -> bool:
        return self.outcome is Outcome.PASSED

    def key_figure(self) -> Optional[Figure]:
        for fig in self.figures:
            if fig.key:
                return fig
        for fig in self.figures:
            if fig.threshold is not None:
                return fig
        return self.figures[0] if self.figures else None


def verdict(gate: str, kind: str, figures: list[Figure], summary: str = "", **details: Any) -> GateResult:
    """A result whose outcome follows from its figures: passed iff every thresholded figure is ok.

    A gate with no thresholded figure has measured nothing against its spec and is an error.
    """
    checked = [f for f in figures if f.ok is not None]
    if not checked:
        return GateResult(gate=gate, kind=kind, outcome=Outcome.ERROR, figures=figures,
                          summary=summary or "measured nothing against a threshold", details=details)
    missed = [f for f in checked if not f.ok]
    outcome = Outcome.FAILED if missed else Outcome.PASSED
    if not summary:
        summary = "; ".join(f.render() for f in (missed or checked)[:3])
    return GateResult(gate=gate, kind=kind, outcome=outcome, figures=figures, summary=summary,
                      details=details)


def not_implemented(gate: str, kind: str, reason: str) -> GateResult:
    """What a gate reports until the phase's work exists. It is a failure, never a pass."""
    return GateResult(gate=gate, kind=kind, outcome=Outcome.NOT_IMPLEMENTED, reason=reason,
                      summary=f"not implemented: {reason}")


ProgressFn = Callable[[str, Optional[float]], None]


def _no_progress(message: str, fraction: Optional[float] = None) -> None:
    return None


@dataclass
class GateContext:
    """Where and how a check runs. Checks draw fresh randomness themselves (see `fresh_seed`)."""

    device: str = "cpu"  # where the gates run: "cpu" or "cuda"
    repo_root: Path = field(default_factory=Path.cwd)
    artifacts_dir: Optional[Path] = None  # where plots / tables may be written
    quick: bool = False  # smaller grids (tests, CI)
    progress: ProgressFn = _no_progress
    env: dict[str, str] = field(default_factory=dict)
    # What the run was asked for ("auto", "cpu" or "cuda"); None means "the same as device".
    # Only the wording of skip reasons depends on it.
    requested_device: Optional[str] = None
    # Every seed `fresh_seed` handed out, in order: `run_check` records them in the result's
    # details ("seeds_drawn"), so that a failing trial can be replayed (`orchestrate replay`).
    seeds: list[int] = field(default_factory=list)
    # A replay's seeds, handed out first and in order; fresh ones follow when they run out.
    # Only `orchestrate replay` sets them, and a replay is never recorded.
    replay_seeds: list[int] = field(default_factory=list)

    def fresh_seed(self) -> int:
        """A seed nobody chose: every trial of every run sees new inputs (a replay's, when replaying)."""
        seed = self.replay_seeds.pop(0) if self.replay_seeds else int.from_bytes(os.urandom(4), "little")
        self.seeds.append(seed)
        return seed


def _cuda_capability() -> Optional[tuple[int, int]]:
    try:
        import torch  # noqa: PLC0415 - only when a gate asks for CUDA
    except Exception:
        return None
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability()


KNOWN_REQUIREMENTS = ("cuda", "sm>=NN", "nvcc", "triton", "compute-sanitizer", "torch", "exe:NAME")
_SM_RE = re.compile(r"^sm>=[0-9]{2,3}$")


def requirement_error(req: str) -> Optional[str]:
    """Why ``req`` is not a requirement `missing_requirement` knows (None: it is one).

    Gate specs call this when they are built, so a typo'd requirement is refused at load with
    the spec's file and line instead of skipping the gate on every machine.
    """
    if req in ("cuda", "nvcc", "triton", "compute-sanitizer", "torch") or _SM_RE.match(req):
        return None
    if req.startswith("exe:") and len(req) > 4 and "/" not in req[4:]:
        return None
    hint = ""
    if req.startswith("sm"):
        hint = " (write a compute capability as sm>=80, sm>=90, sm>=120)"
    elif req.startswith("exe:"):
        hint = " (exe: takes a program name found on PATH, e.g. exe:ninja)"
    else:
        hint = f" (for any other program on PATH write exe:{req})"
    return (f"unknown requirement {req!r}{hint}; the known requirements are "
            + ", ".join(KNOWN_REQUIREMENTS))


def needs_cuda(requires: list[str]) -> bool:
    """Whether these requirements ask for a CUDA device (``cuda`` or ``sm>=NN``)."""
    return any(r == "cuda" or r.startswith("sm>=") for r in requires)


def missing_requirement(requires: list[str], ctx: GateContext) -> Optional[str]:
    """The first requirement this machine lacks, as a sentence, or None if all are met.

    Known requirements: ``cuda``, ``sm>=NN``, ``nvcc``, ``triton``, ``compute-sanitizer``,
    ``torch``, and ``exe:NAME`` for any executable on PATH.
    """
    for req in requires:
        if req == "torch":
            try:
                import torch  # noqa: F401, PLC0415
            except Exception:
                return "torch is not installed"
        elif req == "cuda":
            if ctx.device == "cpu":
                return _why_cpu(ctx)
            if _cuda_capability() is None:
                return "no CUDA GPU is visible (torch.cuda.is_available() is False)"
        elif req.startswith("sm>="):
            cap = _cuda_capability()
            need = int(req[4:])
            if cap is None:
                return f"{req} needs a CUDA GPU and none is visible"
            if cap[0] * 10 + cap[1] < need:
                return f"{req} not met: the GPU is sm_{cap[0]}{cap[1]}"
        elif req == "nvcc":
            if cuda_toolkit.find_nvcc() is None:
                return "nvcc was not found (CUDA_HOME, CUDA_PATH, PATH or /usr/local/cuda)"
        elif req == "triton":
            try:
                import triton  # noqa: F401, PLC0415
            except Exception:
                return "triton is not installed"
        elif req == "compute-sanitizer":
            if cuda_toolkit.find_compute_sanitizer() is None:
                return "compute-sanitizer was not found (CUDA_HOME, CUDA_PATH, PATH or /usr/local/cuda)"
        elif req.startswith("exe:"):
            if shutil.which(req[4:]) is None:
                return f"{req[4:]} is not on PATH"
        else:
            return f"unknown requirement {req!r}"
    return None


def _why_cpu(ctx: GateContext) -> str:
    """Why a run on cpu has no CUDA: the user asked for cpu, or ``auto`` found no GPU."""
    requested = ctx.requested_device or ctx.device
    if requested == "cpu":
        return "the run was asked for --device cpu"
    try:
        import torch  # noqa: F401, PLC0415
    except Exception:
        cause = "torch is not installed"
    else:
        cause = "torch.cuda.is_available() is False"
    return f"no CUDA GPU is visible (--device {requested} chose cpu; {cause})"


CheckFn = Callable[[Any, GateContext], GateResult]


def run_check(spec: Any, check: Optional[CheckFn], ctx: GateContext) -> GateResult:
    """Run one gate's check under the framework's rules (see module docstring)."""
    name, kind = spec.name, spec.kind
    start = time.perf_counter()
    if check is None:
        return not_implemented(name, kind, "the phase provides no check for this gate")
    reason = missing_requirement(list(spec.requires), ctx)
    if reason is not None:
        return GateResult(gate=name, kind=kind, outcome=Outcome.SKIPPED, reason=reason,
                          summary=f"skipped: {reason}")
    try:
        result = check(spec, ctx)
        if not isinstance(result, GateResult):
            raise TypeError(f"check for gate {name!r} returned {type(result).__name__}, not GateResult")
        if result.outcome is Outcome.PASSED and not any(f.ok for f in result.figures):
            result = result.model_copy(update={
                "outcome": Outcome.ERROR,
                "summary": "reported passed but measured nothing against a threshold"})
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of a check is an error outcome
        result = GateResult(gate=name, kind=kind, outcome=Outcome.ERROR,
                            summary=f"{type(exc).__name__}: {exc}"[:500],
                            traceback=traceback.format_exc())
    result.duration_s = time.perf_counter() - start
    result.gate, result.kind = name, kind
    if ctx.seeds:
        result.details.setdefault("seeds_drawn", list(ctx.seeds))
    return result
