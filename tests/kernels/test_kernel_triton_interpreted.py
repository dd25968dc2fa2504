"""Runs the accuracy suite's Triton cases on the CPU, under the triton interpreter, in a child pytest.

Why a child process: whether a triton kernel is interpreted is decided from ``TRITON_INTERPRET``
when triton builds it (at decoration, and in some triton versions at import), and the variable
leaks into everything else in the process. Setting it here would depend on import order and
would silently turn the Triton baseline into the interpreter for every later test, including
GPU ones. A child gets the variable before it imports anything, so the choice is certain on any
triton version and this process is untouched. The child runs only the Triton parameters of
test_kernel_accuracy.py (the tiny cases, see `kernel_cases.Case.tiny`) with this session's seed, and
its output is shown on failure. To run them directly:
``TRITON_INTERPRET=1 pytest tests/kernels/test_kernel_accuracy.py -k triton``.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

import kernel_cases

HERE = Path(__file__).resolve().parent


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"),
                    reason="this process already interprets triton: test_kernel_accuracy runs the cases")
@pytest.mark.slow
def test_triton_baseline_under_interpreter(run_interpreted):
    child = run_interpreted(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "triton",
                             str(HERE / "test_kernel_accuracy.py")], {"KDTREE_TEST_SEED": str(kernel_cases.BASE_SEED)})
    report = child.stdout[-6000:] + child.stderr[-3000:]
    assert child.returncode == 0, f"interpreted Triton cases failed (rc {child.returncode}):\n{report}"
    expected = sum(case.tiny for case in kernel_cases.CASES) + 1  # + test_allocates_out_when_none_given
    assert f"{expected} passed" in child.stdout, f"expected {expected} interpreted cases to pass:\n{report}"
