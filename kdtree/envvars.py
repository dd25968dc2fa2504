"""Every environment variable kdtree-engine reads, in one registry.

Code reads a variable through its entry (``KDTREE_DEBUG.get()``), and the README's table of
variables is this registry rendered (``python -m kdtree.envvars`` prints it;
``tests/test_envvars.py`` holds the README and the source tree to it). Nothing here imports
anything beyond the standard library, so every layer may use it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Optional

__all__ = ["EnvVar", "REGISTRY", "by_name", "markdown_table"]


@dataclass(frozen=True)
class EnvVar:
    """One variable: its name, what it does when set, its default and who reads it."""

    name: str
    effect: str
    default: str
    read_by: str

    def get(self, default: Optional[str] = None) -> Optional[str]:
        """The value in this process's environment, or `default` (None) when unset or empty."""
        value = os.environ.get(self.name)
        return value if value else default

    def is_off(self) -> bool:
        """True when set to ``0`` (the switches' off value)."""
        return os.environ.get(self.name, "").strip() == "0"

    def is_on(self) -> bool:
        """True when set to anything but empty or ``0`` (the debug flags' on value)."""
        return os.environ.get(self.name, "").strip() not in ("", "0")


KDTREE_CUDA_ARCHS = EnvVar(
    "KDTREE_CUDA_ARCHS", "the archs the extension is built for, in PyTorch's form (`9.0;12.0`); archs below 9.0 "
    "are dropped with a line saying so, 9.0 is built as sm_90a; wins over `TORCH_CUDA_ARCH_LIST`",
    "the GPU in use", "kdtree.kernels.jit")
TORCH_CUDA_ARCH_LIST = EnvVar(
    "TORCH_CUDA_ARCH_LIST", "read like `KDTREE_CUDA_ARCHS` when that is unset (PyTorch's own variable, often set in "
    "images)", "the GPU in use", "kdtree.kernels.jit")
KDTREE_NVCC_FLAGS = EnvVar(
    "KDTREE_NVCC_FLAGS", "extra nvcc flags for experiments (`-DKD_SKIP=1`); part of the build's cache key",
    "none", "kdtree.kernels.jit")
KDTREE_CACHE_DIR = EnvVar(
    "KDTREE_CACHE_DIR", "the folder builds are cached in (`python -m kdtree.kernels.build --clear-cache` empties it)",
    "`$XDG_CACHE_HOME/kdtree-engine/jit`, else `~/.cache/kdtree-engine/jit`", "kdtree.kernels.jit, kdtree.engine.kv.native")
XDG_CACHE_HOME = EnvVar(
    "XDG_CACHE_HOME", "the cache root under which `kdtree-engine/jit` is made (an absolute path; a relative one is "
    "ignored)", "`~/.cache`", "kdtree.kernels.jit")
CUDA_HOME = EnvVar(
    "CUDA_HOME", "the CUDA toolkit (nvcc, compute-sanitizer, cuobjdump); `CUDA_PATH` is read after it",
    "the toolkit above the `nvcc` on PATH, else `/usr/local/cuda`", "kdtree.cuda_toolkit")
CUDA_PATH = EnvVar("CUDA_PATH", "the CUDA toolkit, when `CUDA_HOME` is unset", "unset", "kdtree.cuda_toolkit")
NVCC_CCBIN = EnvVar(
    "NVCC_CCBIN", "the host compiler nvcc uses (nvcc's own variable); part of the cache key, as is "
    "`CUDAHOSTCXX` after it", "`g++` on PATH", "nvcc, kdtree.kernels.jit")
KDTREE_DEBUG = EnvVar(
    "KDTREE_DEBUG", "`1`: the op's index checks that synchronise the device run on CUDA inputs too "
    "(`kdtree.kernels.set_debug` at run time)", "off", "kdtree.kernels.contract")
KDTREE_SGLANG = EnvVar(
    "KDTREE_SGLANG", "`0`: the SGLang plugin leaves `--attention-backend triton` as SGLang's own", "on",
    "kdtree.integrations.sglang")
SGLANG_PLUGINS = EnvVar(
    "SGLANG_PLUGINS", "SGLang's allow-list of plugin names: set without `kdtree`, SGLang does not load the plugin",
    "every installed plugin", "SGLang")
KDTREE_NATIVE = EnvVar(
    "KDTREE_NATIVE", "`0`: the KV allocator's core runs in Python instead of its C++ build", "on",
    "kdtree.engine.kv.native")
CXX = EnvVar("CXX", "the C++ compiler of the allocator's core", "`c++`, `g++`, `clang++` on PATH",
             "kdtree.engine.kv.native")
ORCHESTRATE_RESCUE_DIR = EnvVar(
    "ORCHESTRATE_RESCUE_DIR", "where a run record goes when the results folder cannot be written (tried first)",
    "`$XDG_STATE_HOME/orchestrate/rescued`, `~/.local/state/orchestrate/rescued`", "kdtree.orchestrator")
OUT = EnvVar("OUT", "the default `--out` folder of the GPU tools (the device machine's result folder)", "`.`",
             "kdtree.tools")

REGISTRY: tuple[EnvVar, ...] = (
    KDTREE_CUDA_ARCHS, TORCH_CUDA_ARCH_LIST, KDTREE_NVCC_FLAGS, KDTREE_CACHE_DIR, XDG_CACHE_HOME, CUDA_HOME,
    CUDA_PATH, NVCC_CCBIN, KDTREE_DEBUG, KDTREE_SGLANG, SGLANG_PLUGINS, KDTREE_NATIVE, CXX, ORCHESTRATE_RESCUE_DIR,
    OUT,
)


def by_name(name: str) -> EnvVar:
    """The registry's entry for `name`; KeyError naming the registry when there is none."""
    for var in REGISTRY:
        if var.name == name:
            return var
    raise KeyError(f"{name} is not in kdtree.envvars.REGISTRY")


def markdown_table() -> str:
    """The README's table of variables."""
    rows = ["| variable | effect | default | read by |", "|---|---|---|---|"]
    rows += [f"| `{v.name}` | {v.effect} | {v.default} | {v.read_by} |" for v in REGISTRY]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown_table())
