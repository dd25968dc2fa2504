"""Just-in-time build of the CUDA extension, cached by what determines the binary.

The extension is compiled with nvcc on first use into
``$KDTREE_CACHE_DIR`` (default ``~/.cache/kdtree-engine/jit``) ``/<key>/``, where the key hashes
the sources (every file under csrc/), the flags, the target archs, the nvcc version and the
Python ABI. A build writes into a temporary folder and renames it into place, under a file lock,
so concurrent processes never see half a build. The bindings are plain pybind11 over raw
pointers, so the binary does not depend on the torch version.

A device of compute capability 9.0 gets an ``sm_90a`` build (`arch_for_capability`), which also
holds the wgmma variant (``-DKDTREE_SM90A=1``, `arch_defines`); every other arch's build is
unchanged by it.

`compile_arch(arch)` compiles the kernel translation unit for one arch with ptxas' resource
report (and the SASS, where cuobjdump is found): what `python -m kdtree.kernels.build` prints
and what phase 1's build gate checks. The dynamic shared memory each kernel is launched with is
read from the compiled object (`smem_records`: the launcher's own constants, kept there as
data), so no figure is re-derived here. It needs nvcc but no GPU.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import struct
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

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


SM90A = "sm_90a"


def arch_defines(archs: Sequence[str]) -> list[str]:
    """-DKDTREE_SM90A=1 when sm_90a is among `archs`: the launcher then holds the wgmma variant
    (csrc/tree_verify_mla_sm90a.cuh); builds for any other arch are exactly what they were."""
    return ["-DKDTREE_SM90A=1"] if any(normalize_arch(a) == SM90A for a in archs) else []


def arch_for_capability(capability: tuple[int, int]) -> str:
    """The arch the JIT builds for a device: sm_90a on compute capability 9.0 (wgmma is in the
    "a" target only, which runs on 9.0 devices only), else sm_<major><minor>."""
    major, minor = capability
    return SM90A if (major, minor) == (9, 0) else f"sm_{major}{minor}"


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


def cached_build(root: Path, key: str, filename: str, command: Callable[[Path], list[str]], what: str, *,
                 error: type[Exception] = JitError, timeout: float = 1800, verbose: bool = False) -> Path:
    """`root/key/filename`, built on first use by `command(output path)`: the command writes into a
    temporary folder that is renamed into place under a file lock, so concurrent processes never
    load half a build (a leftover folder of the same key is replaced). A failing command raises
    `error` saying "`what` failed" with the command and its output."""
    target_dir = root / key
    out_path = target_dir / filename
    if out_path.exists():
        return out_path
    root.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock  # noqa: PLC0415

    with FileLock(str(root / f"{key}.lock"), timeout=timeout):
        if out_path.exists():
            return out_path
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
        cmd = command(tmp / filename)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise error(f"{what} failed:\n" + " ".join(cmd) + "\n" + proc.stdout[-4000:] + proc.stderr[-4000:])
        if verbose:
            print(proc.stdout + proc.stderr, file=sys.stderr)
        (tmp / "command.txt").write_text(" ".join(cmd) + "\n")
        if target_dir.exists():
            shutil.rmtree(target_dir)
        os.replace(tmp, target_dir)
    return out_path


def build_extension(archs: Sequence[str], *, verbose: bool = False) -> Path:
    """Compile (or find in the cache) the extension for `archs`; return the .so path."""
    nvcc = find_nvcc()

    def command(out: Path) -> list[str]:
        return [nvcc, *BASE_FLAGS, *extra_flags(), "--shared", "-Xcompiler", "-fPIC", "-Xcompiler", "-fvisibility=hidden",
                *[flag for a in archs for flag in gencode(a)], *arch_defines(archs),
                f"-I{CSRC}", f"-I{_pybind11_include()}", f"-I{_python_include()}",
                *[str(CSRC / s) for s in (*BINDING_SOURCES, *KERNEL_SOURCES)], "-o", str(out)]

    return cached_build(cache_root(), build_key(archs, nvcc), MODULE_NAME + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"),
                        command, "nvcc building the tree-verify extension", verbose=verbose)


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


@dataclass(frozen=True)
class SmemRecord:
    """One kernel's launch figures, as the compiled launcher holds them (csrc/tree_verify_mla.cu)."""

    kernel: str  # mangled name, as ptxas reports it
    variant: int  # launch_plan.VARIANTS id; 0 for a kernel launched without dynamic shared memory
    threads: int
    dynamic_smem_bytes: int


SMEM_RECORD_TAG = b"kdtree-smem-v1".ljust(16, b"\0")
_SMEM_RECORD = struct.Struct("<16s3i116s")


def smem_records(binary: bytes) -> list[SmemRecord]:
    """The `kdtree_smem_records` of a compiled object or extension, in the order they were written.

    Raises JitError when there are none (a binary built from other sources, or stripped)."""
    records, start = [], 0
    while (at := binary.find(SMEM_RECORD_TAG, start)) >= 0:
        _, variant, threads, nbytes, name = _SMEM_RECORD.unpack_from(binary, at)
        records.append(SmemRecord(name.split(b"\0", 1)[0].decode(), variant, threads, nbytes))
        start = at + _SMEM_RECORD.size
    if not records:
        raise JitError("the compiled object holds no kdtree_smem_records (csrc/tree_verify_mla.cu defines them)")
    return records


@dataclass
class ArchBuild:
    """One arch's compile of the kernel translation unit, with ptxas' report and the SASS."""

    arch: str
    command: list[str]
    returncode: int
    ptxas_log: str
    sass: str = ""
    smem_records: list[SmemRecord] = field(default_factory=list)

    @property
    def dynamic_smem_bytes(self) -> dict[str, int]:
        """Dynamic shared memory per kernel (mangled name), from the binary's records."""
        return {r.kernel: r.dynamic_smem_bytes for r in self.smem_records}


def compile_arch(arch: str, *, sass: bool = True) -> ArchBuild:
    """Compile csrc/tree_verify_mla.cu for one arch with -Xptxas -v; no GPU needed."""
    nvcc = find_nvcc()
    arch = normalize_arch(arch)
    with tempfile.TemporaryDirectory(prefix="kdtree-build-") as tmp:
        obj = Path(tmp) / f"tree_verify_mla_{arch}.o"
        cmd = [nvcc, *BASE_FLAGS, *extra_flags(), *gencode(arch), *arch_defines([arch]), "-Xptxas", "-v", f"-I{CSRC}", "-c",
               str(CSRC / "tree_verify_mla.cu"), "-o", str(obj)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        text, records = "", []
        if proc.returncode == 0:
            records = smem_records(obj.read_bytes())
            cuobjdump = find_cuobjdump() if sass else None
            if cuobjdump:
                dump = subprocess.run([cuobjdump, "--dump-sass", str(obj)], capture_output=True, text=True)
                text = dump.stdout if dump.returncode == 0 else ""
    return ArchBuild(arch=arch, command=cmd, returncode=proc.returncode, ptxas_log=proc.stdout + proc.stderr,
                     sass=text, smem_records=records)
