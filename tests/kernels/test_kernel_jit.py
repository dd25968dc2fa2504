"""The JIT loader and the build CLI, on this machine's nvcc (no GPU needed)."""

from __future__ import annotations

import os
import shutil

import pytest

from kdtree.kernels import jit

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None and not os.path.exists("/usr/local/cuda/bin/nvcc"),
                                reason="nvcc is not installed")


def test_arch_names_normalise():
    assert jit.normalize_arch("90") == "sm_90"
    assert jit.normalize_arch("sm_120") == "sm_120"
    assert jit.normalize_arch("9.0") == "sm_90"
    with pytest.raises(ValueError, match="arch"):
        jit.normalize_arch("hopper")


def test_missing_nvcc_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("CUDA_HOME", "/nonexistent")
    monkeypatch.setattr(jit.Path, "exists", lambda self: False)
    with pytest.raises(jit.JitError, match="nvcc was not found"):
        jit.find_nvcc()


@needs_nvcc
def test_cache_key_moves_with_flags_and_archs(monkeypatch):
    nvcc = jit.find_nvcc()
    a = jit.build_key(["sm_90"], nvcc)
    assert a == jit.build_key(["sm_90"], nvcc)
    assert a != jit.build_key(["sm_120"], nvcc)
    monkeypatch.setenv("KDTREE_NVCC_FLAGS", "-DKD_BREAK=1")
    assert a != jit.build_key(["sm_90"], nvcc)


@needs_nvcc
def test_extension_builds_into_the_cache_and_declares_its_shared_memory(tmp_path, monkeypatch):
    monkeypatch.setenv("KDTREE_CACHE_DIR", str(tmp_path))
    ext = jit.load_extension(["sm_90"])
    declared = jit.dynamic_smem_bytes()
    for variant, name in jit.VARIANT_KERNELS.items():
        assert ext.shared_bytes(variant) == declared[name]
        assert declared[name] <= 101376
    so = jit.build_extension(["sm_90"])
    assert so.parent.parent == tmp_path and (so.parent / "command.txt").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no half-built folder left


@needs_nvcc
def test_build_cli_prints_the_resource_report(capsys):
    from kdtree.kernels.build import main

    assert main(["--arch", "sm_120", "--sass"]) == 0
    out = capsys.readouterr().out
    assert "== sm_120: ok" in out and "0 bytes spill stores" in out
    assert "'HGMMA': 0" in out or "cuobjdump not found" in out
