"""Which plan a repository follows, and loading its phase modules.

A repository names its plan in its ``pyproject.toml``, the way pytest or ruff are configured::

    [tool.orchestrate]
    id = "0002-sm120-verify-kernel-defrag"
    title = "..."
    markdown = "plans/0002-sm120-verify-kernel-defrag.md"
    phases = ["kdtree.phases.phase1_kernel", "kdtree.phases.phase2_backend", ...]
    # results_dir = "plans/results", changelog = "CHANGELOG.md" (the defaults)

The table is a `PlanSpec` (unknown keys are errors). ``phases`` are import paths, imported with
the repo root first on ``sys.path``, so a repository may keep its own phase modules next to the
code. A repository without the table follows `DEFAULT_PLAN`, kdtree-engine's own plan.

Each phase module exports ``SPEC`` (a `PhaseSpec`, or a dict validated into one) and optionally
``CHECKS``: gate name -> ``check(spec, ctx) -> GateResult``. A gate with no check reports
``not-implemented``.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from pydantic import ValidationError

from kdtree.orchestrator.errors import PlanLoadError, Refusal
from kdtree.orchestrator.specs import PhaseSpec, PlanSpec

DEFAULT_PLAN = PlanSpec(
    id="0002-sm120-verify-kernel-defrag",
    title="An owned MLA tree-verify kernel for sm_120, its backend, graph capture and KV defrag",
    markdown="plans/0002-sm120-verify-kernel-defrag.md",
    phases=[
        "kdtree.phases.phase1_kernel",
        "kdtree.phases.phase2_backend",
        "kdtree.phases.phase3_graph",
        "kdtree.phases.phase4_defrag",
    ],
)


@dataclass(frozen=True)
class Phase:
    """A loaded phase: its spec, its checks by gate name, and the module it came from."""

    spec: PhaseSpec
    checks: dict[str, Callable[..., Any]]
    module: str

    @property
    def id(self) -> str:
        return self.spec.id


@dataclass
class Plan:
    """A loaded plan: its spec, its phases in order, and the repository it belongs to."""

    spec: PlanSpec
    phases: list[Phase]
    root: Path
    is_git: bool = True
    _by_id: dict[str, Phase] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._by_id = {p.id: p for p in self.phases}

    def phase(self, phase_id: str) -> Phase:
        """The phase ``phase_id``; a Refusal that lists the plan's phases if there is none."""
        try:
            return self._by_id[phase_id]
        except KeyError:
            raise Refusal(f"unknown phase {phase_id!r}; this plan's phases are "
                          f"{', '.join(self._by_id)}") from None

    def index(self, phase_id: str) -> int:
        return [p.id for p in self.phases].index(phase_id)

    @property
    def markdown_path(self) -> Path:
        return self.root / self.spec.markdown

    @property
    def results_path(self) -> Path:
        return self.root / self.spec.results_dir

    @property
    def changelog_path(self) -> Path:
        return self.root / self.spec.changelog


def format_validation_error(exc: ValidationError, prefix: str = "") -> str:
    """One line per problem, each with its field path (``gates.0.max_rel_l2: ...``)."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        path = f"{prefix}.{loc}" if prefix and loc else (prefix or loc)
        lines.append(f"  {path}: {err['msg']}")
    return "\n".join(lines)


def read_plan_spec(root: Path) -> PlanSpec:
    """The repository's `PlanSpec` from ``pyproject.toml`` [tool.orchestrate], else `DEFAULT_PLAN`."""
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        return DEFAULT_PLAN
    text = pyproject.read_text(encoding="utf-8")
    if "[tool.orchestrate]" not in text:
        return DEFAULT_PLAN  # skip the TOML parse: most pyprojects have no such table
    try:
        import tomllib  # noqa: PLC0415
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]  # noqa: PLC0415
    try:
        table = tomllib.loads(text).get("tool", {}).get("orchestrate")
    except tomllib.TOMLDecodeError as exc:
        raise PlanLoadError(f"{pyproject}: not valid TOML: {exc}") from None
    if table is None:
        return DEFAULT_PLAN
    try:
        return PlanSpec.model_validate(table)
    except ValidationError as exc:
        raise PlanLoadError(f"{pyproject}: bad [tool.orchestrate] plan:\n"
                            + format_validation_error(exc, "tool.orchestrate")) from None


def _spec_error_at_import(module_name: str, exc: ValidationError) -> PlanLoadError:
    """A spec built in Python failed inside one model: name that model and the module's line."""
    where = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename.endswith(module_name.replace(".", "/") + ".py") or \
                frame.filename.endswith(module_name.replace(".", "/") + "/__init__.py"):
            where = f" ({frame.filename}:{frame.lineno})"
    return PlanLoadError(f"phase module {module_name}: bad SPEC{where}:\n"
                         + format_validation_error(exc, exc.title))


def load_phase(module_name: str) -> Phase:
    """Import a phase module and validate its SPEC and CHECKS."""
    try:
        module = importlib.import_module(module_name)
    except ValidationError as exc:
        raise _spec_error_at_import(module_name, exc) from None
    except ImportError as exc:
        raise PlanLoadError(f"phase module {module_name} cannot be imported: {exc}") from None
    spec = getattr(module, "SPEC", None)
    if spec is None:
        raise PlanLoadError(f"phase module {module_name} exports no SPEC (a PhaseSpec)")
    if not isinstance(spec, PhaseSpec):
        try:
            spec = PhaseSpec.model_validate(spec)
        except ValidationError as exc:
            raise PlanLoadError(f"phase module {module_name}: bad SPEC:\n"
                                + format_validation_error(exc)) from None
    checks = dict(getattr(module, "CHECKS", {}) or {})
    names = {g.name for g in spec.gates}
    unknown = sorted(set(checks) - names)
    if unknown:
        raise PlanLoadError(f"phase module {module_name}: CHECKS has {unknown} but SPEC {spec.id} "
                            f"has no such gate (its gates: {sorted(names)})")
    for name, fn in checks.items():
        if not callable(fn):
            raise PlanLoadError(f"phase module {module_name}: CHECKS[{name!r}] is not callable")
    return Phase(spec=spec, checks=checks, module=module_name)


def load_plan(root: Path, is_git: bool = True, spec: Optional[PlanSpec] = None) -> Plan:
    """Load the repository's plan (or ``spec``) and every phase module it lists, in order."""
    spec = spec or read_plan_spec(root)
    root_str = str(root)
    if root_str in sys.path:
        sys.path.remove(root_str)
    sys.path.insert(0, root_str)  # first, so its own phase modules win over any other copy
    phases = [load_phase(m) for m in spec.phases]
    seen: dict[str, str] = {}
    for p in phases:
        if p.id in seen:
            raise PlanLoadError(f"phase id {p.id!r} is used by both {seen[p.id]} and {p.module}")
        seen[p.id] = p.module
    return Plan(spec=spec, phases=phases, root=root, is_git=is_git)
