"""The README's install section, run as written: build the sdist and wheel with ``python -m build``
from a copy of the checkout, install the wheel into a fresh venv without torch (the CPU-only
``orchestrate`` user), and use it. Plus offline checks of what the wheel and the constraint files
hold. The build-and-install test needs the package index (or pip's local wheels) and minutes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import kdtree

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def _requirements(*extras: str) -> list[Requirement]:
    project = PYPROJECT["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        reqs += [Requirement(r) for r in project["optional-dependencies"][extra]]
    return reqs


@pytest.mark.parametrize("constraints,extras", [("test.txt", ("test",)), ("sglang.txt", ("test", "sglang"))])
def test_each_constraint_file_satisfies_the_extras_it_is_for(constraints, extras):
    pins = _pins(ROOT / "constraints" / constraints)
    env = {"platform_system": "Linux", "python_version": "3.11", "extra": ""}
    for req in _requirements(*extras):
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        if name in pins:
            assert req.specifier.contains(pins[name], prereleases=True), \
                f"constraints/{constraints} pins {name}=={pins[name]}, but pyproject asks {req}"
        else:
            assert name in ("torch", "triton"), f"constraints/{constraints} does not pin {name}"


def test_the_sglang_set_holds_what_sglang_0_5_23_requires():
    # sglang 0.5.23's own pins (its wheel's metadata): the test set's kernels 0.19 is what made
    # `pip install ".[test,sglang]" -c constraints/test.txt` unresolvable
    pins = _pins(ROOT / "constraints" / "sglang.txt")
    assert pins["sglang"] == "0.5.23" and pins["torch"] == "2.14.1" and pins["transformers"] == "5.19.0"
    assert pins["kernels"].startswith("0.14.") and pins["tokenizers"] == "0.23.2"
    assert int(pins["python-dateutil"].split(".")[0]) < 3


def test_the_version_has_one_source():
    assert PYPROJECT["project"]["dynamic"] == ["version"] and "version" not in PYPROJECT["project"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "kdtree.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", kdtree.__version__)


def test_license_is_an_spdx_expression_with_its_text():
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    assert PYPROJECT["project"]["license-files"] == ["LICENSE"]
    assert "Apache License\n                           Version 2.0" in (ROOT / "LICENSE").read_text()
    assert any(r.startswith("setuptools>=77") for r in PYPROJECT["build-system"]["requires"])  # PEP 639


def _package_folders() -> dict[str, Path]:
    """Every Python package under the mapped roots (a folder with an ``__init__.py``)."""
    mapped = PYPROJECT["tool"]["setuptools"]["package-dir"]
    roots = {name: ROOT / folder for name, folder in mapped.items() if "." not in name.removeprefix("kdtree.")}
    found = {}
    for name, folder in roots.items():
        for sub in [folder, *sorted(p for p in folder.rglob("*") if p.is_dir())]:
            rel = sub.relative_to(folder).parts
            if "__pycache__" in rel or any(part.startswith(".") for part in rel):
                continue
            if (sub / "__init__.py").is_file():
                found[".".join((name, *rel))] = sub
    return found


def test_every_package_folder_is_declared_so_the_wheel_ships_it():
    declared = set(PYPROJECT["tool"]["setuptools"]["packages"])
    missing = sorted(set(_package_folders()) - declared)
    assert not missing, f"add these to [tool.setuptools] packages in pyproject.toml: {missing}"


def test_the_constraint_files_are_a_package_the_wheel_route_can_name():
    from kdtree.constraints import path

    assert path("sglang").read_text() == (ROOT / "constraints" / "sglang.txt").read_text()
    with pytest.raises(ValueError, match="expected one of sglang, test"):
        path("gpu")


def _run(argv, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, **kwargs)
    assert done.returncode == 0, f"{argv} -> {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.slow
def test_the_wheel_installs_into_a_fresh_venv_and_orchestrate_works_without_torch(tmp_path):
    # a copy of the checkout as `git clone` would give it (tracked and untracked-but-not-ignored files)
    listed = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT).stdout
    clone = tmp_path / "clone"
    for rel in filter(None, listed.split("\0")):
        if (ROOT / rel).is_file():
            (clone / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, clone / rel)
    _run(["git", "init", "-q"], cwd=clone)
    _run(["git", "add", "-A"], cwd=clone)
    _run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "clone"], cwd=clone)

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    bin_dir = venv / "bin"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"

    # README: pip install build && python -m build
    _run([str(bin_dir / "pip"), "install", "-q", "build"], env=env)
    built = _run([str(bin_dir / "python"), "-m", "build"], cwd=clone, env=env)
    assert "would be ignored" not in built.stdout + built.stderr
    wheels = list((clone / "dist").glob("kdtree_engine-*.whl"))
    assert [w.name for w in wheels] == [f"kdtree_engine-{kdtree.__version__}-py3-none-any.whl"]
    names = zipfile.ZipFile(wheels[0]).namelist()
    assert {"kdtree/py.typed", "kdtree/kernels/py.typed", "kdtree/kernels/csrc/tree_verify_mla.cu",
            "kdtree/kernels/csrc/bindings.cpp", "kdtree/cuda_toolkit.py", "kdtree/kernels/jit/extension.py",
            "kdtree/constraints/sglang.txt", "kdtree/envvars.py"} <= set(names)
    sdists = list((clone / "dist").glob("kdtree_engine-*.tar.gz"))
    with tarfile.open(sdists[0]) as sdist:
        held = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    assert {"constraints/sglang.txt", "docs/sglang.md", "README.md", "LICENSE"} <= held
    assert not [n for n in held if n.startswith("tests/")], "the sdist carries tests"
    assert any(n.startswith("kdtree/orchestrator/templates/") and n.endswith(".j2") for n in names)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not [n for n in names if n.startswith("tests/") or "/tests/" in n]

    # README: pip install dist/kdtree_engine-<version>-py3-none-any.whl, then orchestrate
    _run([str(bin_dir / "pip"), "install", "-q", str(wheels[0])], env=env)
    no_torch = subprocess.run([str(bin_dir / "python"), "-c", "import torch"], capture_output=True, env=env)
    assert no_torch.returncode != 0, "the CPU-only install pulled torch in"
    version = _run([str(bin_dir / "python"), "-c",
                    "import importlib.metadata as m, kdtree; print(kdtree.__version__, m.version('kdtree-engine'))"],
                   cwd=tmp_path, env=env).stdout.split()
    assert version == [kdtree.__version__, kdtree.__version__]
    shown = _run([str(bin_dir / "orchestrate"), "--version"], cwd=tmp_path, env=env).stdout
    assert f"(kdtree-engine) {kdtree.__version__}" in shown
    status = _run([str(bin_dir / "orchestrate"), "status"], cwd=clone, env=env)
    assert "plan 0002-sm120-verify-kernel-defrag" in status.stdout and "phase1" in status.stdout
    assert "Traceback" not in status.stderr
    assert len(status.stderr.strip().splitlines()) <= 1, "a wheel install in a clone: one line of warning at most"
    shipped = _run([str(bin_dir / "python"), "-m", "kdtree.constraints", "sglang"], cwd=tmp_path, env=env).stdout
    assert Path(shipped.strip()).read_text() == (ROOT / "constraints" / "sglang.txt").read_text()

    # README, CPU-only from a clone: pip install -e ., then orchestrate status says no warning
    _run([str(bin_dir / "pip"), "install", "-q", "-e", str(clone)], env=env)
    status = _run([str(bin_dir / "orchestrate"), "status"], cwd=clone, env=env)
    assert status.stderr.strip() == "" and "phase1" in status.stdout
