"""Which plan a project follows, and loading its phase modules.

A project names its plan in its ``pyproject.toml``, the way pytest or ruff are configured::

    [tool.orchestrate]
    id = "0002-sm120-verify-kernel-defrag"
    title = "..."
    markdown = "plans/0002-sm120-verify-kernel-defrag.md"
    phases = ["kdtree.phases.phase1", "kdtree.phases.phase2", ...]
    # results_dir = "plans/results", changelog = "CHANGELOG.md" (the defaults)

The table is a `PlanSpec` (unknown keys are errors); every path in it is relative to the folder
of that ``pyproject.toml`` (the project root; `kdtree.orchestrator.repo` finds it). A project
without the table has no plan: `read_plan_spec` refuses and names ``orchestrate init``.

**How a phase is found** (the loader's whole interface): each entry of ``phases`` is an import
path, imported with `importlib.import_module` with the project root first on ``sys.path`` (so a
project's own modules win over any installed copy). The module, or package, exports

- ``SPEC``: a `PhaseSpec` (or a dict validated into one), and optionally
- ``CHECKS``: gate name -> the gate's check, ``check(spec, ctx) -> GateResult``: a function, or
  a ``"module:function"`` string (``"pkg.checks:check_speed"``; a module starting with ``.`` is
  relative to the phase's package), the way entry points and DVC's stage commands name code. A
  gate with no check reports ``not-implemented``.

Nothing else of the module is used, so a phase may be a module or a package whose
``__init__`` exports the two names. A module that fails to import (a SyntaxError, any
exception, a bad SPEC, an unknown requirement) is refused at load with its file and line (exit 2).

A string check is a `CheckRef`: at load its module must be found (its parent packages are
imported, the module itself is not), else the plan is refused naming the string (exit 2); the
module is imported and the function looked up when the gate runs, so a phase whose checks need
torch loads without it (``orchestrate status`` never imports a check module). A function the
module lacks is that gate's ``error``, naming the string.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from pydantic import ValidationError

from kdtree.orchestrator.errors import PlanLoadError, Refusal
from kdtree.orchestrator.specs import PhaseSpec, PlanSpec

CONFIG_TABLE = re.compile(r"^[ \t]*\[[ \t]*tool[ \t]*\.[ \t]*orchestrate[ \t]*\]", re.M)


def has_plan_config(folder: Path) -> bool:
    """Whether ``folder/pyproject.toml`` has a ``[tool.orchestrate]`` table."""
    try:
        text = (folder / "pyproject.toml").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return bool(CONFIG_TABLE.search(text))


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

    def input_globs(self, phase: Phase) -> list[str]:
        """The phase's input globs, less the orchestrator's own outputs (the results folder, the
        plan markdown, the changelog), which are never inputs: a run must not make its phase stale."""
        return [*phase.spec.inputs, f"!{self.spec.results_dir.rstrip('/')}/**",
                f"!{self.spec.markdown}", f"!{self.spec.changelog}"]


def format_validation_error(exc: ValidationError, prefix: str = "") -> str:
    """One line per problem, each with its field path (``gates.0.max_rel_l2: ...``)."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        path = f"{prefix}.{loc}" if prefix and loc else (prefix or loc)
        lines.append(f"  {path}: {err['msg']}")
    return "\n".join(lines)


def read_plan_spec(root: Path) -> PlanSpec:
    """The project's `PlanSpec` from ``root/pyproject.toml`` [tool.orchestrate]; a `PlanLoadError`
    naming ``orchestrate init`` when there is none."""
    pyproject = root / "pyproject.toml"
    table = None
    if has_plan_config(root):
        try:
            import tomllib  # noqa: PLC0415
        except ImportError:  # Python 3.10
            import tomli as tomllib  # type: ignore[no-redef]  # noqa: PLC0415
        try:
            table = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("tool", {}).get("orchestrate")
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise PlanLoadError(f"{pyproject}: not valid TOML: {exc}") from None
    if table is None:
        where = pyproject if pyproject.is_file() else f"{root} (it has no pyproject.toml)"
        raise PlanLoadError(f"no plan here: {where} has no [tool.orchestrate] table, and no "
                            "pyproject.toml between the current folder and the repository root has "
                            "one. Run `orchestrate init` in the project's folder to scaffold a plan "
                            "(the table, a plan markdown and a first phase module), or pass --repo "
                            "FOLDER of a project that has one")
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


