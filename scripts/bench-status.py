#!/usr/bin/env python3
"""How long `orchestrate status` takes, as a user starts it: a fresh process each time.

Times ``python -m kdtree.orchestrator status`` (the console script runs the same code) N times
in each project and prints min / median / max wall seconds, and the CPU seconds the command and
the git processes it started used (user + system: what it costs on an idle machine, far less
disturbed than wall time by other work on a loaded one), beside an empty Python start
(``python -c pass``) for reference:

- ``repo``: this repository (or ``--repo FOLDER``), with its recorded runs;
- ``two-phase``: a fresh project in a temporary git repository: ``orchestrate init``, a second
  phase module beside the example, both phases run once and committed.

    .venv/bin/python scripts/bench-status.py            # 15 runs each
    .venv/bin/python scripts/bench-status.py -n 30 --importtime

``--importtime`` also prints the slowest imports of one ``status`` (``python -X importtime``).
The figures depend on the machine and its load; compare runs made on one machine at one time.
Not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _orchestrate(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kdtree.orchestrator", *args], cwd=cwd,
                          capture_output=True, text=True, check=check, env=_env())


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def two_phase_project(folder: Path) -> Path:
    """A fresh `orchestrate init` project with a second phase; both phases run once, committed."""
    _git(folder, "init", "-q", "-b", "main")
    for key, value in (("user.email", "bench@example.com"), ("user.name", "bench"), ("commit.gpgsign", "false")):
        _git(folder, "config", key, value)
    _orchestrate("init", "--id", "bench", cwd=folder)
    example = (folder / "phases" / "example.py").read_text(encoding="utf-8")
    (folder / "phases" / "second.py").write_text(example.replace('id="example"', 'id="second"'),
                                                 encoding="utf-8")
    pyproject = folder / "pyproject.toml"
    pyproject.write_text(pyproject.read_text(encoding="utf-8").replace(
        '"phases.example"]', '"phases.example", "phases.second"]'), encoding="utf-8")
    plan = folder / "plans" / "bench.md"
    plan.write_text(plan.read_text(encoding="utf-8")
                    + "\n<!-- orchestrate:begin results-second -->\n<!-- orchestrate:end results-second -->\n",
                    encoding="utf-8")
    (folder / ".gitignore").write_text("__pycache__/\n", encoding="utf-8")
    _git(folder, "add", "-A")
    _git(folder, "commit", "-q", "-m", "plan")
    for phase in ("example", "second"):
        done = _orchestrate("run", phase, cwd=folder, check=False)
        if done.returncode != 0:
            raise SystemExit(f"orchestrate run {phase} in the bench project exited {done.returncode}:\n"
                             f"{done.stdout}{done.stderr}")
    _git(folder, "add", "-A")
    _git(folder, "commit", "-q", "-m", "runs")
    return folder


def _env() -> dict[str, str]:
    """The environment a user's shell gives: bytecode caches are written and read."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def time_command(argv: list[str], cwd: Path, n: int) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of ``n`` runs of ``argv`` (after one warm-up run, which also writes
    the bytecode caches); a failure stops the bench."""
    first = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=_env())
    if first.returncode not in (0, 1, 3):
        raise SystemExit(f"{' '.join(argv)} in {cwd} exited {first.returncode}:\n{first.stderr}")
    wall, cpu = [], []
    for _ in range(n):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env())
        wall.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return wall, cpu


def report(label: str, times: tuple[list[float], list[float]]) -> None:
    wall, cpu = times
    print(f"{label:<28} wall min {min(wall):.3f} s  median {statistics.median(wall):.3f} s  "
          f"max {max(wall):.3f} s | cpu min {min(cpu):.3f} s  median {statistics.median(cpu):.3f} s  "
          f"(n={len(wall)})")


def slowest_imports(cwd: Path, top: int = 15) -> None:
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "kdtree.orchestrator", "status"],
                          cwd=cwd, capture_output=True, text=True, env=_env())
    rows = []
    for line in done.stderr.splitlines():
        parts = line.split("|")
        if line.startswith("import time:") and len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[1]), parts[2].rstrip()))
    total = sum(us for us, name in rows if not name[1:].startswith(" "))
    print(f"  imports in {cwd}: {total / 1e6:.3f} s at top level; slowest (cumulative):")
    for us, name in sorted(rows, reverse=True)[:top]:
        print(f"    {us / 1e3:8.1f} ms  {name.strip()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=15, help="timed runs per project (default 15)")
    parser.add_argument("--repo", type=Path, default=ROOT, help="the repository to time (default: this one)")
    parser.add_argument("--importtime", action="store_true", help="also list the slowest imports")
    args = parser.parse_args()
    if args.n < 1:
        parser.error("-n must be at least 1")
    status = [sys.executable, "-m", "kdtree.orchestrator", "status"]
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs; "
          f"{sys.executable}")
    report("python -c pass", time_command([sys.executable, "-c", "pass"], ROOT, args.n))
    report(f"status: {args.repo.name}", time_command(status, args.repo, args.n))
    if args.importtime:
        slowest_imports(args.repo)
    with tempfile.TemporaryDirectory(prefix="bench-status-") as tmp:
        project = two_phase_project(Path(tmp))
        report("status: two-phase project", time_command(status, project, args.n))
        if args.importtime:
            slowest_imports(project)


if __name__ == "__main__":
    main()
