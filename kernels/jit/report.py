"""One arch's compile of the kernel with ptxas' resource report and the SASS: what
``python -m kdtree.kernels.build`` prints and what phase 1's build gate checks. The dynamic
shared memory each kernel is launched with is read from the compiled object (`smem_records`: the
launcher's own constants, kept there as data), so no figure is re-derived here. Needs nvcc, no GPU.
"""

from __future__ import annotations

import struct
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from kdtree.kernels.jit import toolchain
from kdtree.kernels.jit.archs import arch_defines, gencode, normalize_arch
from kdtree.kernels.jit.extension import BASE_FLAGS, CSRC, extra_flags
from kdtree.kernels.jit.toolchain import JitError


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
    nvcc = toolchain.find_nvcc()
    arch = normalize_arch(arch)
    with tempfile.TemporaryDirectory(prefix="kdtree-build-") as tmp:
        obj = Path(tmp) / f"tree_verify_mla_{arch}.o"
        cmd = [nvcc, *BASE_FLAGS, *extra_flags(), *gencode(arch), *arch_defines([arch]), "-Xptxas", "-v", f"-I{CSRC}", "-c",
               str(CSRC / "tree_verify_mla.cu"), "-o", str(obj)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        text, records = "", []
        if proc.returncode == 0:
            records = smem_records(obj.read_bytes())
            cuobjdump = toolchain.find_cuobjdump() if sass else None
            if cuobjdump:
                dump = subprocess.run([cuobjdump, "--dump-sass", str(obj)], capture_output=True, text=True)
                text = dump.stdout if dump.returncode == 0 else ""
    return ArchBuild(arch=arch, command=cmd, returncode=proc.returncode, ptxas_log=proc.stdout + proc.stderr,
                     sass=text, smem_records=records)
