"""The loadable extension: its nvcc command, its cache key, its build and its import.

The key hashes what determines the binary: the sources (every file under csrc/), the flags, the
target archs, the nvcc build, the host compiler, pybind11's version and the Python ABI. The
bindings are plain pybind11 over raw pointers, so the binary does not depend on the torch version.
nvcc compiles the archs in parallel (``--threads``), which changes how long a build takes, not
what it makes, so it is not in the key.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import sys
import sysconfig
from pathlib import Path
from types import ModuleType
from typing import Sequence

from kdtree import cuda_toolkit, envvars
from kdtree.kernels.jit import cache, toolchain
from kdtree.kernels.jit.archs import (arch_defines, check_supported, extension_archs, gencode, normalize_arch,
                                      ptx_arch, requested)
from kdtree.kernels.jit.toolchain import JitError

log = logging.getLogger("kdtree.kernels.jit")

CSRC = Path(__file__).resolve().parent.parent / "csrc"
KERNEL_SOURCES = ("tree_verify_mla.cu",)
BINDING_SOURCES = ("bindings.cpp",)
MODULE_NAME = "_tree_verify_mla"
BASE_FLAGS = ("-O3", "-std=c++17", "-lineinfo", "--expt-relaxed-constexpr")


def extra_flags() -> tuple[str, ...]:
    """Experiment flags from $KDTREE_NVCC_FLAGS (e.g. -DKD_SKIP=1); part of the cache key."""
    return tuple((envvars.KDTREE_NVCC_FLAGS.get() or "").split())


def source_hash() -> str:
    h = hashlib.sha256()
    for path in sorted(CSRC.iterdir()):
        if path.is_file():
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def build_key(archs: Sequence[str], nvcc: str) -> str:
    """The cache key of the extension for `archs` built by `nvcc` (module docstring)."""
    h = hashlib.sha256()
    for part in (source_hash(), " ".join(BASE_FLAGS + extra_flags()), ",".join(sorted(normalize_arch(a) for a in archs)),
                 f"ptx={ptx_arch(archs)}", cuda_toolkit.nvcc_banner(nvcc),
                 toolchain.compiler_identity(toolchain.host_compiler(extra_flags())),
                 f"pybind11={toolchain.pybind11_version()}", sysconfig.get_config_var("EXT_SUFFIX") or "", sys.version):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:20]


def _filename() -> str:
    return MODULE_NAME + (sysconfig.get_config_var("EXT_SUFFIX") or ".so")


def extension_path(archs: Sequence[str]) -> Path:
    """Where the extension for `archs` is (or would be) cached; needs nvcc (it is in the key)."""
    return cache.cache_root() / build_key(archs, toolchain.find_nvcc()) / _filename()


def nvcc_threads(targets: int) -> list[str]:
    """``--threads N``: one compile per target at once, at most one per CPU core."""
    n = max(1, min(targets, os.cpu_count() or 1))
    return ["--threads", str(n)] if n > 1 else []


def check_nvcc_knows(archs: Sequence[str], nvcc: str) -> None:
    """JitError naming the archs this nvcc cannot compile (say so before a long failing build)."""
    known = toolchain.nvcc_archs(nvcc)
    if not known:
        return
    missing = [a for a in archs if normalize_arch(a).rstrip("af") not in known]
    if missing:
        raise JitError(f"{nvcc} (CUDA {cuda_toolkit.nvcc_version(nvcc) or '?'}) cannot compile for "
                       f"{', '.join(missing)}; it compiles {', '.join(sorted(known, key=lambda a: int(a[3:])))}")


def build_extension(archs: Sequence[str], *, verbose: bool = False) -> Path:
    """Compile (or find in the cache) the extension for `archs` (SASS for each, PTX for the
    newest); return the .so path. JitError names an arch the kernel or this nvcc cannot build."""
    if not archs:
        raise JitError("no arch to build the extension for")
    try:
        archs = [check_supported(a) for a in archs]
    except ValueError as exc:
        raise JitError(str(exc)) from None
    nvcc = toolchain.find_nvcc()
    check_nvcc_knows(archs, nvcc)
    newest = ptx_arch(archs)

    def command(out: Path) -> list[str]:
        return [nvcc, *BASE_FLAGS, *extra_flags(), *nvcc_threads(len(archs) + 1), "--shared", "-Xcompiler", "-fPIC",
                "-Xcompiler", "-fvisibility=hidden",
                *[flag for a in archs for flag in gencode(a, ptx=normalize_arch(a) == newest)], *arch_defines(archs),
                f"-I{CSRC}", f"-I{toolchain.pybind11_include()}", f"-I{toolchain.python_include()}",
                *[str(CSRC / s) for s in (*BINDING_SOURCES, *KERNEL_SOURCES)], "-o", str(out)]

    req = requested()
    note = f"archs {req.describe()}" if req is not None and list(req.archs) == list(archs) else ""
    return cache.cached_build(cache.cache_root(), build_key(archs, nvcc), _filename(), command,
                              f"nvcc building the tree-verify extension for {', '.join(archs)}", error=JitError,
                              verbose=verbose, note=note)


_loaded: dict[str, ModuleType] = {}  # .so path -> module


def load_extension(archs: Sequence[str]) -> ModuleType:
    """Import the compiled extension for `archs` (building it on first use)."""
    so_path = build_extension(archs)
    key = str(so_path)
    if key not in _loaded:
        spec = importlib.util.spec_from_file_location(MODULE_NAME, so_path)
        if spec is None or spec.loader is None:
            raise JitError(f"cannot import the built extension at {so_path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _loaded[key] = module
        log.debug("loaded %s", so_path)
    return _loaded[key]


def load_for_capability(capability: tuple[int, int]) -> ModuleType:
    """The extension a device of `capability` runs (`extension_archs`), built on first use."""
    archs = extension_archs(capability)
    module = load_extension(archs)
    log.info("sm_%d%d GPUs run the tree-verify extension built for %s (%s)", capability[0], capability[1],
             ", ".join(archs), module.__file__)
    return module
