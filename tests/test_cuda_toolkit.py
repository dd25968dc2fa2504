"""`kdtree.cuda_toolkit`: the toolkit found in CUDA_HOME / CUDA_PATH / PATH / /usr/local/cuda order,
on fake toolkits (small scripts standing in for nvcc and compute-sanitizer)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from kdtree import cuda_toolkit


def _tool(path: Path, release: str = "12.8") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
                    f"echo 'Cuda compilation tools, release {release}, V{release}.1'\n"
                    f"echo 'Build cuda_{release}.r{release}/compiler.1_0'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    monkeypatch.setattr(cuda_toolkit, "DEFAULT_HOME", tmp_path / "no-default")
    cuda_toolkit.nvcc_banner.cache_clear()
    return monkeypatch


def test_nothing_found_is_none_everywhere(clean_env, monkeypatch):
    monkeypatch.setattr(cuda_toolkit.importlib.util, "find_spec", lambda name: None)  # no triton copy either
    tk = cuda_toolkit.locate()
    assert tk == cuda_toolkit.Toolkit(home=None, nvcc=None, version=None, compute_sanitizer=None, cuobjdump=None)


def test_cuda_home_wins_over_path(clean_env, tmp_path):
    home = tmp_path / "cuda-12.8"
    _tool(home / "bin" / "nvcc", "12.8")
    other = _tool(tmp_path / "cuda-13.0" / "bin" / "nvcc", "13.0")
    clean_env.setenv("PATH", str(other.parent))
    clean_env.setenv("CUDA_HOME", str(home))
    assert cuda_toolkit.cuda_home() == home
    assert cuda_toolkit.find_nvcc() == str(home / "bin" / "nvcc")
    assert cuda_toolkit.nvcc_version() == "12.8"
    assert cuda_toolkit.nvcc_banner(cuda_toolkit.find_nvcc()) == "Build cuda_12.8.r12.8/compiler.1_0"


def test_cuda_path_is_read_when_cuda_home_is_unset(clean_env, tmp_path):
    home = tmp_path / "toolkit"
    _tool(home / "bin" / "nvcc")
    clean_env.setenv("CUDA_PATH", str(home))
    assert cuda_toolkit.find_nvcc() == str(home / "bin" / "nvcc")


def test_the_nvcc_on_path_names_the_toolkit(clean_env, tmp_path):
    home = tmp_path / "cuda-13.0"
    nvcc = _tool(home / "bin" / "nvcc", "13.0")
    (home / "nvvm").mkdir()
    _tool(home / "compute-sanitizer" / "compute-sanitizer")  # where some toolkits keep it
    clean_env.setenv("PATH", str(nvcc.parent))
    tk = cuda_toolkit.locate()
    assert tk.home == home and tk.nvcc == str(nvcc) and tk.version == "13.0"
    assert tk.compute_sanitizer == str(home / "compute-sanitizer" / "compute-sanitizer")


def test_a_cuda_home_without_the_tool_falls_back_to_path(clean_env, tmp_path):
    (tmp_path / "bare-home").mkdir()
    nvcc = _tool(tmp_path / "elsewhere" / "nvcc")
    clean_env.setenv("CUDA_HOME", str(tmp_path / "bare-home"))
    clean_env.setenv("PATH", str(nvcc.parent))
    assert cuda_toolkit.find_nvcc() == str(nvcc)


def test_an_nvcc_that_cannot_run_has_no_version(clean_env, tmp_path):
    broken = tmp_path / "bin" / "nvcc"
    broken.parent.mkdir()
    broken.write_text("#!/bin/sh\nexit 1\n")
    broken.chmod(0o755)
    assert cuda_toolkit.nvcc_version(str(broken)) is None
    assert cuda_toolkit.nvcc_banner(str(broken)) == ""


def test_a_wrapper_script_on_path_is_not_taken_for_the_toolkit(clean_env, tmp_path):
    wrapper = _tool(tmp_path / "usr-local" / "bin" / "nvcc")  # e.g. /usr/local/bin/nvcc: exec .../cuda-13.0/bin/nvcc
    real = tmp_path / "cuda"
    _tool(real / "bin" / "nvcc")
    (real / "include").mkdir()
    (real / "include" / "cuda.h").write_text("")
    clean_env.setenv("PATH", str(wrapper.parent))
    clean_env.setattr(cuda_toolkit, "DEFAULT_HOME", real)
    assert cuda_toolkit.cuda_home() == real
    assert cuda_toolkit.find_nvcc() == str(real / "bin" / "nvcc")
    clean_env.setattr(cuda_toolkit, "DEFAULT_HOME", tmp_path / "none")
    assert cuda_toolkit.cuda_home() is None and cuda_toolkit.find_nvcc() == str(wrapper)  # PATH still serves
