"""The README's commands on the CPU-only install (no torch, numpy, triton, pybind11, matplotlib):
each works where it needs none of them, or ends in one line naming the extra to install; none ends
in a traceback. The missing packages are stood in by modules that raise ModuleNotFoundError, first
on the path of a fresh process (``tests/test_install.py`` installs a real wheel without torch)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kdtree import cuda_toolkit, extras

MISSING = ("torch", "numpy", "triton", "pybind11", "matplotlib", "transformers")


@pytest.fixture(scope="module")
def without_torch(tmp_path_factory):
    root = tmp_path_factory.mktemp("missing")
    for name in MISSING:
        (root / name).mkdir()
        (root / name / "__init__.py").write_text(f"raise ModuleNotFoundError(\"No module named '{name}'\", name={name!r})\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_CUDA_ARCH_LIST",)}
    env.update(PYTHONPATH=str(root), KDTREE_CUDA_ARCHS="9.0;12.0", KDTREE_CACHE_DIR=str(root / "cache"))

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=root, timeout=300)

    return run


def test_kernels_info_works_without_torch(without_torch):
    done = without_torch("-m", "kdtree.kernels.info")
    assert done.returncode == 0, done.stderr
    assert "archs: sm_90a, sm_120 (from KDTREE_CUDA_ARCHS)" in done.stdout
    assert "GPUs: none visible (torch is not installed)" in done.stdout
    assert "Traceback" not in done.stderr


def test_a_bad_arch_is_one_line_without_torch(without_torch):
    done = without_torch("-m", "kdtree.kernels.build", "--arch", "sm_75")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "Error: Invalid value for '--arch': sm_75: the kernel needs sm_90 or newer (its KV loads use cp.async.bulk and mbarrier, which sm_80-sm_89 lack)"]


def test_the_gpu_less_pre_build_without_pybind11_says_what_to_install(without_torch):
    if cuda_toolkit.find_nvcc() is None:
        pytest.skip("nvcc is not installed")
    done = without_torch("-m", "kdtree.kernels.build", "--extension")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == ("Error: pybind11 is not installed (pip install pybind11): "
                                                    "the bindings need its headers")


@pytest.mark.parametrize("argv", [["-m", "kdtree.engine", "generate", "--seed", "0"],
                                  ["-m", "kdtree.tools.bench", "--quick"]])
def test_a_program_that_needs_torch_says_which_extra_in_one_line(without_torch, argv):
    done = without_torch(*argv)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [f"python -m {argv[1]}: {extras.message('torch')}"]
    assert "'gpu' extra" in done.stderr


@pytest.mark.parametrize("argv", [["-m", "kdtree.tools.roofline"], ["-m", "kdtree.tools"]])
def test_programs_that_need_no_torch_run(without_torch, argv):
    done = without_torch(*argv)
    assert done.returncode == 0, done.stderr
    assert done.stdout and "Traceback" not in done.stderr


def test_the_op_says_which_extra_when_torch_is_missing(without_torch):
    done = without_torch("-c", "import kdtree.kernels as k; k.pack_tree_masks([[-1]])")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith(
        "ModuleNotFoundError: kdtree.kernels.pack_tree_masks needs torch, which is not installed here: install the 'gpu' extra")


def test_the_tools_listing_and_the_report_library(without_torch):
    listed = without_torch("-m", "kdtree.tools")
    names = [line.split()[0] for line in listed.stdout.splitlines()[1:]]
    assert {"bench", "roofline", "devcheck", "peers"} <= set(names) and "bench_report" not in names
    report = without_torch("-m", "kdtree.tools.bench_report", "--help")
    assert report.returncode == 1 and "not a program" in report.stderr and "python -m kdtree.tools.bench" in report.stderr


def test_every_extra_named_exists_in_pyproject():
    tomllib = pytest.importorskip("tomllib")
    extras_declared = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert set(extras.EXTRA_OF.values()) <= set(extras_declared)
