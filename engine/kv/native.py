"""The engine's native pieces, built on first use with the host C++ compiler and cached.

`slot_runs()` returns the `_slot_runs` module (engine/kv/csrc/slot_runs.cpp: Tier 0's allocator
core) or None where it cannot be built (no C++ compiler, no Python headers), saying why once in
the ``kdtree.engine.kv.native`` log: `SortedRunAllocator` then runs its Python core, which gives the same answers, slower.
Builds go to `kdtree.kernels.jit.cache_root()/native/<key>/` (the key hashes the source, the
compiler and the Python ABI) through `kdtree.kernels.jit.cached_build`: written into a temporary folder and renamed into place under a
file lock, so concurrent processes never load half a library. ``KDTREE_NATIVE=0`` turns the
native core off (the Python core everywhere).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import ModuleType
from typing import Optional

log = logging.getLogger(__name__)

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCE = CSRC / "slot_runs.cpp"
MODULE = "_slot_runs"
FLAGS = ("-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden")


class NativeBuildError(RuntimeError):
    """The native module could not be built here; the message says why."""


def find_compiler() -> str:
    """The host C++ compiler: $CXX, else c++, g++ or clang++ on PATH."""
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    raise NativeBuildError("no C++ compiler found ($CXX, c++, g++ or clang++ on PATH)")


def _compiler_version(cxx: str) -> str:
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def build_key(cxx: str) -> str:
    h = hashlib.sha256()
    for part in (SOURCE.read_bytes(), " ".join(FLAGS).encode(), _compiler_version(cxx).encode(),
                 (sysconfig.get_config_var("EXT_SUFFIX") or "").encode(), sys.version.encode()):
        h.update(part)
        h.update(b"\0")
    return h.hexdigest()[:20]


def build(verbose: bool = False) -> Path:
    """Compile (or find in the cache) the `_slot_runs` module; return its path."""
    from kdtree.kernels.jit import JitError, _pybind11_include, _python_include, cache_root, cached_build  # noqa: PLC0415

    cxx = find_compiler()
    try:
        includes = [f"-I{_pybind11_include()}", f"-I{_python_include()}"]
    except JitError as err:
        raise NativeBuildError(str(err)) from err
    return cached_build(cache_root() / "native", build_key(cxx), MODULE + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"),
                        lambda out: [cxx, *FLAGS, *includes, str(SOURCE), "-o", str(out)],
                        f"{cxx} building the native allocator core", error=NativeBuildError, timeout=600,
                        verbose=verbose)


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(MODULE, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.lru_cache(maxsize=1)
def slot_runs() -> Optional[ModuleType]:
    """The native `_slot_runs` module, or None (why: `unavailable_reason()`)."""
    _reasons.clear()
    if os.environ.get("KDTREE_NATIVE", "1") == "0":
        return None
    try:
        return _load(build())
    except (NativeBuildError, ImportError, OSError) as err:
        _reasons.append(str(err))
        log.warning("the native allocator core is not available (%s); using the Python core",
                    str(err).splitlines()[0])
        return None


_reasons: list[str] = []


def unavailable_reason() -> Optional[str]:
    """Why `slot_runs()` returned None (None when it did not, or was not asked yet)."""
    if os.environ.get("KDTREE_NATIVE", "1") == "0":
        return "KDTREE_NATIVE=0"
    return _reasons[-1] if _reasons else None
