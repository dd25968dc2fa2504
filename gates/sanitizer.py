"""Sanitizer gate: ``compute-sanitizer --tool TOOL`` over a driver command, once per tool.

Each run must end with compute-sanitizer's summary: ``ERROR SUMMARY: N errors`` (racecheck:
``RACECHECK SUMMARY: H hazards displayed (N errors, W warnings)``); N is held against
``spec.max_errors``. A run without a summary (the sanitizer or the driver died, or it timed out)
measured nothing and makes the gate an ``error``; so does a driver that exits non-zero while the
sanitizer reports no error (it failed before it exercised the kernel), and, when the caller names
a ``require_marker``, a log that lacks it (the driver prints it once it has run everything).
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from kdtree import cuda_toolkit
from kdtree.gates.base import Figure, GateContext, GateResult, Outcome, verdict
from kdtree.gates.spec import SanitizerGateSpec

ERROR_EXITCODE = 86  # what compute-sanitizer exits with when it found errors
_SUMMARY = re.compile(r"ERROR SUMMARY:\s*(\d+)\s+errors?")
_RACE_SUMMARY = re.compile(r"RACECHECK SUMMARY:\s*(\d+)\s+hazards? displayed\s*\((\d+)\s+errors?,\s*(\d+)\s+warnings?\)")
_ERROR_LINE = re.compile(r"^=+\s+(?!ERROR SUMMARY)(?!RACECHECK SUMMARY)(?!COMPUTE-SANITIZER)(\S.*)$")


@dataclass
class ToolRun:
    """What one sanitizer run returned: exit status and the combined output."""

    returncode: Optional[int]  # None: timed out
    output: str


Runner = Callable[[list[str], dict[str, str], float, Optional[Path]], ToolRun]


def parse_error_summary(text: str) -> Optional[int]:
    """The error count of a sanitizer log, or None when it has no summary line.

    The last ``ERROR SUMMARY: N errors`` and the errors of the last ``RACECHECK SUMMARY`` both
    count; when both are present the larger wins.
    """
    counts = []
    if (found := _SUMMARY.findall(text)):
        counts.append(int(found[-1]))
    if (races := _RACE_SUMMARY.findall(text)):
        counts.append(int(races[-1][1]))
    return max(counts) if counts else None


def parse_race_warnings(text: str) -> Optional[int]:
    """W from the last ``RACECHECK SUMMARY: ... (N errors, W warnings)``, or None."""
    races = _RACE_SUMMARY.findall(text)
    return int(races[-1][2]) if races else None


def error_lines(text: str, limit: int = 5) -> list[str]:
    """The first report lines (``========= Invalid __global__ read ...``) of a sanitizer log."""
    out = []
    for line in text.splitlines():
        m = _ERROR_LINE.match(line)
        if m and not m.group(1).startswith(("at ", "by ", "Saved host backtrace", "Host Frame")):
            out.append(m.group(1).strip())
            if len(out) >= limit:
                break
    return out


def find_compute_sanitizer() -> Optional[str]:
    """compute-sanitizer from the CUDA toolkit (`kdtree.cuda_toolkit`), or None."""
    return cuda_toolkit.find_compute_sanitizer()


def subprocess_runner(argv: list[str], env: dict[str, str], timeout_s: float, cwd: Optional[Path]) -> ToolRun:
    """Run ``argv`` with stdout and stderr merged; a timeout gives ``returncode=None``."""
    try:
        proc = subprocess.run(argv, env=env, cwd=cwd, timeout=timeout_s, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, errors="replace")
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return ToolRun(returncode=None, output=out)
    return ToolRun(returncode=proc.returncode, output=proc.stdout)


def check_sanitizer(spec: SanitizerGateSpec, command: Sequence[str], ctx: GateContext,
                    env: Optional[dict[str, str]] = None, *, sanitizer: Optional[str] = None,
                    require_marker: Optional[str] = None, runner: Runner = subprocess_runner) -> GateResult:
    """Run every ``spec.tools`` over ``command`` (the driver's argv), in ``ctx.repo_root``.

    The environment is ``os.environ`` updated by ``ctx.env`` then ``env``. Figures: ``TOOL errors``
    per tool (``<= spec.max_errors``) and ``worst_tool_errors`` (key). Details: per tool the
    command, exit status, error count, the first report lines and the log tail.
    """
    tool_path = sanitizer or find_compute_sanitizer()
    if tool_path is None:
        return GateResult(gate=spec.name, kind=spec.kind, outcome=Outcome.SKIPPED,
                          reason="compute-sanitizer is not on PATH", summary="skipped: compute-sanitizer not found")
    full_env = {**os.environ, **ctx.env, **(env or {})}
    figures: list[Figure] = []
    runs: dict[str, dict] = {}
    broken: list[str] = []
    found_errors: list[str] = []
    counts: list[Optional[int]] = []
    for i, tool in enumerate(spec.tools):
        ctx.progress(f"compute-sanitizer {tool}", i / len(spec.tools))
        argv = [tool_path, "--tool", tool, "--error-exitcode", str(ERROR_EXITCODE), *command]
        run = runner(argv, full_env, spec.timeout_s, ctx.repo_root)
        n = parse_error_summary(run.output)
        lines = error_lines(run.output)
        runs[tool] = {"command": argv, "returncode": run.returncode, "errors": n,
                      "race_warnings": parse_race_warnings(run.output), "first_errors": lines,
                      "log_tail": "\n".join(run.output.splitlines()[-40:])}
        if run.returncode is None:
            broken.append(f"{tool}: timed out after {spec.timeout_s:g} s")
            n = None
        elif n is None:
            broken.append(f"{tool}: no ERROR SUMMARY in the output (rc {run.returncode}); the run did not finish")
        elif n == 0 and run.returncode != 0:
            broken.append(f"{tool}: 0 errors but the driver exited {run.returncode}: it did not run to the end")
            n = None
        elif require_marker is not None and require_marker not in run.output:
            broken.append(f"{tool}: the driver never printed {require_marker!r}: it did not run to the end")
            n = None
        elif n > spec.max_errors:
            found_errors.append(f"{tool}: {n} errors" + (f" ({lines[0]})" if lines else ""))
        counts.append(n)
        figures.append(Figure(name=f"{tool} errors", value=n, op="<=", threshold=spec.max_errors))
    worst = None if any(c is None for c in counts) else max(counts)
    figures.insert(0, Figure(name="worst_tool_errors", value=worst, op="<=", threshold=spec.max_errors, key=True))
    details = {"runs": runs}
    if broken:
        return GateResult(gate=spec.name, kind=spec.kind, outcome=Outcome.ERROR, figures=figures,
                          summary="; ".join(broken + found_errors)[:1000], details=details)
    summary = "; ".join(found_errors) or f"{', '.join(spec.tools)}: {worst} errors"
    return verdict(spec.name, spec.kind, figures, summary, **details)
