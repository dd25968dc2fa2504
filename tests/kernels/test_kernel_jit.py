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


def _record(kernel: str, variant: int, threads: int, nbytes: int) -> bytes:
    return jit._SMEM_RECORD.pack(jit.SMEM_RECORD_TAG, variant, threads, nbytes, kernel.encode())


def test_smem_records_are_read_from_the_binary_in_order():
    blob = b"\x7fELF junk" + _record("_ZN6kdtree1aE", 1, 256, 90000) + b"\0" * 13 + _record("_ZN6kdtree1bE", 0, 128, 0)
    assert jit.smem_records(blob) == [jit.SmemRecord("_ZN6kdtree1aE", 1, 256, 90000),
                                      jit.SmemRecord("_ZN6kdtree1bE", 0, 128, 0)]
    with pytest.raises(jit.JitError, match="holds no kdtree_smem_records"):
        jit.smem_records(b"\x7fELF nothing here")


@needs_nvcc
def test_compiled_object_names_every_kernel_ptxas_compiled_with_its_launch_smem():
    from kdtree.gates.build import parse_ptxas
    from kdtree.kernels.launch_plan import VARIANTS

    build = jit.compile_arch("sm_120", sass=False)
    assert build.returncode == 0, build.ptxas_log[-2000:]
    entries = {k.function for k in parse_ptxas(build.ptxas_log) if k.entry}
    assert {r.kernel for r in build.smem_records} == entries  # one to one: none missing, none unknown
    by_variant = {r.variant: r for r in build.smem_records if r.variant}
    assert sorted(by_variant) == sorted(VARIANTS.values())
    for r in by_variant.values():
        assert 80000 < r.dynamic_smem_bytes <= 101376 and r.threads in (256, 288)
    # the base kernel's layout: two 32-key stages of padded 576-wide rows, partial scores, P, stats
    assert by_variant[VARIANTS["base16"]].dynamic_smem_bytes == 2 * 32 * 584 * 2 + 4 * 16 * 40 * 4 + 16 * 40 * 2 + 3 * 16 * 4


@needs_nvcc
def test_records_follow_experiment_flags(monkeypatch):
    monkeypatch.setenv("KDTREE_NVCC_FLAGS", "-DWS_BN=16 -DWS_STAGES=4")
    from kdtree.kernels.launch_plan import VARIANTS

    build = jit.compile_arch("sm_90", sass=False)
    ws = next(r for r in build.smem_records if r.variant == VARIANTS["ws"])
    assert ws.dynamic_smem_bytes == 4 * 16 * 584 * 2 + 2 * (4 * 16 * 24 * 4 + 16 * 24 * 2 + 3 * 16 * 4) + 2 * 4 * 8


@pytest.mark.gpu
def test_extension_builds_into_the_cache_and_reports_the_records_shared_memory(tmp_path, monkeypatch):
    monkeypatch.setenv("KDTREE_CACHE_DIR", str(tmp_path))
    ext = jit.load_extension(["sm_90"])
    so = jit.build_extension(["sm_90"])
    records = jit.smem_records(so.read_bytes())
    for r in records:
        if r.variant:
            assert ext.shared_bytes(r.variant) == r.dynamic_smem_bytes <= 101376
    assert ext.shared_bytes(4) == -1  # g64 is gone
    assert so.parent.parent == tmp_path and (so.parent / "command.txt").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no half-built folder left


@needs_nvcc
def test_build_cli_prints_the_resource_report(capsys):
    from kdtree.kernels.build import main

    assert main(["--arch", "sm_120", "--sass"]) == 0
    out = capsys.readouterr().out
    assert "== sm_120: ok" in out and "0 bytes spill stores" in out
    assert "'HGMMA': 0" in out or "cuobjdump not found" in out
    assert "dynamic shared memory _ZN6kdtree25tree_verify_mla_ws_kernelENS_16TreeVerifyParamsE:" in out
