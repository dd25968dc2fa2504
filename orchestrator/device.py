"""Device and version facts for a run record.

torch is imported only when a phase asks for a CUDA device (a gate requires ``cuda`` or
``sm>=NN``, or ``--device cuda``): a CPU-only plan never pays for it, nor needs it installed.
The orchestrator knows nothing of GPUs beyond recording these facts.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from importlib import metadata
from typing import Optional

from kdtree import __version__
from kdtree.cuda_toolkit import nvcc_version
from kdtree.orchestrator.errors import Refusal
from kdtree.orchestrator.specs import DeviceInfo, Versions


def _dist_version(name: str) -> Optional[str]:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _torch():
    try:
        import torch  # noqa: PLC0415 - only when a run needs to know about CUDA
    except Exception:
        return None
    return torch


def _cmd_output(argv: list[str], timeout: float = 15.0) -> Optional[str]:
    if shutil.which(argv[0]) is None:
        return None
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def resolve_device(request: str, wants_cuda: bool = True) -> str:
    """``auto`` -> ``cuda`` when the phase wants CUDA (``wants_cuda``) and torch sees a GPU, else
    ``cpu``; ``cuda`` without one is refused. torch is imported only when CUDA is wanted."""
    if request == "cpu" or (request == "auto" and not wants_cuda):
        return "cpu"
    torch = _torch()
    has_cuda = bool(torch is not None and torch.cuda.is_available())
    if request == "cuda" and not has_cuda:
        why = "torch is not installed" if torch is None else "torch.cuda.is_available() is False"
        raise Refusal(f"--device cuda, but no CUDA GPU is usable here ({why}); "
                      "use --device cpu or auto (CUDA gates are then skipped)")
    return "cuda" if has_cuda else "cpu"


def device_info(device: str) -> DeviceInfo:
    """Name, compute capability and driver of the device the gates run on."""
    host = platform.node()
    if device != "cuda":
        return DeviceInfo(kind="cpu", name=f"cpu ({platform.machine()})", host=host)
    torch = _torch()
    major, minor = torch.cuda.get_device_capability(0)
    smi = _cmd_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    driver = smi.strip().splitlines()[0].strip() if smi and smi.strip() else None
    return DeviceInfo(kind="cuda", name=torch.cuda.get_device_name(0),
                      compute_capability=f"{major}.{minor}", driver=driver, host=host)


def versions(declared: tuple[str, ...] | list[str] = ()) -> Versions:
    """Python, the orchestrator, and what ``declared`` names (`PhaseSpec.versions`): ``torch``
    (with its CUDA runtime, when torch is already imported), ``triton``, ``nvcc``, or any
    distribution. Nothing is imported: versions come from package metadata."""
    fixed: dict = {}
    packages: dict = {}
    for name in declared:
        if name == "torch":
            torch = sys.modules.get("torch")
            fixed["torch"] = getattr(torch, "__version__", None) or _dist_version("torch")
            fixed["cuda"] = getattr(getattr(torch, "version", None), "cuda", None)
        elif name == "triton":
            fixed["triton"] = _dist_version("triton") or _dist_version("pytorch-triton")
        elif name == "nvcc":
            fixed["nvcc"] = nvcc_version()
        else:
            packages[name] = _dist_version(name)
    return Versions(python=platform.python_version(), kdtree=__version__,
                    packages=packages, **fixed)
