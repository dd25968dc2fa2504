"""What the JIT builds and where, chosen by the environment, and what it logs; the warm-up and
info commands. No compile here (the build command is captured, or a stand-in compiler runs)."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kdtree.kernels import build as build_cli
from kdtree.kernels import info as info_cli
from kdtree.kernels import jit
from kdtree.kernels.jit import cache as jit_cache
from kdtree.kernels.jit import extension as jit_extension


@pytest.fixture(autouse=True)
def _no_arch_variables(monkeypatch):
    for variable in (*jit.ARCH_VARIABLES, "KDTREE_CACHE_DIR", "XDG_CACHE_HOME", "KDTREE_SGLANG"):
        monkeypatch.delenv(variable, raising=False)


# --- archs --------------------------------------------------------------------------------------

def test_without_a_variable_each_device_gets_its_own_arch():
    assert jit.requested_archs() is None
    assert jit.extension_archs((9, 0)) == ["sm_90a"]
    assert jit.extension_archs((12, 0)) == ["sm_120"]


@pytest.mark.parametrize("text,archs", [
    ("9.0;12.0", ["sm_90a", "sm_120"]),
    ("10.0 12.0 9.0+PTX", ["sm_100", "sm_120", "sm_90a"]),
    ("sm_120,9.0a", ["sm_120", "sm_90a"]),
    ("9.0; sm_90 ;9.0a", ["sm_90a"]),  # every spelling of 9.0 is the build a 9.0 GPU runs
])
def test_torch_cuda_arch_list_is_read_in_pytorchs_form(monkeypatch, text, archs):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", text)
    assert jit.requested_archs() == ("TORCH_CUDA_ARCH_LIST", archs)


def test_kdtree_cuda_archs_wins_over_torch_cuda_arch_list(monkeypatch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")
    monkeypatch.setenv("KDTREE_CUDA_ARCHS", "12.0")
    assert jit.requested_archs() == ("KDTREE_CUDA_ARCHS", ["sm_120"])
    assert jit.extension_archs((12, 0)) == ["sm_120"]


@pytest.mark.parametrize("text", ["Hopper", ";", "9.x"])
def test_an_arch_list_that_names_no_arch_is_refused_naming_the_variable(monkeypatch, text):
    monkeypatch.setenv("KDTREE_CUDA_ARCHS", text)
    with pytest.raises(jit.JitError, match="KDTREE_CUDA_ARCHS="):
        jit.requested_archs()


@pytest.mark.parametrize("archs,capability,runs", [
    (["sm_80"], (8, 6), True),      # SASS of the same major version, lower minor
    (["sm_86"], (8, 0), False),     # never a higher minor
    (["sm_80"], (9, 0), True),      # sm_80's PTX, compiled by the driver
    (["sm_90a"], (9, 0), True),
    (["sm_90a"], (10, 0), False),   # an "a" target (SASS and PTX) runs on exactly 9.0
    (["sm_90a", "sm_120"], (12, 1), True),   # sm_120 SASS on a 12.1 GPU
    (["sm_90a", "sm_100"], (12, 0), True),   # sm_100's PTX
    (["sm_120"], (9, 0), False),
])
def test_can_run_follows_cudas_compatibility_rules(archs, capability, runs):
    assert jit.can_run(archs, capability) is runs


def test_a_variable_that_serves_no_arch_of_the_gpu_says_what_to_add(monkeypatch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "12.0")
    with pytest.raises(jit.JitError, match=r"TORCH_CUDA_ARCH_LIST names sm_120, none of which runs on this sm_90 "
                                           r"GPU: add 9\.0"):
        jit.extension_archs((9, 0))


def test_the_extension_carries_the_ptx_of_its_newest_arch_only(monkeypatch, tmp_path):
    commands = []

    def capture(root, key, filename, command, what, **kwargs):
        commands.append(command(tmp_path / filename))
        return tmp_path / filename

    _capture_builds(monkeypatch, capture)
    jit.build_extension(["sm_90a", "sm_120", "sm_100"])
    codes = [flag for flag in commands[0] if flag.startswith("-gencode")]
    assert codes == ["-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_120,code=sm_120",
                     "-gencode=arch=compute_120,code=compute_120", "-gencode=arch=compute_100,code=sm_100"]
    assert "-DKDTREE_SM90A=1" in commands[0]


def _capture_builds(monkeypatch, capture):
    monkeypatch.setattr(jit_cache, "cached_build", capture)
    monkeypatch.setattr(jit_extension.toolchain, "find_nvcc", lambda: "nvcc")
    monkeypatch.setattr(jit_extension.toolchain, "nvcc_archs", lambda nvcc: frozenset())
    monkeypatch.setattr(jit_extension, "build_key", lambda archs, nvcc: "key")


def test_nvcc_compiles_the_archs_in_parallel_one_thread_per_target_at_most_one_per_core(monkeypatch, tmp_path):
    commands = []
    _capture_builds(monkeypatch, lambda root, key, filename, command, what, **kw: commands.append(command(tmp_path)))
    monkeypatch.setattr(jit_extension.os, "cpu_count", lambda: 2)
    jit.build_extension(["sm_90a", "sm_120"])
    i = commands[0].index("--threads")
    assert commands[0][i + 1] == "2"
    assert jit.nvcc_threads(1) == [] and jit.nvcc_threads(3)[1] == "2"


# --- which archs: inherited lists, --arch, what nvcc knows ---------------------------------------

def test_an_inherited_list_builds_only_the_supported_archs_and_says_what_it_dropped(monkeypatch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "7.5;8.0;8.6;9.0;12.0")
    req = jit.requested()
    assert req.archs == ["sm_90a", "sm_120"]
    assert [item for item, _ in req.dropped] == ["7.5", "8.0", "8.6"] and "sm_90 or newer" in req.dropped[0][1]
    assert req.describe().startswith("sm_90a, sm_120 (from TORCH_CUDA_ARCH_LIST; dropped 7.5, 8.0, 8.6: the kernel "
                                     "needs sm_90")
    assert jit.extension_archs((9, 0)) == ["sm_90a", "sm_120"]


def test_a_list_of_only_old_archs_is_refused_saying_why(monkeypatch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "7.5;8.0;8.6")
    with pytest.raises(jit.JitError, match=r"names no arch the kernel supports \(the kernel needs sm_90"):
        jit.requested()


def test_build_extension_refuses_an_unsupported_arch_before_running_nvcc(monkeypatch):
    _capture_builds(monkeypatch, lambda *a, **k: pytest.fail("nvcc must not run"))
    with pytest.raises(jit.JitError, match="^sm_86: the kernel needs sm_90 or newer"):
        jit.build_extension(["sm_86", "sm_90a"])


def test_an_arch_this_nvcc_cannot_compile_is_named_before_the_build(monkeypatch):
    _capture_builds(monkeypatch, lambda *a, **k: pytest.fail("nvcc must not run"))
    monkeypatch.setattr(jit_extension.toolchain, "nvcc_archs", lambda nvcc: frozenset({"sm_90", "sm_100"}))
    with pytest.raises(jit.JitError, match="cannot compile for sm_120; it compiles sm_90, sm_100"):
        jit.build_extension(["sm_90a", "sm_120"])


@pytest.mark.parametrize("arch,why", [("sm_75", "sm_75: the kernel needs sm_90 or newer"),
                                      ("sm_86", "sm_86: the kernel needs sm_90 or newer (its KV loads use"),
                                      ("hopper", "arch 'hopper': expected something like sm_90 or sm_120")])
def test_a_bad_arch_on_the_command_line_is_one_line(arch, why):
    for args in (["--arch", arch], ["--extension", "--arch", arch]):
        result = CliRunner().invoke(build_cli.main, args)
        assert result.exit_code == 2
        (line,) = result.output.strip().splitlines()
        assert line.startswith("Error: Invalid value for '--arch': ") and why in line


def test_the_cache_key_holds_the_host_compiler_and_pybind11(monkeypatch):
    monkeypatch.setattr(jit_extension.cuda_toolkit, "nvcc_banner", lambda nvcc: "nvcc build")
    base = jit.build_key(["sm_120"], "nvcc")
    monkeypatch.setattr(jit_extension.toolchain, "pybind11_version", lambda: "0.0.1")
    assert jit.build_key(["sm_120"], "nvcc") != base
    monkeypatch.undo()
    monkeypatch.setattr(jit_extension.cuda_toolkit, "nvcc_banner", lambda nvcc: "nvcc build")
    monkeypatch.setenv("NVCC_CCBIN", "/opt/other/g++-99")
    assert jit.build_key(["sm_120"], "nvcc") != base
    assert jit_extension.toolchain.host_compiler(["-ccbin", "/x/clang++"]) == "/x/clang++"


# --- the cache ----------------------------------------------------------------------------------

def test_cache_root_honours_xdg_cache_home_and_kdtree_cache_dir_wins(monkeypatch, tmp_path):
    assert jit.cache_root() == Path.home() / ".cache" / "kdtree-engine" / "jit"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert jit.cache_root() == tmp_path / "xdg" / "kdtree-engine" / "jit"
    monkeypatch.setenv("KDTREE_CACHE_DIR", str(tmp_path / "mine"))
    assert jit.cache_root() == tmp_path / "mine"


def test_cache_root_ignores_a_relative_xdg_cache_home(monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # the XDG spec: relative paths are invalid
    assert jit.cache_root() == Path.home() / ".cache" / "kdtree-engine" / "jit"


def _stand_in_compiler(out: Path) -> list[str]:
    return [sys.executable, "-c", f"open({str(out)!r}, 'w').write('built')"]


def test_a_build_logs_when_it_starts_and_when_it_ends_with_seconds_and_path(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="kdtree.kernels.jit"):
        path = jit.cached_build(tmp_path, "k1", "ext.so", _stand_in_compiler, "building the thing")
    assert path.read_text() == "built"
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert messages[0].startswith("building the thing: started") and str(tmp_path / "k1") in messages[0]
    assert messages[1].startswith("building the thing: done in ") and messages[1].endswith(f" s: {path}")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="kdtree.kernels.jit"):
        assert jit.cached_build(tmp_path, "k1", "ext.so", _stand_in_compiler, "building the thing") == path
    assert not [r for r in caplog.records if r.levelno >= logging.INFO]  # a cache hit is at debug only
    with caplog.at_level(logging.DEBUG, logger="kdtree.kernels.jit"):
        jit.cached_build(tmp_path, "k1", "ext.so", _stand_in_compiler, "building the thing")
    assert any(r.levelno == logging.DEBUG and "cached at" in r.getMessage() for r in caplog.records)


def _slow_compiler(out: Path) -> list[str]:
    return [sys.executable, "-c", f"import time; time.sleep(0.5); open({str(out)!r}, 'w').write('built')"]


def test_a_long_build_says_it_is_still_compiling(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="kdtree.kernels.jit"):
        jit.cached_build(tmp_path, "k3", "ext.so", _slow_compiler, "building the thing", heartbeat=0.1)
    beats = [r.getMessage() for r in caplog.records if "still compiling" in r.getMessage()]
    assert beats and beats[0].startswith("building the thing: still compiling (")


def test_without_any_logging_configured_the_build_lines_go_to_stderr(tmp_path):
    # a library user that configured nothing: Python would drop INFO lines; the build says them on stderr
    script = ("import logging, sys; from pathlib import Path; from kdtree.kernels import jit; "
              f"jit.cached_build(Path({str(tmp_path)!r}), 'k', 'ext.so', "
              f"lambda out: [sys.executable, '-c', 'open(%r, \"w\").write(str(1))' % str(out)], 'building the thing')")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert [line.split(": ")[:2] for line in lines] == [["kdtree.kernels.jit", "building the thing"]] * 2
    assert "started" in lines[0] and "done in" in lines[1]


def test_a_configured_server_log_shows_the_build_lines_through_logging(tmp_path):
    # SGLang configures the root logger (basicConfig) before it builds backends: the lines go there
    script = ("import logging, sys; from pathlib import Path; from kdtree.kernels import jit; "
              "logging.basicConfig(level=logging.INFO, format='[srv] %(message)s', stream=sys.stdout); "
              f"jit.cached_build(Path({str(tmp_path)!r}), 'k', 'ext.so', "
              f"lambda out: [sys.executable, '-c', 'open(%r, \"w\").write(str(1))' % str(out)], 'building the thing')")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert [line[:32] for line in done.stdout.splitlines()] == ["[srv] building the thing: starte",
                                                                 "[srv] building the thing: done i"]


def test_clear_cache_removes_every_build_and_says_how_much(monkeypatch, tmp_path):
    monkeypatch.setenv("KDTREE_CACHE_DIR", str(tmp_path))
    jit.cached_build(tmp_path, "k1", "ext.so", _stand_in_compiler, "building the thing")
    jit.cached_build(tmp_path / "native", "n1", "core.so", _stand_in_compiler, "building the core")
    (tmp_path / ".k9-running").mkdir()  # another process's build in flight: kept
    assert len(jit.cached_builds()) == 2
    result = CliRunner().invoke(build_cli.main, ["--clear-cache"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"removed 2 build(s), 0.0 MiB, from {tmp_path}")
    assert jit.cached_builds() == [] and (tmp_path / ".k9-running").is_dir()


def test_a_failed_build_logs_and_raises_with_the_compilers_output(tmp_path, caplog):
    def failing(out: Path) -> list[str]:
        return [sys.executable, "-c", "import sys; sys.exit('no such header')"]

    with caplog.at_level(logging.INFO, logger="kdtree.kernels.jit"), \
            pytest.raises(jit.JitError, match="(?s)building the thing failed:.*no such header"):
        jit.cached_build(tmp_path, "k2", "ext.so", failing, "building the thing")
    assert any(r.levelno == logging.ERROR and "failed after" in r.getMessage() for r in caplog.records)
    assert not list(tmp_path.glob(".k2-*")) and not (tmp_path / "k2").exists()


# --- python -m kdtree.kernels.build --extension ------------------------------------------------

def test_warm_up_builds_what_each_named_gpu_loads_once_each(monkeypatch):
    built = []
    monkeypatch.setattr(build_cli, "build_extension", lambda archs: built.append(list(archs)) or Path("/x.so"))
    result = CliRunner().invoke(build_cli.main, ["--extension", "--arch", "sm_90", "--arch", "sm_90a",
                                                 "--arch", "sm_120"])
    assert result.exit_code == 0, result.output
    assert built == [["sm_90a"], ["sm_120"]]  # sm_90 and sm_90a both mean a 9.0 GPU: its sm_90a build
    assert "extension (sm_90a): /x.so" in result.output


def test_warm_up_with_an_arch_variable_builds_the_one_extension_it_names(monkeypatch):
    monkeypatch.setenv("KDTREE_CUDA_ARCHS", "9.0;12.0")
    built = []
    monkeypatch.setattr(build_cli, "build_extension", lambda archs: built.append(list(archs)) or Path("/x.so"))
    result = CliRunner().invoke(build_cli.main, ["--extension", "--arch", "sm_90a", "--arch", "sm_120"])
    assert result.exit_code == 0, result.output
    assert built == [["sm_90a", "sm_120"]]


def test_warm_up_without_a_gpu_or_an_arch_is_one_line_and_exit_2(monkeypatch):
    monkeypatch.setattr(build_cli, "visible_capabilities", lambda: [])
    result = CliRunner().invoke(build_cli.main, ["--extension"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "Error: no CUDA GPU is visible here, so there is nothing to build for: name the GPUs' archs with "
        "--arch (e.g. --arch sm_90a --arch sm_120) or KDTREE_CUDA_ARCHS"]


def test_warm_up_on_a_machine_without_a_gpu_builds_what_the_variable_names(monkeypatch):
    # image and AOT wheel builds: no GPU, the archs named by the variable
    monkeypatch.setenv("KDTREE_CUDA_ARCHS", "9.0;12.0")
    monkeypatch.setattr(build_cli, "visible_capabilities", lambda: pytest.fail("no GPU is needed"))
    built = []
    monkeypatch.setattr(build_cli, "build_extension", lambda archs: built.append(list(archs)) or Path("/x.so"))
    result = CliRunner().invoke(build_cli.main, ["--extension"])
    assert result.exit_code == 0, result.output
    assert built == [["sm_90a", "sm_120"]] and "extension (sm_90a, sm_120): /x.so" in result.output


def test_build_without_nvcc_is_one_line_and_exit_2(monkeypatch):
    def no_nvcc(*args, **kwargs):
        raise jit.JitError("nvcc was not found: set CUDA_HOME")

    monkeypatch.setattr(build_cli, "compile_arch", no_nvcc)
    result = CliRunner().invoke(build_cli.main, ["--arch", "sm_120"])
    assert result.exit_code == 2 and result.output.strip() == "Error: nvcc was not found: set CUDA_HOME"


def test_build_has_version_and_log_level():
    from kdtree import __version__

    result = CliRunner().invoke(build_cli.main, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output


# --- python -m kdtree.kernels.info ---------------------------------------------------------------

def test_info_on_a_machine_without_a_gpu(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0 12.0")
    monkeypatch.setattr(info_cli, "gpus", lambda: ([], "torch.cuda.is_available() is False"))
    result = CliRunner().invoke(info_cli.main, [])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "archs: sm_90a, sm_120 (from TORCH_CUDA_ARCH_LIST), PTX for sm_120" in out
    assert f"cache: {tmp_path / 'kdtree-engine' / 'jit'} (XDG_CACHE_HOME; 0 build(s) in it; " in out
    assert "GPUs: none visible (torch.cuda.is_available() is False)" in out
    assert "CUDA toolkit:" in out and "SGLang plugin:" in out


def test_info_shows_what_each_gpu_loads_and_dispatches(monkeypatch, tmp_path):
    monkeypatch.setenv("KDTREE_CACHE_DIR", str(tmp_path))
    gpu = info_cli.GpuInfo(0, "NVIDIA H200", (9, 0), ["sm_90a"], None)
    monkeypatch.setattr(info_cli, "gpus", lambda: ([gpu], None))
    out = CliRunner().invoke(info_cli.main, []).output
    assert "cuda:0 NVIDIA H200 (sm_90)" in out
    assert "extension: sm_90a: not built yet (python -m kdtree.kernels.build --extension)" in out
    assert "variants: base16, base32, ws, wgmma; default dispatch: 1-16 rows/request base16" in out


def test_dispatch_ranges_cover_every_tree_size_without_gaps():
    for capability in ((8, 0), (9, 0), (12, 0)):
        ranges = info_cli.dispatch_ranges(capability)
        assert ranges[0][0] == 1 and ranges[-1][1] == 1024
        assert all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:]))
    assert [name for _, _, name in info_cli.dispatch_ranges((12, 0))] == ["base16", "ws"]


def test_plugin_state_follows_kdtree_sglang(monkeypatch):
    monkeypatch.setattr(info_cli.importlib.metadata, "version", lambda name: "0.5.23")
    assert info_cli.plugin_info().disabled_by_env is False
    monkeypatch.setenv("KDTREE_SGLANG", "0")
    plugin = info_cli.plugin_info()
    assert plugin.disabled_by_env and not plugin.enabled
    if plugin.entry_point:  # installed (editable or wheel): the entry point names our register()
        assert plugin.entry_point == "kdtree = kdtree.integrations.sglang.plugin:register"


@pytest.mark.slow
@pytest.mark.skipif(jit_extension.cuda_toolkit.find_nvcc() is None, reason="nvcc is not installed")
def test_a_real_build_carries_the_newest_archs_ptx_and_is_logged(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("KDTREE_CACHE_DIR", str(tmp_path))
    with caplog.at_level(logging.INFO, logger="kdtree.kernels.jit"):
        so = jit.build_extension(["sm_120"])
    assert so.parent.parent == tmp_path
    said = [r.getMessage().split(": ")[1].split(" ")[0].rstrip(",") for r in caplog.records
            if "still compiling" not in r.getMessage()]
    assert said == ["started", "done"]
    cuobjdump = jit.find_cuobjdump()
    if cuobjdump is None:
        pytest.skip("no cuobjdump to list the PTX with")
    listed = subprocess.run([cuobjdump, "--list-ptx", str(so)], capture_output=True, text=True, timeout=120).stdout
    assert "sm_120.ptx" in listed
