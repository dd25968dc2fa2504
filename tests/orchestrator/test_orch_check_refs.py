"""CHECKS given as "module:function" strings: found at load without importing the module,
imported when the gate runs; a module that is not there is refused at load naming the string,
a function that is not there is that gate's error naming the string."""

from __future__ import annotations

import json
import sys

import pytest

from kdtree.orchestrator.errors import PlanLoadError
from kdtree.orchestrator.plan import CheckRef, load_phase, resolve_check

CHECKS_MODULE = '''
from pathlib import Path

(Path(__file__).parent / "checks-imported.tmp").write_text("yes")  # proves when it was imported

from .p1 import check_exact, check_speed  # noqa: E402
'''


def _string_checks(project, speed: str, exact: str) -> None:
    project.write(f"{project.pkg}/p1_checks.py", CHECKS_MODULE)
    path = project.root / project.pkg / "p1.py"
    text = path.read_text().replace('CHECKS = {"speed": check_speed, "exact": check_exact, }',
                                    f'CHECKS = {{"speed": {speed!r}, "exact": {exact!r}}}')
    assert text != path.read_text()
    path.write_text(text)
    project.commit_all("string checks")


def _imported(project) -> bool:
    return (project.root / project.pkg / "checks-imported.tmp").exists()


def test_string_checks_are_imported_when_a_gate_runs_not_at_load(project):
    _string_checks(project, f"{project.pkg}.p1_checks:check_speed", ".p1_checks:check_exact")
    project.cli("status")
    project.cli("plan", "--check", expect=None)
    assert not _imported(project)
    project.cli("run", "p1")
    assert _imported(project)
    record = json.loads(project.records("p1")[-1].read_text())
    assert [g["outcome"] for g in record["results"]] == ["passed", "passed"]


def test_a_check_module_that_does_not_exist_is_refused_at_load_naming_the_string(project):
    _string_checks(project, f"{project.pkg}.nowhere:check_speed", ".p1_checks:check_exact")
    res = project.cli("status", expect=2)
    assert f"CHECKS['speed']: check '{project.pkg}.nowhere:check_speed'" in res.stderr
    assert f"there is no module {project.pkg}.nowhere" in res.stderr
    project.cli("run", "p1", expect=2)
    assert project.records("p1") == []


def test_a_check_string_without_a_function_is_refused_at_load(project):
    _string_checks(project, f"{project.pkg}.p1_checks.check_speed", ".p1_checks:check_exact")
    res = project.cli("status", expect=2)
    assert "is not \"module:function\"" in res.stderr and f"{project.pkg}.p1_checks.check_speed" in res.stderr


def test_a_function_the_module_lacks_is_the_gates_error_naming_the_string(project):
    _string_checks(project, ".p1_checks:check_sped", ".p1_checks:check_exact")
    project.cli("status")
    project.cli("run", "p1", expect=1)
    record = json.loads(project.records("p1")[-1].read_text())
    speed = next(g for g in record["results"] if g["gate"] == "speed")
    assert speed["outcome"] == "error"
    assert f"check '.p1_checks:check_sped': {project.pkg}.p1_checks has no check_sped" in json.dumps(speed)


def test_check_refs_resolve_absolute_and_relative_names():
    ref = CheckRef(".plan:load_phase", "kdtree.orchestrator")
    assert ref.module == "kdtree.orchestrator.plan" and ref.resolve() is load_phase
    assert resolve_check("kdtree.orchestrator.plan:resolve_check") is resolve_check
    assert resolve_check(load_phase) is load_phase
    with pytest.raises(LookupError, match="'kdtree.orchestrator.plan:PlanLoadError.nope'"):
        CheckRef("kdtree.orchestrator.plan:PlanLoadError.nope").resolve()
    for bad in ("kdtree.orchestrator.plan", ":load_phase", "kdtree.orchestrator.plan:", "m:not-a-name"):
        with pytest.raises(ValueError, match="is not \"module:function\""):
            CheckRef(bad)


def test_load_phase_never_imports_a_check_module(tmp_path, monkeypatch):
    pkg = tmp_path / "lazy_phase_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from kdtree.gates.spec import MetricGateSpec, PhaseSpec, Threshold\n"
        "SPEC = PhaseSpec(id='lazy', title='lazy', objective='o', inputs=['x'], gates=[MetricGateSpec(\n"
        "    name='g', thresholds=[Threshold(figure='f', op='>=', value=1)])])\n"
        "CHECKS = {'g': '.heavy:check'}\n")
    (pkg / "heavy.py").write_text("raise RuntimeError('imported at load')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    phase = load_phase("lazy_phase_pkg")
    assert "lazy_phase_pkg.heavy" not in sys.modules
    with pytest.raises(RuntimeError, match="imported at load"):
        phase.checks["g"](None, None)
    (pkg / "__init__.py").write_text((pkg / "__init__.py").read_text().replace(".heavy:check", ".gone:check"))
    del sys.modules["lazy_phase_pkg"]
    with pytest.raises(PlanLoadError, match=r"CHECKS\['g'\]: check '.gone:check': there is no module lazy_phase_pkg.gone"):
        load_phase("lazy_phase_pkg")
