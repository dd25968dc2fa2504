"""Where this machine's CUDA toolkit is: nvcc, its version, compute-sanitizer, cuobjdump.

The one place the project looks for the toolkit (the JIT, the build and sanitizer gates, the
gates' requirement checks and the orchestrator's device report all ask here). The search order
is the one PyTorch's extension builder uses, so both agree on a machine with several toolkits:

1. ``$CUDA_HOME``, then ``$CUDA_PATH`` (an explicit choice wins),
2. the folder above the ``nvcc`` found on ``PATH``, when it holds a toolkit (not for a wrapper
   script such as ``/usr/local/bin/nvcc``),
3. ``/usr/local/cuda``.

A tool is looked for in that toolkit's ``bin/`` first, then on ``PATH``. Nothing here imports
torch or any other part of the project (the gates use it, and gates import nothing of the
project; it reads its variables through `kdtree.envvars`, standard library only), and nothing
raises when the toolkit is missing: lookups return None.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from kdtree import envvars

__all__ = ["DEFAULT_HOME", "Toolkit", "cuda_home", "find_compute_sanitizer", "find_cuobjdump", "find_nvcc",
           "find_tool", "locate", "nvcc_banner", "nvcc_version"]

DEFAULT_HOME = Path("/usr/local/cuda")
_HOME_VARIABLES = (envvars.CUDA_HOME.name, envvars.CUDA_PATH.name)


def cuda_home() -> Optional[Path]:
    """The toolkit's root folder (see the module docstring for the order), or None."""
    for variable in _HOME_VARIABLES:
        value = os.environ.get(variable)
        if value and Path(value).is_dir():
            return Path(value)
    on_path = shutil.which("nvcc")
    if on_path:
        above = Path(on_path).resolve().parent.parent
        if _is_toolkit(above):  # not a wrapper script in /usr/local/bin, say
            return above
    return DEFAULT_HOME if DEFAULT_HOME.is_dir() else None


def _is_toolkit(folder: Path) -> bool:
    return (folder / "bin" / "nvcc").is_file() and ((folder / "nvvm").is_dir() or (folder / "include" / "cuda.h").is_file())


def find_tool(name: str, *subfolders: str) -> Optional[str]:
    """Path of the toolkit program ``name``: in the toolkit's ``bin/`` (or ``subfolders`` of the
    toolkit root, in order), else on PATH; None when there is none."""
    home = cuda_home()
    if home is not None:
        for folder in (*subfolders, "bin"):
            candidate = home / folder / name
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    return shutil.which(name)


def find_nvcc() -> Optional[str]:
    """Path of nvcc, or None."""
    return find_tool("nvcc")


def find_compute_sanitizer() -> Optional[str]:
    """Path of compute-sanitizer (``bin/`` or the toolkit's ``compute-sanitizer/`` folder), or None."""
    return find_tool("compute-sanitizer", "compute-sanitizer")


def find_cuobjdump() -> Optional[str]:
    """Path of cuobjdump: the toolkit's, else the copy triton ships (found without importing
    triton), else None."""
    found = find_tool("cuobjdump")
    if found:
        return found
    try:
        spec = importlib.util.find_spec("triton")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        shipped = Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if shipped.is_file():
            return str(shipped)
    return None


@functools.lru_cache(maxsize=8)
def nvcc_banner(nvcc: str) -> str:
    """The last line of ``nvcc --version`` (``Build cuda_13.0.r13.0/compiler...``), which names the
    exact compiler build; empty when nvcc cannot be run."""
    try:
        proc = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return ""
    lines = proc.stdout.strip().splitlines() if proc.returncode == 0 else []
    return lines[-1] if lines else ""


def nvcc_version(nvcc: Optional[str] = None) -> Optional[str]:
    """The toolkit release, e.g. ``"13.0"``, from ``nvcc --version``; None without a working nvcc."""
    exe = nvcc or find_nvcc()
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"release (\d+\.\d+)", proc.stdout)
    return match.group(1) if match else None


@dataclass(frozen=True)
class Toolkit:
    """Everything `locate` found; a missing piece is None."""

    home: Optional[Path]
    nvcc: Optional[str]
    version: Optional[str]
    compute_sanitizer: Optional[str]
    cuobjdump: Optional[str]


def locate() -> Toolkit:
    """The toolkit as this process's environment finds it (runs ``nvcc --version`` once)."""
    nvcc = find_nvcc()
    return Toolkit(home=cuda_home(), nvcc=nvcc, version=nvcc_version(nvcc) if nvcc else None,
                   compute_sanitizer=find_compute_sanitizer(), cuobjdump=find_cuobjdump())
