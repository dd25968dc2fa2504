"""Sanitizer gate on sample logs: errors fail, a missing summary or a dead driver is an error.

The logs under data/sanitizer are real compute-sanitizer runs of data/sanitizer/planted.cu on the
H200 (see data/sanitizer/README.md), except crashed_no_summary.log.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from kdtree.gates.base import GateContext, Outcome
from kdtree.gates.sanitizer import (
    ERROR_EXITCODE, ToolRun, check_sanitizer, error_lines, parse_error_summary,
)
from kdtree.gates.spec import SanitizerGateSpec

LOGS = Path(__file__).parent / "data" / "sanitizer"
SPEC = SanitizerGateSpec(name="toy-sanitizer", tools=["memcheck", "racecheck"], timeout_s=30)


def log(name: str) -> str:
    return (LOGS / name).read_text()


def fake_runner(outputs: dict[str, tuple[int | None, str]], seen: list | None = None):
    def runner(argv, env, timeout_s, cwd):
        tool = argv[argv.index("--tool") + 1]
        if seen is not None:
            seen.append((argv, timeout_s, cwd, env))
        rc, name = outputs[tool]
        return ToolRun(returncode=rc, output=log(name))

    return runner


def fig(result, name):
    return next(f for f in result.figures if f.name == name)


def run(outputs, **kw):
    return check_sanitizer(SPEC, ["python", "driver.py"], GateContext(), sanitizer="compute-sanitizer",
                           runner=fake_runner(outputs), **kw)


def test_parse_summaries():
    assert parse_error_summary(log("memcheck_clean.log")) == 0
    assert parse_error_summary(log("memcheck_oob.log")) == 66
    assert parse_error_summary(log("racecheck_hazard.log")) == 1
    assert parse_error_summary(log("racecheck_clean.log")) == 0
    assert parse_error_summary(log("crashed_no_summary.log")) is None
    assert parse_error_summary("========= ERROR SUMMARY: 1 error") == 1


def test_error_lines_skip_backtraces():
    lines = error_lines(log("memcheck_oob.log"))
    assert lines[0] == "Invalid __global__ write of size 4 bytes"
    assert not any(line.startswith(("at ", "by ", "Host Frame")) for line in lines)


def test_clean_runs_pass():
    r = run({"memcheck": (0, "memcheck_clean.log"), "racecheck": (0, "racecheck_clean.log")})
    assert r.outcome is Outcome.PASSED, r.summary
    assert fig(r, "memcheck errors").value == 0 and fig(r, "worst_tool_errors").key


def test_errors_fail_with_the_first_report_line():
    r = run({"memcheck": (ERROR_EXITCODE, "memcheck_oob.log"), "racecheck": (0, "racecheck_clean.log")})
    assert r.outcome is Outcome.FAILED
    assert fig(r, "memcheck errors").value == 66 and fig(r, "racecheck errors").value == 0
    assert "memcheck: 66 errors" in r.summary and "Invalid __global__ write" in r.summary


def test_racecheck_hazards_fail():
    r = run({"memcheck": (0, "memcheck_clean.log"), "racecheck": (ERROR_EXITCODE, "racecheck_hazard.log")})
    assert r.outcome is Outcome.FAILED and fig(r, "racecheck errors").value == 1


def test_missing_summary_is_an_error_not_a_pass():
    r = run({"memcheck": (1, "crashed_no_summary.log"), "racecheck": (0, "racecheck_clean.log")})
    assert r.outcome is Outcome.ERROR
    assert "no ERROR SUMMARY" in r.summary and fig(r, "worst_tool_errors").value is None


def test_zero_errors_but_a_failing_driver_is_an_error():
    r = run({"memcheck": (3, "memcheck_clean.log"), "racecheck": (0, "racecheck_clean.log")})
    assert r.outcome is Outcome.ERROR and "exited 3" in r.summary


def test_timeout_is_an_error():
    r = run({"memcheck": (None, "memcheck_clean.log"), "racecheck": (0, "racecheck_clean.log")})
    assert r.outcome is Outcome.ERROR and "timed out" in r.summary


def test_required_marker():
    outputs = {"memcheck": (0, "memcheck_clean.log"), "racecheck": (0, "racecheck_clean.log")}
    assert run(outputs, require_marker="DRIVER OK").outcome is Outcome.PASSED
    r = run(outputs, require_marker="ALL 40 CASES RAN")
    assert r.outcome is Outcome.ERROR and "never printed" in r.summary


def test_max_errors_from_the_spec():
    spec = SPEC.model_copy(update={"max_errors": 66, "tools": ["memcheck"]})
    r = check_sanitizer(spec, ["drv"], GateContext(), sanitizer="cs",
                        runner=fake_runner({"memcheck": (ERROR_EXITCODE, "memcheck_oob.log")}))
    assert r.outcome is Outcome.PASSED


def test_command_environment_and_timeout_reach_the_runner(tmp_path):
    seen = []
    ctx = GateContext(repo_root=tmp_path, env={"A": "1"})
    check_sanitizer(SPEC, ["python", "driver.py", "--small"], ctx, env={"B": "2"}, sanitizer="/opt/cs",
                    runner=fake_runner({"memcheck": (0, "memcheck_clean.log"),
                                        "racecheck": (0, "racecheck_clean.log")}, seen))
    argv, timeout_s, cwd, env = seen[0]
    assert argv == ["/opt/cs", "--tool", "memcheck", "--error-exitcode", str(ERROR_EXITCODE),
                    "python", "driver.py", "--small"]
    assert timeout_s == 30 and cwd == tmp_path and env["A"] == "1" and env["B"] == "2"
    assert [s[0][2] for s in seen] == ["memcheck", "racecheck"]


@pytest.mark.skipif(sys.platform == "win32", reason="uses a shell script")
def test_real_subprocess_with_a_stand_in_sanitizer(tmp_path):
    script = tmp_path / "compute-sanitizer"
    script.write_text(f"""#!/bin/sh
