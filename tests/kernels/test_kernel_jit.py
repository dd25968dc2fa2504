"""The JIT loader and the build CLI, on this machine's nvcc (no GPU needed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from kdtree.kernels import jit
from kdtree.kernels.jit import report as jit_report

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None and not os.path.exists("/usr/local/cuda/bin/nvcc"),
                                reason="nvcc is not installed")


def test_arch_names_normalise():
    assert jit.normalize_arch("90") == "sm_90"
    assert jit.normalize_arch("sm_120") == "sm_120"
    assert jit.normalize_arch("9.0") == "sm_90"
    with pytest.raises(ValueError, match="arch"):
        jit.normalize_arch("hopper")


def test_missing_nvcc_is_a_clear_error(monkeypatch, tmp_path):
    from kdtree import cuda_toolkit

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nonexistent"))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(cuda_toolkit, "DEFAULT_HOME", tmp_path / "no-cuda")
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
    return jit_report._SMEM_RECORD.pack(jit.SMEM_RECORD_TAG, variant, threads, nbytes, kernel.encode())


def test_smem_records_are_read_from_the_binary_in_order():
    blob = b"\x7fELF junk" + _record("_ZN6kdtree1aE", 1, 256, 90000) + b"\0" * 13 + _record("_ZN6kdtree1bE", 0, 128, 0)
    assert jit.smem_records(blob) == [jit.SmemRecord("_ZN6kdtree1aE", 1, 256, 90000),
                                      jit.SmemRecord("_ZN6kdtree1bE", 0, 128, 0)]
    with pytest.raises(jit.JitError, match="holds no kdtree_smem_records"):
        jit.smem_records(b"\x7fELF nothing here")


@pytest.mark.slow
@needs_nvcc
def test_compiled_object_names_every_kernel_ptxas_compiled_with_its_launch_smem():
    from kdtree.gates.build import parse_ptxas
    from kdtree.kernels.launch_plan import VARIANTS

    build = jit.compile_arch("sm_120", sass=False)
    assert build.returncode == 0, build.ptxas_log[-2000:]
    entries = {k.function for k in parse_ptxas(build.ptxas_log) if k.entry}
    assert {r.kernel for r in build.smem_records} == entries  # one to one: none missing, none unknown
    by_variant = {r.variant: r for r in build.smem_records if r.variant}
    assert sorted(by_variant) == sorted(VARIANTS[v] for v in VARIANTS if v != "wgmma")  # wgmma: sm_90a only
    for r in by_variant.values():
        assert 80000 < r.dynamic_smem_bytes <= 101376 and r.threads in (256, 288)
    # the base kernel's layout: two 32-key stages of padded 576-wide rows, partial scores, P, stats
    assert by_variant[VARIANTS["base16"]].dynamic_smem_bytes == 2 * 32 * 584 * 2 + 4 * 16 * 40 * 4 + 16 * 40 * 2 + 3 * 16 * 4


@pytest.mark.slow
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
    so = jit.build_extension(["sm_90"])
    records = jit.smem_records(so.read_bytes())
    # loaded in a fresh process: one that already holds another build of the extension (the
    # device's sm_90a one, from earlier GPU tests) may bind the new module's symbols to the old one's
    script = ("import json; from kdtree.kernels import jit; ext = jit.load_extension(['sm_90']); "
              "print(json.dumps({v: ext.shared_bytes(v) for v in range(1, 6)}))")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, KDTREE_CACHE_DIR=str(tmp_path)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    shared = {int(k): v for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}
    for r in records:
        if r.variant:
            assert shared[r.variant] == r.dynamic_smem_bytes <= 101376
    assert shared[4] == -1  # an sm_90 build: the wgmma variant (4) exists in sm_90a builds only
    assert shared[5] == -1
    assert so.parent.parent == tmp_path and (so.parent / "command.txt").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no half-built folder left


@pytest.mark.slow
@needs_nvcc
def test_build_cli_prints_the_resource_report():
    from click.testing import CliRunner

    from kdtree.kernels.build import main

    result = CliRunner().invoke(main, ["--arch", "sm_120", "--sass"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "== sm_120: ok" in out and "0 bytes spill stores" in out
    assert "'HGMMA': 0" in out or "cuobjdump not found" in out
    assert "dynamic shared memory _ZN6kdtree25tree_verify_mla_ws_kernelENS_16TreeVerifyParamsE:" in out


# --- the sm_90a build (issue 17) ---------------------------------------------------------------

WGMMA_KERNEL = "_ZN6kdtree28tree_verify_mla_wgmma_kernelENS_16TreeVerifyParamsE"


def test_a_9_0_device_gets_the_sm_90a_build_and_only_it_the_wgmma_define():
    assert jit.arch_for_capability((9, 0)) == "sm_90a"
    assert jit.arch_for_capability((12, 0)) == "sm_120" and jit.arch_for_capability((8, 0)) == "sm_80"
    assert jit.arch_for_capability((10, 0)) == "sm_100"
    assert jit.normalize_arch("sm_90a") == "sm_90a" and jit.gencode("sm_90a") == ["-gencode=arch=compute_90a,code=sm_90a"]
    assert jit.arch_defines(["sm_90a"]) == ["-DKDTREE_SM90A=1"]
    assert jit.arch_defines(["sm_90"]) == jit.arch_defines(["sm_120"]) == jit.arch_defines(["sm_80", "sm_90"]) == []


@needs_nvcc
def test_cache_key_tells_sm_90a_from_sm_90():
    nvcc = jit.find_nvcc()
    assert jit.build_key(["sm_90a"], nvcc) != jit.build_key(["sm_90"], nvcc)


def _wgmma_instructions(sass: str) -> dict[str, int]:
    from kdtree.gates.build import sass_instructions

    counts: dict[str, int] = {}
    for _, function, _, opcode, _ in sass_instructions(sass):
        if opcode.startswith("HGMMA"):
            counts[function] = counts.get(function, 0) + 1
    return counts


@pytest.mark.slow
@needs_nvcc
def test_sm_90a_build_holds_the_wgmma_kernel_within_sm_90_limits():
    from kdtree.gates.build import parse_ptxas
    from kdtree.kernels.launch_plan import VARIANTS

    build = jit.compile_arch("sm_90a")
    assert build.returncode == 0, build.ptxas_log[-2000:]
    assert "-DKDTREE_SM90A=1" in build.command
    kernels = {k.function: k for k in parse_ptxas(build.ptxas_log) if k.entry}
    assert {r.kernel for r in build.smem_records} == set(kernels)
    record = next(r for r in build.smem_records if r.variant == VARIANTS["wgmma"])
    assert record.kernel == WGMMA_KERNEL and record.threads == 384
    assert record.dynamic_smem_bytes <= 232448  # sm_90's per-block opt-in maximum (227 KiB)
    k = kernels[WGMMA_KERNEL]
    assert k.spill_bytes == 0 and k.stack_bytes == 0, k
    assert "C7510" not in build.ptxas_log and "C7520" not in build.ptxas_log  # no serialised wgmma
    if build.sass:
        hgmma = _wgmma_instructions(build.sass)
        assert set(hgmma) == {WGMMA_KERNEL} and hgmma[WGMMA_KERNEL] >= 36 + 8, hgmma


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_90", "sm_120"])
def test_sm_90_and_sm_120_builds_have_no_wgmma_kernel_and_no_hgmma(arch):
    build = jit.compile_arch(arch)
    assert build.returncode == 0, build.ptxas_log[-2000:]
    assert "KDTREE_SM90A" not in " ".join(build.command)
    assert WGMMA_KERNEL not in build.ptxas_log
    assert all(r.variant != 4 for r in build.smem_records)
    if build.sass:
        assert _wgmma_instructions(build.sass) == {}


@pytest.mark.gpu
def test_the_extension_of_a_9_0_device_launches_the_wgmma_variant():
    import torch

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma variant runs on compute capability 9.0 only")
    from kdtree.kernels.cuda_op import device_state
    from kdtree.kernels.launch_plan import VARIANTS

    ext = device_state(torch.cuda.current_device()).ext
    so = jit.build_extension(["sm_90a"])
    wgmma = next(r for r in jit.smem_records(so.read_bytes()) if r.variant == VARIANTS["wgmma"])
    assert ext.shared_bytes(VARIANTS["wgmma"]) == wgmma.dynamic_smem_bytes > 101376
