"""Just-in-time build of the CUDA extension, cached by what determines the binary.

The extension is compiled with nvcc on first use into `cache_root()` ``/<key>/``:
``$KDTREE_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/kdtree-engine/jit``, else
``~/.cache/kdtree-engine/jit``. The key hashes the sources (every file under csrc/), the flags,
the target archs, the nvcc build and the Python ABI. A build writes into a temporary folder and
renames it into place, under a file lock, so concurrent processes never see half a build. The
bindings are plain pybind11 over raw pointers, so the binary does not depend on the torch version.
The ``kdtree.kernels.jit`` logger says when a build starts and when it ends (seconds, path).

Which archs (`extension_archs`): those ``$KDTREE_CUDA_ARCHS`` or, failing that,
``$TORCH_CUDA_ARCH_LIST`` name (one extension for every GPU), else the arch of the device in use.
A device of compute capability 9.0 always gets ``sm_90a`` (`arch_for_capability`), which also
holds the wgmma variant (``-DKDTREE_SM90A=1``, `arch_defines`); every other arch's build is
unchanged by it. Every extension carries the PTX of its newest arch, so a newer GPU of the
family compiles it at load time instead of failing (an "a" target's PTX runs on that exact
capability only). `python -m kdtree.kernels.build --extension` builds ahead of time what each
GPU will load; `python -m kdtree.kernels.info` shows the toolkit, the archs and the cache.

`compile_arch(arch)` compiles the kernel translation unit for one arch with ptxas' resource
report (and the SASS, where cuobjdump is found): what `python -m kdtree.kernels.build` prints
and what phase 1's build gate checks. The dynamic shared memory each kernel is launched with is
read from the compiled object (`smem_records`: the launcher's own constants, kept there as
data), so no figure is re-derived here. It needs nvcc but no GPU.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import re
import shutil
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Callable, Optional, Sequence

from kdtree import cuda_toolkit

log = logging.getLogger(__name__)

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
    """Path of nvcc (`kdtree.cuda_toolkit`: CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda)."""
    found = cuda_toolkit.find_nvcc()
    if found is None:
        raise JitError("nvcc was not found: set CUDA_HOME to the CUDA toolkit or put its bin/ on PATH "
                       "(the CUDA extension is compiled on first use)")
    return found


def find_cuobjdump() -> Optional[str]:
    """cuobjdump from the toolkit or the copy triton ships; None if there is none."""
    return cuda_toolkit.find_cuobjdump()


def normalize_arch(arch: str) -> str:
    """'sm_90', '90', '9.0' -> 'sm_90'; 'sm_90a', '9.0a' -> 'sm_90a'."""
    a = arch.strip().lower().replace("sm_", "").replace("compute_", "").replace(".", "")
    if not a.rstrip("af").isdigit():
        raise ValueError(f"arch {arch!r}: expected something like sm_90 or sm_120")
    return f"sm_{a}"


def _arch_number(arch: str) -> int:
    """sm_120 -> 120, sm_90a -> 90."""
    return int(normalize_arch(arch)[3:].rstrip("af"))


def gencode(arch: str, *, ptx: bool = False) -> list[str]:
    """nvcc's -gencode for the SASS of `arch`, plus its PTX when `ptx` (which the driver compiles
    for a newer GPU at load time)."""
    num = normalize_arch(arch)[3:]
    codes = [f"-gencode=arch=compute_{num},code=sm_{num}"]
    if ptx:
        codes.append(f"-gencode=arch=compute_{num},code=compute_{num}")
    return codes


def ptx_arch(archs: Sequence[str]) -> str:
    """The arch whose PTX an extension carries: the newest of `archs`."""
    return max((normalize_arch(a) for a in archs), key=_arch_number)


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


def capability_of(arch: str) -> tuple[int, int]:
    """The compute capability an arch's SASS is for: sm_90a -> (9, 0), sm_120 -> (12, 0)."""
    num = _arch_number(arch)
    return num // 10, num % 10


ARCH_VARIABLES = ("KDTREE_CUDA_ARCHS", "TORCH_CUDA_ARCH_LIST")


def requested_archs() -> Optional[tuple[str, list[str]]]:
    """The archs named by $KDTREE_CUDA_ARCHS, else $TORCH_CUDA_ARCH_LIST, as (variable, archs);
    None when neither is set.

    Both take PyTorch's form: capabilities separated by ``;``, ``,`` or spaces (``9.0;12.0``,
    ``8.0 9.0+PTX``; ``sm_120`` is accepted too). Each names the GPUs to serve, so 9.0 becomes
    sm_90a (`arch_for_capability`: the build a 9.0 GPU runs, with the wgmma variant). ``+PTX`` is
    accepted and changes nothing: every extension carries the PTX of its newest arch."""
    for variable in ARCH_VARIABLES:
        text = os.environ.get(variable, "").strip()
        if not text:
            continue
        archs: list[str] = []
        for item in re.split(r"[;,\s]+", text):
            if not item:
                continue
            try:
                arch = arch_for_capability(capability_of(item.upper().removesuffix("+PTX").lower()))
            except ValueError:
                raise JitError(f"{variable}={text!r}: {item!r} is not a compute capability; "
                               "expected a list such as '9.0;12.0'") from None
            if arch not in archs:
                archs.append(arch)
        if not archs:
            raise JitError(f"{variable}={text!r} names no arch; expected a list such as '9.0;12.0'")
        return variable, archs
    return None


