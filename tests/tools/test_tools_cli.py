"""The kernel tools end with a message, not a traceback: bad arguments (exit 2, click's usage
error naming the option), no GPU (exit 2, one line with the reason), a reader that closes the
pipe early (quiet, exit 141 as a process ended by SIGPIPE). Run as real processes, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys

import click
import pytest
import torch

from kdtree import __version__
from kdtree.kernels import cli

TOOLS = ["bench", "devcheck", "host_path_bench", "kernel_times", "mma_ceiling", "peers", "roofline",
         "sanitize_driver", "step_profile", "variant_audit"]


def _run(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=120, **kwargs)


def test_build_refuses_a_bogus_arch():
    done = _run("kdtree.kernels.build", "--arch", "bogus")
    assert done.returncode == 2, done.stderr
    assert "Invalid value for '--arch': arch 'bogus': expected something like sm_90 or sm_120" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("value", ["0", "-4e12", "nan", "inf", "fast"])
@pytest.mark.parametrize("flag", ["--bw", "--flops"])
def test_roofline_refuses_rates_that_are_not_positive(flag, value):
    done = _run("kdtree.tools.roofline", f"{flag}={value}")
    assert done.returncode == 2, (done.stdout[-300:], done.stderr)
    assert f"Invalid value for '{flag}': expected a" in done.stderr and "Traceback" not in done.stderr


def test_roofline_into_a_closed_pipe_ends_quietly():
    # `python -m kdtree.tools.roofline | head -0`: the reader is gone before the table is written
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "kdtree.tools.roofline"], stdout=write_end,
                                stderr=subprocess.PIPE)
    finally:
        os.close(write_end)
    err = proc.communicate(timeout=60)[1].decode()
    assert proc.returncode == cli.SIGPIPE_EXIT, err
    assert "Traceback" not in err and "BrokenPipeError" not in err


def test_mma_ceiling_without_a_gpu_says_so(tmp_path):
    env = dict(os.environ, PATH=str(tmp_path))  # no nvidia-smi on PATH
    done = _run("kdtree.tools.mma_ceiling", "--out", str(tmp_path), env=env)
    assert done.returncode == 2, done.stderr
    assert "no CUDA GPU is visible" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
@pytest.mark.parametrize("tool", ["peers", "variant_audit", "devcheck", "sanitize_driver", "bench"])
def test_gpu_tools_on_a_cpu_machine_end_with_one_line_and_exit_2(tool):
    done = _run(f"kdtree.tools.{tool}")
    assert done.returncode == 2, (done.stdout[-300:], done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs a CUDA GPU" in lines[0] and "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize("tool", TOOLS)
def test_every_tool_has_version_and_log_level(tool):
    import importlib

    main = importlib.import_module(f"kdtree.tools.{tool}").main
    assert isinstance(main.command, click.Command)
    names = {opt for p in main.command.get_params(click.Context(main.command, **main.command.context_settings)) for opt in p.opts}
    assert {"--version", "--log-level", "--help", "-h"} <= names


def test_version_is_the_packages():
    done = _run("kdtree.tools.roofline", "--version")
    assert done.returncode == 0 and done.stdout.strip().endswith(__version__)


def _program(body):
    @click.command()
    @click.option("--n", type=cli.POSITIVE_INT, default=1)
    def command(n):
        return body(n)

    return cli.program(command, "prog")


def test_program_returns_the_status_and_usage_errors_are_2(capsys):
    assert _program(lambda n: None)([]) == 0
    assert _program(lambda n: n)(["--n", "3"]) == 3
    assert _program(lambda n: 0)(["--n", "0"]) == 2
    assert "Invalid value for '--n': expected a whole number >= 1, got '0'" in capsys.readouterr().err


def test_program_turns_a_closed_pipe_into_141(monkeypatch):
    monkeypatch.setattr(cli, "_silence_stdout", lambda: None)

    def closed(n):
        raise BrokenPipeError

    assert _program(closed)([]) == cli.SIGPIPE_EXIT


def test_program_remembers_its_arguments():
    seen = []
    assert _program(lambda n: seen.append(cli.invoked_argv()))(["--n", "2"]) == 0
    assert seen == [["--n", "2"]]


@pytest.mark.parametrize("text,ok", [("1", True), ("0", False), ("-2", False), ("2.5", False)])
def test_positive_int(text, ok):
    if ok:
        assert cli.positive_int(text) == int(text)
        assert cli.POSITIVE_INT.convert(text, None, None) == int(text)
    else:
        with pytest.raises(ValueError, match="whole number"):
            cli.positive_int(text)
        with pytest.raises(click.BadParameter, match="whole number"):
            cli.POSITIVE_INT.convert(text, None, None)


@pytest.mark.parametrize("text,ok", [("4.2e12", True), ("0", False), ("nan", False), ("inf", False), ("x", False)])
def test_positive_float(text, ok):
    if ok:
        assert cli.POSITIVE_FLOAT.convert(text, None, None) == float(text)
    else:
        with pytest.raises(click.BadParameter, match="expected a"):
            cli.POSITIVE_FLOAT.convert(text, None, None)
