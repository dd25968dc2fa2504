"""A weaker run never replaces the evidence: the deciding run, the latest run per device."""

from __future__ import annotations

import os
import stat

import pytest

from kdtree.orchestrator import device as device_facts
from kdtree.orchestrator.specs import DeviceInfo
from orch_project import git, make_project

H200 = DeviceInfo(kind="cuda", name="NVIDIA H200", compute_capability="9.0", driver="580", host="gpu")
TOOL = "kdtree-test-gpu-tool"


@pytest.fixture
def gpu_project(tmp_path, monkeypatch):
    """p1 with a third gate that needs a tool only "the GPU machine" has on its PATH."""
    extra = (f'MetricGateSpec(name="gpu", requires=["exe:{TOOL}"], '
             'thresholds=[Threshold(figure="f", op=">=", value=1)]),')
    proj = make_project(tmp_path / "repo", extra_gate=extra, extra_checks='"gpu": check_speed')
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tool = bindir / TOOL
    tool.write_text("#!/bin/sh\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    proj.on_gpu = lambda: (monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}"),
                           monkeypatch.setattr(device_facts, "device_info", lambda d: H200))
    proj.on_cpu = monkeypatch.undo  # back to this machine's PATH and device facts
    yield proj
    proj.forget_modules()


def _gpu_failed_then_cpu_incomplete(proj):
    proj.on_gpu()
    proj.knobs(p1={"exact": "fail"})
    proj.cli("run", "p1", "--device", "cpu", expect=1)  # all 3 gates ran, one failed
    proj.on_cpu()
    proj.knobs(p1={"exact": "pass"})  # knobs are not inputs: same code
    proj.cli("run", "p1", "--device", "cpu", expect=3)  # the gpu gate skipped: incomplete
    gpu_run, cpu_run = (p.stem for p in proj.records("p1"))
    return gpu_run, cpu_run


def test_a_run_that_skipped_gates_does_not_override_one_that_ran_them(gpu_project):
    gpu_run, cpu_run = _gpu_failed_then_cpu_incomplete(gpu_project)
    p1 = gpu_project.phase("p1")
    assert p1["state"] == "failed"
    assert p1["last_run"]["run_id"] == gpu_run and p1["newest_full_run"]["run_id"] == cpu_run
    rows = {r["run_id"]: r for r in p1["latest_by_device"]}
    assert rows[gpu_run]["decides"] is True and rows[gpu_run]["device"] == "NVIDIA H200 (sm_90)"
    assert rows[cpu_run]["decides"] is False and rows[cpu_run]["skipped"] == 1
    text = gpu_project.cli("status").stdout
    assert "deciding run" in text and "NVIDIA H200 (sm_90)" in text.splitlines()[1]
    assert f"does not decide: it skipped 1 gate(s) that run {gpu_run} ran on the same inputs" in text
    plan = gpu_project.plan_path.read_text()
    assert "| p1 | alpha | **failed** | 2/3 |" in plan
    assert f"Deciding run `{gpu_run}`" in plan
    assert f"| NVIDIA H200 (sm_90) | `{gpu_run}` |" in plan and "| **yes** |" in plan
    assert f"| incomplete | 2/3 (1 skipped) |" in plan


def test_a_run_of_changed_code_decides_even_if_it_skipped_gates(gpu_project):
    _gpu_failed_then_cpu_incomplete(gpu_project)
    gpu_project.write("src/p1/code.py", "x = 2\n")
    gpu_project.cli("run", "p1", "--device", "cpu", expect=3)
    p1 = gpu_project.phase("p1")
    assert p1["state"] == "incomplete" and p1["last_run"]["run_id"] == gpu_project.records("p1")[-1].stem


def test_checkpoint_of_the_weaker_run_needs_allow_incomplete(gpu_project):
    gpu_run, cpu_run = _gpu_failed_then_cpu_incomplete(gpu_project)
    head = git(gpu_project.root, "rev-parse", "HEAD")
    res = gpu_project.cli("checkpoint", "--commit", expect=2)
    assert f"run {cpu_run} of p1 (cpu" in res.stderr and "skipped 1 gate(s)" in res.stderr
    assert f"run {gpu_run} (NVIDIA H200 (sm_90)) ran them all" in res.stderr
    assert "--allow-incomplete" in res.stderr
    assert git(gpu_project.root, "rev-parse", "HEAD") == head
    gpu_project.cli("checkpoint", "--commit", "--allow-incomplete")
    body = git(gpu_project.root, "log", "-1", "--format=%B")
    assert body.startswith("checkpoint: p1 alpha incomplete (2/3 gates passed)")
    assert f"the phase's state stays decided by run {gpu_run} (NVIDIA H200 (sm_90)): failed" in body


def test_a_complete_run_checkpoints_without_the_flag(gpu_project):
    gpu_project.on_gpu()
    gpu_project.cli("run", "p1", "--device", "cpu")
    gpu_project.cli("checkpoint", "--commit")