tool="$2"
if [ "$tool" = memcheck ]; then cat {LOGS / 'memcheck_oob.log'}; exit {ERROR_EXITCODE}; fi
cat {LOGS / 'racecheck_clean.log'}
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    r = check_sanitizer(SPEC, ["true"], GateContext(repo_root=tmp_path), sanitizer=str(script))
    assert r.outcome is Outcome.FAILED and fig(r, "memcheck errors").value == 66
    assert r.details["runs"]["memcheck"]["returncode"] == ERROR_EXITCODE


def test_no_sanitizer_is_skipped(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("CUDA_HOME", "/nonexistent")
    import kdtree.gates.sanitizer as san

    monkeypatch.setattr(san, "find_compute_sanitizer", lambda: None)
    r = check_sanitizer(SPEC, ["drv"], GateContext())
    assert r.outcome is Outcome.SKIPPED and "compute-sanitizer" in r.reason
    assert os.environ["PATH"] == "/nonexistent"


# --- GPU: the real tool over a driver with planted faults ------------------------------------

@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    import shutil
    import subprocess

    from kdtree.gates.sanitizer import find_compute_sanitizer

    if shutil.which("nvcc") is None or find_compute_sanitizer() is None:
        pytest.skip("needs nvcc and compute-sanitizer")
    exe = tmp_path_factory.mktemp("planted") / "planted"
    subprocess.run(["nvcc", "-o", str(exe), str(LOGS / "planted.cu")], check=True)
    return str(exe)


@pytest.mark.gpu
def test_gpu_clean_driver_passes(planted):
    r = check_sanitizer(SPEC, [planted, "clean"], GateContext(), require_marker="DRIVER OK")
    assert r.outcome is Outcome.PASSED, r.summary


@pytest.mark.gpu
def test_gpu_planted_out_of_bounds_write_fails_memcheck(planted):
    spec = SPEC.model_copy(update={"tools": ["memcheck"]})
    r = check_sanitizer(spec, [planted, "oob"], GateContext(), require_marker="DRIVER OK")
    assert r.outcome is Outcome.FAILED and fig(r, "memcheck errors").value > 0
    assert "Invalid __global__ write" in r.summary


@pytest.mark.gpu
def test_gpu_planted_race_fails_racecheck(planted):
    spec = SPEC.model_copy(update={"tools": ["racecheck"]})
    r = check_sanitizer(spec, [planted, "race"], GateContext(), require_marker="DRIVER OK")
    assert r.outcome is Outcome.FAILED and fig(r, "racecheck errors").value > 0
