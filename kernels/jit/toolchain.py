"""The tools a build needs and what identifies them: nvcc and the archs it knows, the host
compiler, pybind11's headers and version, Python's headers. Nothing here imports torch."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path
from typing import Optional, Sequence

from kdtree import cuda_toolkit, envvars


class JitError(RuntimeError):
    """The extension cannot be built or loaded; the message says what is missing."""


def find_nvcc() -> str:
    """Path of nvcc (`kdtree.cuda_toolkit`: CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda)."""
    found = cuda_toolkit.find_nvcc()
    if found is None:
        raise JitError("nvcc was not found: set CUDA_HOME to the CUDA toolkit or put its bin/ on PATH "
                       "(the CUDA extension is compiled on first use)")
    return found


def find_cuobjdump() -> Optional[str]:
    """cuobjdump from the toolkit or the copy triton ships; None if there is none."""
    return cuda_toolkit.find_cuobjdump()


@functools.lru_cache(maxsize=8)
def nvcc_archs(nvcc: str) -> frozenset[str]:
    """The real archs this nvcc compiles SASS for (``sm_80``, ``sm_90a``, ...), from
    ``nvcc --list-gpu-code``; empty when nvcc cannot say (then nothing is refused up front)."""
    try:
        proc = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(re.findall(r"\bsm_\d+[af]?\b", proc.stdout)) if proc.returncode == 0 else frozenset()


def host_compiler(extra: Sequence[str] = ()) -> str:
    """The host compiler nvcc will call: ``-ccbin`` / ``--compiler-bindir`` in `extra`, else
    $NVCC_CCBIN, else $CUDAHOSTCXX, else ``g++`` on PATH (nvcc's own default on Linux)."""
    for i, flag in enumerate(extra):
        if flag in ("-ccbin", "--compiler-bindir") and i + 1 < len(extra):
            return extra[i + 1]
        if flag.startswith(("-ccbin=", "--compiler-bindir=")):
            return flag.split("=", 1)[1]
    chosen = envvars.NVCC_CCBIN.get() or os.environ.get("CUDAHOSTCXX")
    if chosen:
        return chosen
    return shutil.which("g++") or shutil.which("c++") or "g++"


@functools.lru_cache(maxsize=8)
def compiler_identity(compiler: str) -> str:
    """The compiler's resolved path and the first line of its ``--version`` (part of the cache key)."""
    exe = shutil.which(compiler) or compiler
    try:
        proc = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
        first = proc.stdout.strip().splitlines()[0] if proc.returncode == 0 and proc.stdout.strip() else ""
    except (OSError, subprocess.SubprocessError):
        first = ""
    return f"{Path(exe).resolve() if Path(exe).exists() else exe} {first}".strip()


def pybind11_include() -> str:
    """pybind11's header folder; JitError when pybind11 is not installed."""
    try:
        import pybind11  # noqa: PLC0415
    except ImportError as exc:
        raise JitError("pybind11 is not installed (pip install pybind11): the bindings need its headers") from exc
    return pybind11.get_include()


def pybind11_version() -> str:
    """pybind11's version, or "" without it (the build then fails in `pybind11_include`)."""
    try:
        import pybind11  # noqa: PLC0415
    except ImportError:
        return ""
    return getattr(pybind11, "__version__", "")


def python_include() -> str:
    """Python's header folder; JitError when Python.h is not there."""
    inc = sysconfig.get_paths()["include"]
    if not (Path(inc) / "Python.h").exists():
        raise JitError(f"Python.h is not in {inc}: install the Python development headers")
    return inc
