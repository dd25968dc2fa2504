"""Just-in-time build of the CUDA extension, cached by what determines the binary.

The extension is compiled with nvcc on first use into
``$KDTREE_CACHE_DIR`` (default ``~/.cache/kdtree-engine/jit``) ``/<key>/``, where the key hashes
the sources (every file under csrc/), the flags, the target archs, the nvcc version and the
Python ABI. A build writes into a temporary folder and renames it into place, under a file lock,
so concurrent processes never see half a build. The bindings are plain pybind11 over raw
pointers, so the binary does not depend on the torch version.

`compile_arch(arch)` compiles the kernel translation unit for one arch with ptxas' resource
report (and the SASS, where cuobjdump is found): what `python -m kdtree.kernels.build` prints
and what phase 1's build gate checks. It needs nvcc but no GPU.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

CSRC = Path(__file__).resolve().parent / "csrc"
KERNEL_SOURCES = ("tree_verify_mla.cu",)
BINDING_SOURCES = ("bindings.cpp",)
MODULE_NAME = "_tree_verify_mla"
BASE_FLAGS = ("-O3", "-std=c++17", "-lineinfo", "--expt-relaxed-constexpr")


def extra_flags() -> tuple[str, ...]:
    """Experiment flags from $KDTREE_NVCC_FLAGS (e.g. -DKD_SKIP=1); part of the cache key."""
    return tuple(os.environ.get("KDTREE_NVCC_FLAGS", "").split())


class JitError(RuntimeError):
    """The extension cannot be built or loaded; the message says what is missing."""


def find_nvcc() -> str:
    """Path of nvcc, from PATH or CUDA_HOME / CUDA_PATH / /usr/local/cuda."""
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "bin" / "nvcc").exists():
            return str(Path(root) / "bin" / "nvcc")
    raise JitError("nvcc was not found: put the CUDA toolkit's bin/ on PATH or set CUDA_HOME "
                   "(the CUDA extension is compiled on first use)")


def find_cuobjdump() -> Optional[str]:
    """cuobjdump from PATH, beside nvcc, or the copy triton ships; None if there is none."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        beside = Path(find_nvcc()).parent / "cuobjdump"
        if beside.exists():
            return str(beside)
    except JitError:
        pass
    try:
        import triton  # noqa: PLC0415

        shipped = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if shipped.exists():
            return str(shipped)
    except Exception:
        pass
    return None


def nvcc_version(nvcc: Optional[str] = None) -> str:
    out = subprocess.run([nvcc or find_nvcc(), "--version"], capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def normalize_arch(arch: str) -> str:
    """'sm_90', '90', '9.0' -> 'sm_90'."""
    a = arch.strip().lower().replace("sm_", "").replace("compute_", "").replace(".", "")
    if not a.rstrip("af").isdigit():
        raise ValueError(f"arch {arch!r}: expected something like sm_90 or sm_120")
    return f"sm_{a}"


def gencode(arch: str) -> list[str]:
    num = normalize_arch(arch)[3:]
    return [f"-gencode=arch=compute_{num},code=sm_{num}"]


def source_hash() -> str:
    h = hashlib.sha256()
    for path in sorted(CSRC.iterdir()):
        if path.is_file():
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def cache_root() -> Path:
    return Path(os.environ.get("KDTREE_CACHE_DIR", Path.home() / ".cache" / "kdtree-engine" / "jit"))


def build_key(archs: Sequence[str], nvcc: str) -> str:
    h = hashlib.sha256()
    for part in (source_hash(), " ".join(BASE_FLAGS + extra_flags()), ",".join(sorted(normalize_arch(a) for a in archs)),
                 nvcc_version(nvcc), sysconfig.get_config_var("EXT_SUFFIX") or "", sys.version):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:20]


def _pybind11_include() -> str:
    try:
        import pybind11  # noqa: PLC0415
    except ImportError as exc:
        raise JitError("pybind11 is not installed (pip install pybind11): the bindings need its headers") from exc
    return pybind11.get_include()


def _python_include() -> str:
    inc = sysconfig.get_paths()["include"]
    if not (Path(inc) / "Python.h").exists():
        raise JitError(f"Python.h is not in {inc}: install the Python development headers")
    return inc


