"""``orchestrate init``: a plan of one's own in a project folder, ready to run.

It writes, refusing to overwrite anything:

- a ``[tool.orchestrate]`` table in the folder's ``pyproject.toml`` (created if absent), edited
  with tomlkit so the rest of the file keeps its formatting, comments and line endings (CRLF
  stays CRLF); a pyproject that is not valid TOML, or that already has ``tool.orchestrate`` in
  any form (a table, a sub-table, an inline table), is refused and left as it was,
- ``.gitignore`` entries for virtual environments and caches (``.venv/``, ``venv/``,
  ``__pycache__/``), added to the file's end when missing, so ``git add -A`` does not commit them,
- the plan markdown ``plans/<id>.md`` with its orchestrator-owned blocks,
- a phase package ``<package>/`` with one phase module: a metric gate with two thresholds
  (which decide) and a target (recorded, never blocking) and the check that measures them.

The example runs anywhere Python runs (no GPU, no torch): ``orchestrate run`` passes it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from kdtree.orchestrator.errors import Refusal
from kdtree.fsutil import atomic_write_bytes, atomic_write_text
from kdtree.orchestrator.plan import has_plan_config

PHASE_TEMPLATE = '''"""Phase {phase}: Python's sorted() orders fresh random lists, fast enough.

Replace the check with what your project must prove. The orchestrator imports this module and
reads two names: SPEC (what the phase is, its input files and its gates with their thresholds)
and CHECKS (gate name -> check function).
"""

import random
import time

from kdtree.gates.base import GateContext, GateResult
from kdtree.gates.metric import check_metric
from kdtree.gates.spec import MetricGateSpec, PhaseSpec, Target, Threshold

SPEC = PhaseSpec(
    id="{phase}",
    title="sorting",
    objective="sorted() returns every fresh random list in order, at a useful rate",
    # The files this phase depends on: editing one makes its recorded run stale.
    inputs=["{package}/**"],
    # Versions a run records besides python and the orchestrator (e.g. "torch", "nvcc").
    versions=[],
    gates=[
        MetricGateSpec(
            name="sort",
            description="fresh random lists sorted; none out of order, and the rate",
            requires=[],  # e.g. ["cuda"], ["nvcc"], ["exe:ninja"]: skipped where missing
            thresholds=[  # decide the gate: every one must hold
                Threshold(figure="out_of_order", op="==", value=0),
                Threshold(figure="items_per_s", op=">=", value=1e4, unit="/s"),
            ],
            targets=[  # recorded as met / not met with the margin; never block anything
                Target(figure="items_per_s", op=">=", value=1e9, unit="/s",
                       note="an ambition, not a requirement"),
            ],
        ),
    ],
)


def check_sort(spec: MetricGateSpec, ctx: GateContext) -> GateResult:
    """Sort fresh random lists (a new seed every run, recorded for `orchestrate replay`)."""
    rng = random.Random(ctx.fresh_seed())
    lists = [[rng.random() for _ in range(1000)] for _ in range(200)]
    start = time.perf_counter()
    results = [sorted(values) for values in lists]
    elapsed = time.perf_counter() - start
    out_of_order = sum(any(a > b for a, b in zip(r, r[1:])) for r in results)
    ctx.progress(f"sorted {{len(lists)}} lists", 1.0)
    return check_metric(spec, {{"out_of_order": out_of_order,
                                "items_per_s": sum(map(len, lists)) / elapsed}}, ctx)


CHECKS = {{"sort": check_sort}}
'''

PLAN_TEMPLATE = """# {title}

Write the plan's prose anywhere outside the orchestrator's blocks: why it exists, what each
phase proves. `orchestrate` rewrites only the text between a block's begin and end markers.

<!-- orchestrate:begin status -->
<!-- orchestrate:end status -->

## Phase {phase}: sorting

