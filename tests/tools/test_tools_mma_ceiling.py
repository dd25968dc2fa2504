"""The mma.sync ceiling microbenchmark: build without a GPU, report format, and a GPU run."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kdtree.kernels import jit
from kdtree.bench import mma_ceiling as ceiling
from kdtree.tools import mma_ceiling

ROWS = [
    {"device": "NVIDIA H200", "sm": 90, "sms": 132},
    {"warps_per_sm": 8, "ldsm_bytes_per_mma": 0, "mma": True, "ms": 1.3, "sm_clock_ghz": 1.8, "tflops": 527.5,
     "mma_per_clk_per_sm": 0.543, "ldsm_bytes_per_clk_per_sm": 0.0},
    {"warps_per_sm": 8, "ldsm_bytes_per_mma": -1, "mma": False, "ms": 1.0, "sm_clock_ghz": 1.98, "tflops": 0.0,
     "mma_per_clk_per_sm": 0.0, "ldsm_bytes_per_clk_per_sm": 127.9},
    {"warps_per_sm": 16, "ldsm_bytes_per_mma": 256, "mma": True, "ms": 1.5, "sm_clock_ghz": 1.79, "tflops": 466.8,
     "mma_per_clk_per_sm": 0.481, "ldsm_bytes_per_clk_per_sm": 123.2},
]


def test_table_names_the_device_and_each_measurement():
    table = mma_ceiling.format_table(ROWS).splitlines()
    assert table[0] == "NVIDIA H200 (sm_90, 132 SMs)"
    assert "527.5" in table[2] and "ldmatrix only" in table[3] and "127.9" in table[3]
    assert table[4].split("|")[1].strip() == "256" and "466.8" in table[4]


def test_no_gpu_is_a_clear_error(monkeypatch):
    def no_smi(*args, **kwargs):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(ceiling.subprocess, "run", no_smi)
    with pytest.raises(jit.JitError, match="no CUDA GPU is visible"):
        ceiling.device_arch()


@pytest.mark.parametrize("arch", ["sm_90", "sm_120"])
def test_microbenchmark_builds_for_both_targets(tmp_path, arch):
    try:
        jit.find_nvcc()
    except jit.JitError as exc:
        pytest.skip(str(exc))
    exe = ceiling.build(arch, tmp_path)
    assert exe.exists() and exe.stat().st_size > 0


def test_build_failure_shows_the_compiler_output(tmp_path, monkeypatch):
    monkeypatch.setattr(ceiling, "find_nvcc", lambda: "false")
    with pytest.raises(jit.JitError, match="nvcc failed on the ceiling benchmark"):
        ceiling.build("sm_90", tmp_path)


@pytest.mark.gpu
def test_gpu_ceilings_are_plausible():
    rows = ceiling.measure(iters=2000)
    assert rows[0]["sms"] > 0 and len(rows) == 1 + 5 + 3 + 12
    from_registers = max(r["tflops"] for r in rows[1:] if r["mma"] and r["ldsm_bytes_per_mma"] == 0)
    at_512 = max(r["tflops"] for r in rows[1:] if r["mma"] and r["ldsm_bytes_per_mma"] == 512)
    assert from_registers > at_512 > 0  # operands from shared memory cost MMA rate


def test_module_imports_without_a_gpu_and_finds_its_source():
    done = subprocess.run([sys.executable, "-c", "import kdtree.bench.mma_ceiling as m; print(m.SOURCE.exists())"],
                          capture_output=True, text=True)
    assert done.stdout.strip() == "True", done.stderr


def test_main_without_a_gpu_prints_the_reason_not_a_traceback(monkeypatch, capsys):
    def no_smi(*args, **kwargs):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(ceiling.subprocess, "run", no_smi)
    assert mma_ceiling.main(["--out", "/nonexistent-not-written"]) == 2
    err = capsys.readouterr().err
    assert "kdtree.tools.mma_ceiling: no CUDA GPU is visible" in err and "Traceback" not in err