def can_run(archs: Sequence[str], capability: tuple[int, int]) -> bool:
    """Whether an extension built for `archs` (with the PTX of the newest) runs on a device of
    `capability`: SASS of the same major version and an equal or lower minor, an "a" target on
    exactly its capability, or PTX of an equal or lower arch (compiled by the driver on load)."""
    cap = tuple(capability)
    for arch in archs:
        arch_cap = capability_of(arch)
        if normalize_arch(arch).endswith("a"):
            if arch_cap == cap:
                return True
        elif arch_cap[0] == cap[0] and arch_cap[1] <= cap[1]:
            return True
    newest = ptx_arch(archs)
    return capability_of(newest) == cap if newest.endswith("a") else capability_of(newest) <= cap


def extension_archs(capability: tuple[int, int]) -> list[str]:
    """The archs of the extension a device of `capability` loads: those $KDTREE_CUDA_ARCHS or
    $TORCH_CUDA_ARCH_LIST name (`requested_archs`), else the device's own (`arch_for_capability`).
    Raises JitError when the named archs cannot run on the device."""
    requested = requested_archs()
    if requested is None:
        return [arch_for_capability(capability)]
    variable, archs = requested
    if not can_run(archs, capability):
        major, minor = capability
        raise JitError(f"{variable} names {', '.join(archs)}, none of which runs on this sm_{major}{minor} GPU: "
                       f"add {major}.{minor} to it (or unset it to build for the GPU in use)")
    return archs


def source_hash() -> str:
    h = hashlib.sha256()
    for path in sorted(CSRC.iterdir()):
        if path.is_file():
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def cache_root() -> Path:
    """Where builds are cached: $KDTREE_CACHE_DIR, else $XDG_CACHE_HOME/kdtree-engine/jit, else
    ~/.cache/kdtree-engine/jit."""
    explicit = os.environ.get("KDTREE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "kdtree-engine" / "jit"


def build_key(archs: Sequence[str], nvcc: str) -> str:
    h = hashlib.sha256()
    for part in (source_hash(), " ".join(BASE_FLAGS + extra_flags()), ",".join(sorted(normalize_arch(a) for a in archs)),
                 f"ptx={ptx_arch(archs)}", cuda_toolkit.nvcc_banner(nvcc), sysconfig.get_config_var("EXT_SUFFIX") or "", sys.version):
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
        log.info("%s: started (into %s; this takes a minute or more, once per cache key)", what, target_dir)
        start = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            shutil.rmtree(tmp, ignore_errors=True)
            raise error(f"{what} did not finish within {timeout:.0f} s:\n" + " ".join(cmd)) from None
        if proc.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            log.error("%s: failed after %.1f s", what, time.monotonic() - start)
            raise error(f"{what} failed:\n" + " ".join(cmd) + "\n" + proc.stdout[-4000:] + proc.stderr[-4000:])
        if verbose and (proc.stdout or proc.stderr):
            log.info("%s: compiler output:\n%s", what, (proc.stdout + proc.stderr).rstrip())
        (tmp / "command.txt").write_text(" ".join(cmd) + "\n")
        if target_dir.exists():
            shutil.rmtree(target_dir)
        os.replace(tmp, target_dir)
        log.info("%s: done in %.1f s: %s", what, time.monotonic() - start, out_path)
    return out_path


def extension_path(archs: Sequence[str]) -> Path:
    """Where the extension for `archs` is (or would be) cached; needs nvcc (it is in the key)."""
    return cache_root() / build_key(archs, find_nvcc()) / (MODULE_NAME + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))


def build_extension(archs: Sequence[str], *, verbose: bool = False) -> Path:
    """Compile (or find in the cache) the extension for `archs` (SASS for each, PTX for the
    newest); return the .so path."""
    if not archs:
        raise JitError("no arch to build the extension for")
    nvcc = find_nvcc()
    newest = ptx_arch(archs)

    def command(out: Path) -> list[str]:
        return [nvcc, *BASE_FLAGS, *extra_flags(), "--shared", "-Xcompiler", "-fPIC", "-Xcompiler", "-fvisibility=hidden",
                *[flag for a in archs for flag in gencode(a, ptx=normalize_arch(a) == newest)], *arch_defines(archs),
                f"-I{CSRC}", f"-I{_pybind11_include()}", f"-I{_python_include()}",
                *[str(CSRC / s) for s in (*BINDING_SOURCES, *KERNEL_SOURCES)], "-o", str(out)]

    return cached_build(cache_root(), build_key(archs, nvcc), MODULE_NAME + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"),
                        command, f"nvcc building the tree-verify extension for {', '.join(archs)}", verbose=verbose)


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
