"""The kernel tools end with a message, not a traceback: bad arguments (exit 2, argparse's usage
line naming the argument), no GPU (exit 2, the reason), a reader that closes the pipe early
(quiet, exit 141 as a process ended by SIGPIPE). Run as real processes, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kdtree.kernels import cli


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
    assert f"argument {flag}: expected a" in done.stderr and "Traceback" not in done.stderr


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


def test_run_passes_the_status_through_and_turns_a_closed_pipe_into_141():
    assert cli.run(lambda argv: 3) == 3 and cli.run(lambda argv: None) == 0

    def closed(argv):
        raise BrokenPipeError

    assert cli.run(closed) == cli.SIGPIPE_EXIT


@pytest.mark.parametrize("text,ok", [("1", True), ("0", False), ("-2", False), ("2.5", False)])
def test_positive_int(text, ok):
    if ok:
        assert cli.positive_int(text) == int(text)
    else:
        with pytest.raises(Exception, match="whole number"):
            cli.positive_int(text)
