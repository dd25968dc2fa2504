"""Which archs an extension is built for, and which the kernel supports.

The kernel builds for compute capability 9.0 or newer (its KV loads use the bulk copy engine,
``cp.async.bulk`` with ``mbarrier``; sm_120 has them, sm_80-sm_89 do not, and nvcc refuses the
sources there): an arch below it is refused by name (`check_supported`) or, in an inherited list,
dropped with the reason (`requested`). A 9.0 GPU always runs ``sm_90a`` (`arch_for_capability`), the target that holds the
wgmma variant (``-DKDTREE_SM90A=1``, `arch_defines`). Every extension carries the PTX of its
newest arch (`ptx_arch`), so a newer GPU of the family compiles it at load time.

Where the archs come from (`extension_archs`): ``$KDTREE_CUDA_ARCHS``, else
``$TORCH_CUDA_ARCH_LIST`` (one extension for every GPU), else the device in use.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Optional, Sequence

from kdtree import envvars
from kdtree.kernels.jit.toolchain import JitError

MIN_CAPABILITY = (9, 0)
SM90A = "sm_90a"
ARCH_VARIABLES = (envvars.KDTREE_CUDA_ARCHS.name, envvars.TORCH_CUDA_ARCH_LIST.name)
_ARCH_FORM = re.compile(r"\d{2,3}[af]?")


def normalize_arch(arch: str) -> str:
    """'sm_90', '90', '9.0' -> 'sm_90'; 'sm_90a', '9.0a' -> 'sm_90a'. ValueError for anything else."""
    a = str(arch).strip().lower().replace("sm_", "").replace("compute_", "").replace(".", "")
    if not _ARCH_FORM.fullmatch(a):
        raise ValueError(f"arch {arch!r}: expected something like sm_90 or sm_120")
    return f"sm_{a}"


def _arch_number(arch: str) -> int:
    """sm_120 -> 120, sm_90a -> 90."""
    return int(normalize_arch(arch)[3:].rstrip("af"))


def capability_of(arch: str) -> tuple[int, int]:
    """The compute capability an arch's SASS is for: sm_90a -> (9, 0), sm_120 -> (12, 0)."""
    num = _arch_number(arch)
    return num // 10, num % 10


def unsupported_reason(arch: str) -> Optional[str]:
    """Why the kernel cannot be built for `arch` (None: it can)."""
    if capability_of(arch) < MIN_CAPABILITY:
        return "the kernel needs sm_90 or newer (its KV loads use cp.async.bulk and mbarrier, which sm_80-sm_89 lack)"
    return None


def check_supported(arch: str) -> str:
    """`arch` normalised; ValueError naming it and why when the kernel cannot be built for it."""
    name = normalize_arch(arch)
    why = unsupported_reason(name)
    if why:
        raise ValueError(f"{name}: {why}")
    return name


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


def arch_defines(archs: Sequence[str]) -> list[str]:
    """-DKDTREE_SM90A=1 when sm_90a is among `archs`: the launcher then holds the wgmma variant
    (csrc/tree_verify_mla_sm90a.cuh); builds for any other arch are exactly what they were."""
    return ["-DKDTREE_SM90A=1"] if any(normalize_arch(a) == SM90A for a in archs) else []


def arch_for_capability(capability: tuple[int, int]) -> str:
    """The arch the JIT builds for a device: sm_90a on compute capability 9.0 (wgmma is in the
    "a" target only, which runs on 9.0 devices only), else sm_<major><minor>."""
    major, minor = capability
    return SM90A if (major, minor) == (9, 0) else f"sm_{major}{minor}"


@dataclass(frozen=True)
class ArchRequest:
    """The archs an environment variable names: those built, and those dropped with the reason."""

    variable: str
    text: str
    archs: list[str]
    dropped: list[tuple[str, str]] = field(default_factory=list)  # (item as written, why)

    def describe(self) -> str:
        """``sm_90a, sm_120 (from TORCH_CUDA_ARCH_LIST; dropped 8.6: <why>)``."""
        reasons: dict[str, list[str]] = {}
        for item, why in self.dropped:
            reasons.setdefault(why, []).append(item)
        note = "".join(f"; dropped {', '.join(items)}: {why}" for why, items in reasons.items())
        return f"{', '.join(self.archs)} (from {self.variable}{note})"


def requested() -> Optional[ArchRequest]:
    """The archs $KDTREE_CUDA_ARCHS, else $TORCH_CUDA_ARCH_LIST, names; None when neither is set.

    Both take PyTorch's form: capabilities separated by ``;``, ``,`` or spaces (``9.0;12.0``,
    ``8.0 9.0+PTX``; ``sm_120`` is accepted too). Each names the GPUs to serve, so 9.0 becomes
    sm_90a. ``+PTX`` is accepted and changes nothing (every extension carries the PTX of its
    newest arch). Archs below sm_90 are dropped (`ArchRequest.dropped` says so); a list that
    names none the kernel supports, or something that is not a capability, is a JitError."""
    for variable in ARCH_VARIABLES:
        text = os.environ.get(variable, "").strip()
        if not text:
            continue
        archs: list[str] = []
        dropped: list[tuple[str, str]] = []
        for item in re.split(r"[;,\s]+", text):
            if not item:
                continue
            try:
                arch = arch_for_capability(capability_of(item.upper().removesuffix("+PTX").lower()))
            except ValueError:
                raise JitError(f"{variable}={text!r}: {item!r} is not a compute capability; "
                               "expected a list such as '9.0;12.0'") from None
            why = unsupported_reason(arch)
            if why:
                dropped.append((item, why))
            elif arch not in archs:
                archs.append(arch)
        if not archs:
            why = f" ({dropped[0][1]})" if dropped else ""
            raise JitError(f"{variable}={text!r} names no arch the kernel supports{why}; "
                           "expected a list such as '9.0;12.0'")
        return ArchRequest(variable, text, archs, dropped)
    return None


def requested_archs() -> Optional[tuple[str, list[str]]]:
    """(variable, archs) of `requested`, or None when neither variable is set."""
    req = requested()
    return None if req is None else (req.variable, req.archs)


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
    $TORCH_CUDA_ARCH_LIST name (`requested`), else the device's own (`arch_for_capability`).
    Raises JitError when the named archs cannot run on the device."""
    req = requested()
    if req is None:
        return [arch_for_capability(capability)]
    if not can_run(req.archs, capability):
        major, minor = capability
        raise JitError(f"{req.variable} names {', '.join(req.archs)}, none of which runs on this sm_{major}{minor} GPU: "
                       f"add {major}.{minor} to it (or unset it to build for the GPU in use)")
    return req.archs