def _module_file(module_name: str) -> Optional[str]:
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None and spec.has_location else None


def _import_error(module_name: str, exc: BaseException) -> PlanLoadError:
    """A phase module that raised while importing: its file and line, and the error."""
    if isinstance(exc, SyntaxError):
        where = f"{exc.filename}:{exc.lineno}"
        return PlanLoadError(f"phase module {module_name} cannot be imported: {where}: "
                             f"{type(exc).__name__}: {exc.msg}"
                             + (f"\n    {exc.text.strip()}" if exc.text else ""))
    frames = traceback.extract_tb(exc.__traceback__)
    origin = _module_file(module_name)
    ours = [f for f in frames if origin and f.filename == origin]
    skip = ("<frozen", "importlib")
    frame = (ours or [f for f in frames if not any(k in f.filename for k in skip)] or frames or [None])[-1]
    where = f"{frame.filename}:{frame.lineno}: " if frame is not None else ""
    if isinstance(exc, ModuleNotFoundError) and exc.name and module_name.startswith(exc.name):
        return PlanLoadError(f"phase module {module_name} cannot be imported: {exc} (check `phases` "
                             "in [tool.orchestrate]: each is an import path, found from the project root)")
    return PlanLoadError(f"phase module {module_name} cannot be imported: {where}{type(exc).__name__}: {exc}")


class CheckRef:
    """A gate's check named by a ``"module:function"`` string, imported when the gate runs."""

    def __init__(self, ref: str, package: Optional[str] = None):
        module, sep, attr = ref.partition(":")
        if not sep or not module or not attr or not all(part.isidentifier() for part in attr.split(".")):
            raise ValueError(f"check {ref!r} is not \"module:function\" (e.g. \"pkg.checks:check_speed\")")
        try:
            self.module = importlib.util.resolve_name(module, package) if module.startswith(".") else module
        except (ImportError, ValueError) as exc:
            raise ValueError(f"check {ref!r}: {exc}") from None
        self.ref, self.attr = ref, attr

    def find(self) -> None:
        """Raise ValueError unless the module exists (found without importing it)."""
        try:
            found = importlib.util.find_spec(self.module)
        except (ImportError, ValueError) as exc:
            raise ValueError(f"check {self.ref!r}: module {self.module} cannot be found: {exc}") from None
        if found is None:
            raise ValueError(f"check {self.ref!r}: there is no module {self.module}")

    def resolve(self) -> Callable[..., Any]:
        """The function, imported now; a LookupError naming the string if it is not there."""
        target: Any = importlib.import_module(self.module)
        for part in self.attr.split("."):
            try:
                target = getattr(target, part)
            except AttributeError:
                raise LookupError(f"check {self.ref!r}: {self.module} has no {self.attr}") from None
        if not callable(target):
            raise LookupError(f"check {self.ref!r}: {self.module}.{self.attr} is not callable")
        return target

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"CheckRef({self.ref!r})"


def resolve_check(check: Any, package: Optional[str] = None) -> Callable[..., Any]:
    """A CHECKS value as a function: a ``"module:function"`` string is imported and looked up now."""
    return CheckRef(check, package).resolve() if isinstance(check, str) else check


def load_phase(module_name: str) -> Phase:
    """Import a phase module and validate its SPEC and CHECKS (see the module docstring)."""
    try:
        module = importlib.import_module(module_name)
    except ValidationError as exc:
        raise _spec_error_at_import(module_name, exc) from None
    except Exception as exc:  # noqa: BLE001 - any failure to import is the module's, with its line
        raise _import_error(module_name, exc) from None
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
    package = module.__name__ if hasattr(module, "__path__") else module.__name__.rpartition(".")[0]
    for name, fn in checks.items():
        if isinstance(fn, str):
            try:
                checks[name] = ref = CheckRef(fn, package)
                ref.find()
            except ValueError as exc:
                raise PlanLoadError(f"phase module {module_name}: CHECKS[{name!r}]: {exc}") from None
        elif not callable(fn):
            raise PlanLoadError(f"phase module {module_name}: CHECKS[{name!r}] is neither callable nor "
                                "a \"module:function\" string")
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