def build_extension(archs: Sequence[str], *, verbose: bool = False) -> Path:
    """Compile (or find in the cache) the extension for `archs`; return the .so path."""
    nvcc = find_nvcc()
    key = build_key(archs, nvcc)
    target_dir = cache_root() / key
    so_path = target_dir / (MODULE_NAME + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
    if so_path.exists():
        return so_path
    cache_root().mkdir(parents=True, exist_ok=True)
    from filelock import FileLock  # noqa: PLC0415

    with FileLock(str(cache_root() / f"{key}.lock"), timeout=1800):
        if so_path.exists():
            return so_path
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=cache_root()))
        cmd = [nvcc, *BASE_FLAGS, *extra_flags(), "--shared", "-Xcompiler", "-fPIC", "-Xcompiler", "-fvisibility=hidden",
               *[flag for a in archs for flag in gencode(a)],
               f"-I{CSRC}", f"-I{_pybind11_include()}", f"-I{_python_include()}",
               *[str(CSRC / s) for s in (*BINDING_SOURCES, *KERNEL_SOURCES)],
               "-o", str(tmp / so_path.name)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise JitError("nvcc failed building the tree-verify extension:\n" + " ".join(cmd) + "\n"
                           + proc.stdout[-4000:] + proc.stderr[-4000:])
        if verbose:
            print(proc.stdout + proc.stderr, file=sys.stderr)
        (tmp / "command.txt").write_text(" ".join(cmd) + "\n")
        if target_dir.exists():
            shutil.rmtree(target_dir)
        os.replace(tmp, target_dir)
    return so_path


_loaded: dict[str, object] = {}  # .so path -> module


def load_extension(archs: Sequence[str]):
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
    return _loaded[key]


@dataclass
class ArchBuild:
    """One arch's compile of the kernel translation unit, with ptxas' report and the SASS."""

    arch: str
    command: list[str]
    returncode: int
    ptxas_log: str
    sass: str = ""
    dynamic_smem_bytes: dict[str, int] = field(default_factory=dict)


def dynamic_smem_bytes() -> dict[str, int]:
    """Dynamic shared memory each kernel is launched with, by mangled name (ptxas cannot see it).

    Mirrors SmemLayout<MT>, ws::Smem and g64::Smem in csrc/; tests/kernels/test_jit.py checks these against
    the compiled extension's own `shared_bytes`.
    """
    block_n, krow, red_stride, p_stride = 32, 576 + 8, 40, 40
    stages = 2 * block_n * krow * 2
    sizes = {}
    for mt in (1, 2):
        bm = 16 * mt
        sizes[f"_ZN6kdtree22tree_verify_mla_kernelILi{mt}EEEvNS_16TreeVerifyParamsE"] = (
            stages + 4 * bm * red_stride * 4 + bm * p_stride * 2 + 3 * bm * 4)
    groups, rows = 2, 16
    sizes["_ZN6kdtree25tree_verify_mla_ws_kernelENS_16TreeVerifyParamsE"] = (
        stages + groups * (4 * rows * red_stride * 4 + rows * p_stride * 2 + 3 * rows * 4) + 4 * 8)
    rows, bn, ring = 32, 16, 4  # g64: 16-key tiles in a four-stage ring
    sizes["_ZN6kdtree26tree_verify_mla_g64_kernelENS_16TreeVerifyParamsE"] = (
        ring * bn * krow * 2 + groups * (4 * rows * (bn + 4) * 4 + rows * (bn + 8) * 2 + 3 * rows * 4) + ring * (8 + 4))
    return sizes


VARIANT_KERNELS = {1: "_ZN6kdtree22tree_verify_mla_kernelILi1EEEvNS_16TreeVerifyParamsE",
                   2: "_ZN6kdtree22tree_verify_mla_kernelILi2EEEvNS_16TreeVerifyParamsE",
                   3: "_ZN6kdtree25tree_verify_mla_ws_kernelENS_16TreeVerifyParamsE",
                   4: "_ZN6kdtree26tree_verify_mla_g64_kernelENS_16TreeVerifyParamsE"}


def compile_arch(arch: str, *, sass: bool = True) -> ArchBuild:
    """Compile csrc/tree_verify_mla.cu for one arch with -Xptxas -v; no GPU needed."""
    nvcc = find_nvcc()
    arch = normalize_arch(arch)
    with tempfile.TemporaryDirectory(prefix="kdtree-build-") as tmp:
        obj = Path(tmp) / f"tree_verify_mla_{arch}.o"
        cmd = [nvcc, *BASE_FLAGS, *extra_flags(), *gencode(arch), "-Xptxas", "-v", f"-I{CSRC}", "-c",
               str(CSRC / "tree_verify_mla.cu"), "-o", str(obj)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        text = ""
        if sass and proc.returncode == 0:
            cuobjdump = find_cuobjdump()
            if cuobjdump:
                dump = subprocess.run([cuobjdump, "--dump-sass", str(obj)], capture_output=True, text=True)
                text = dump.stdout if dump.returncode == 0 else ""
    return ArchBuild(arch=arch, command=cmd, returncode=proc.returncode, ptxas_log=proc.stdout + proc.stderr,
                     sass=text, dynamic_smem_bytes=dynamic_smem_bytes())