<!-- orchestrate:begin results-{phase} -->
<!-- orchestrate:end results-{phase} -->
"""

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PHASE = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass
class Scaffold:
    """What `init` wrote (paths relative to the project folder)."""

    written: list[str]
    plan_id: str


def default_id(folder: Path) -> str:
    name = re.sub(r"[^A-Za-z0-9_.\-]+", "-", folder.name).strip("-.") or "plan"
    return name if _ID.match(name) else "plan"


def init_project(folder: Path, plan_id: str = "", title: str = "", package: str = "phases",
                 phase: str = "example") -> Scaffold:
    """Scaffold a plan in ``folder`` (see module docstring); a Refusal if anything is in the way."""
    plan_id = plan_id or default_id(folder)
    title = title or f"Plan {plan_id}"
    if not _ID.match(plan_id):
        raise Refusal(f"--id {plan_id!r}: use letters, digits, '.', '_' and '-', starting with a letter or digit")
    if not _IDENT.match(package):
        raise Refusal(f"--package {package!r} must be a Python identifier (it is imported as {package}.{phase})")
    if not _PHASE.match(phase):
        raise Refusal(f"--phase {phase!r}: use lowercase letters, digits and '_', starting with a letter")
    if '"' in title or "\\" in title or "\n" in title:
        raise Refusal("--title may not contain quotes, backslashes or newlines")
    if has_plan_config(folder):
        raise Refusal(f"{folder / 'pyproject.toml'} already has a [tool.orchestrate] table; this project "
                      "has a plan (`orchestrate status` shows it)")
    markdown = f"plans/{plan_id}.md"
    files = {
        markdown: PLAN_TEMPLATE.format(title=title, phase=phase),
        f"{package}/__init__.py": f'"""The phases of plan {plan_id} (see {markdown})."""\n',
        f"{package}/{phase}.py": PHASE_TEMPLATE.format(phase=phase, package=package),
    }
    taken = [rel for rel in files if (folder / rel).exists()]
    if taken:
        raise Refusal(f"orchestrate init would overwrite {', '.join(taken)} in {folder}; move them "
                      "away or choose other names (--id, --package, --phase)")
    pyproject = folder / "pyproject.toml"
    new_pyproject = with_plan_table(pyproject, plan_id=plan_id, title=title, markdown=markdown,
                                    package=package, phase=phase)
    ignore_path = folder / ".gitignore"
    new_ignore = with_ignores(ignore_path)
    try:
        for rel, text in files.items():
            atomic_write_text(folder / rel, text)
        atomic_write_bytes(pyproject, new_pyproject)
        if new_ignore is not None:
            atomic_write_bytes(ignore_path, new_ignore)
    except OSError as exc:
        raise Refusal(f"orchestrate init could not write in {folder}: {exc.strerror or exc}") from None
    written = ["pyproject.toml", *files] + ([".gitignore"] if new_ignore is not None else [])
    return Scaffold(written=written, plan_id=plan_id)


IGNORED = (".venv/", "venv/", "__pycache__/")


def _newline(data: bytes) -> bytes:
    return b"\r\n" if b"\r\n" in data else b"\n"


def with_ignores(path: Path) -> "bytes | None":
    """``.gitignore``'s new bytes with the `IGNORED` entries it lacks (None: it has them all)."""
    data = path.read_bytes() if path.is_file() else b""
    have = {line.strip() for line in data.decode("utf-8", "replace").splitlines()}
    missing = [e for e in IGNORED if e not in have and e.rstrip("/") not in have]
    if not missing:
        return None
    nl = _newline(data)
    head = data if not data or data.endswith(b"\n") else data + nl
    block = [b"# virtual environments and caches (orchestrate init)"] + [e.encode() for e in missing]
    return head + nl.join(block) + nl


def with_plan_table(pyproject: Path, **values: str) -> bytes:
    """``pyproject``'s new bytes with a ``[tool.orchestrate]`` table (see module docstring)."""
    import tomlkit  # noqa: PLC0415
    from tomlkit.exceptions import TOMLKitError  # noqa: PLC0415

    data = pyproject.read_bytes() if pyproject.is_file() else b""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Refusal(f"{pyproject} is not UTF-8 (byte offset {exc.start}); fix it, then run "
                      "`orchestrate init` again. Nothing was written") from None
    try:
        doc = tomlkit.parse(text)
    except TOMLKitError as exc:
        raise Refusal(f"{pyproject} is not valid TOML ({exc}); fix it, then run `orchestrate init` "
                      "again. Nothing was written") from None
    tool = doc.get("tool")
    if tool is not None and not isinstance(tool, dict):
        raise Refusal(f"{pyproject}: `tool` is not a table; fix it, then run `orchestrate init` again")
    if tool is not None and "orchestrate" in tool:
        raise Refusal(f"{pyproject} already has tool.orchestrate; this project has a plan "
                      "(`orchestrate status` shows it), or complete that table with id, title, "
                      "markdown and phases (docs/orchestrator-guide.md). Nothing was written")
    if isinstance(tool, tomlkit.items.InlineTable):
        raise Refusal(f"{pyproject} writes `tool` as an inline table (`tool = {{ ... }}`), which "
                      "cannot take a [tool.orchestrate] table; rewrite it as [tool.NAME] tables, "
                      "then run `orchestrate init` again. Nothing was written")
    table = tomlkit.table()
    table.add("id", values["plan_id"])
    table.add("title", values["title"])
    table.add("markdown", values["markdown"])
    table.add("phases", [f"{values['package']}.{values['phase']}"])
    table.add(tomlkit.comment('results_dir = "plans/results"  (run records, one JSON file per run)'))
    table.add(tomlkit.comment('changelog = "CHANGELOG.md"     (a line per phase that newly passed, at checkpoints)'))
    if tool is None:
        tool = tomlkit.table(is_super_table=True)
        tool.add("orchestrate", table)
        doc.add("tool", tool)
    else:
        tool.add("orchestrate", table)
    out = tomlkit.dumps(doc)
    if data.endswith(b"\n") or not data:
        out = out if out.endswith("\n") else out + "\n"
    try:
        check = tomlkit.parse(out)["tool"]["orchestrate"]
        assert check["id"] == values["plan_id"]
    except (TOMLKitError, KeyError, AssertionError):  # never write a file that would not load
        raise Refusal(f"orchestrate init could not add [tool.orchestrate] to {pyproject} without "
                      "breaking it; add the table by hand (docs/orchestrator-guide.md)") from None
    if _newline(data) == b"\r\n":
        out = out.replace("\r\n", "\n").replace("\n", "\r\n")
    return out.encode("utf-8")
