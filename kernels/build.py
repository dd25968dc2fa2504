"""Compile the tree-verify kernel ahead of time: ptxas' report per arch, and the JIT warm-up.

    python -m kdtree.kernels.build --arch sm_90a --arch sm_120 [--sass]   # the report, no GPU needed
    python -m kdtree.kernels.build --extension                           # warm-up on the GPU machine
    python -m kdtree.kernels.build --extension --arch sm_90a --arch sm_120   # warm-up for those GPUs
    KDTREE_CUDA_ARCHS="9.0;12.0" python -m kdtree.kernels.build --extension  # on a machine without a GPU
    python -m kdtree.kernels.build --clear-cache                         # remove every cached build

The report, for each ``--arch``: registers, spills, stack frame and static shared memory per
kernel (from ``nvcc -Xptxas -v``), the dynamic shared memory each kernel is launched with (read
from the compiled object's records), and, with ``--sass`` where cuobjdump is found, the
tensor-core instructions in the SASS (HMMA expected; HGMMA only in sm_90a, whose wgmma variant
runs on compute capability 9.0; UTC* would break sm_120 portability). The report compiles each
arch as named: ``sm_90`` is the plain Hopper target (no wgmma), ``sm_90a`` the one a 9.0 GPU runs.

``--extension`` builds the loadable extension into the JIT cache exactly as the first kernel
call would (`kdtree.kernels.jit.extension_archs`): without ``--arch`` for each GPU this machine
sees, with ``--arch`` for GPUs of those archs (``sm_90`` and ``sm_90a`` both mean a 9.0 GPU,
which loads the sm_90a build). With $KDTREE_CUDA_ARCHS or $TORCH_CUDA_ARCH_LIST set, that is
one extension for the archs it names, built without looking for a GPU (image and wheel builds
run on machines without one). Run it once after installing so the first call of a server does
not wait for nvcc. The kernel needs sm_90 or newer: a lower ``--arch`` is refused, and archs
below it in an inherited variable are dropped with a line saying so.

Needs nvcc (and pybind11 for ``--extension``), not torch. Exit status 1 when a compile fails, 2
when the arguments or the machine (no nvcc, nothing to build for) are wrong.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from pathlib import Path
from typing import Optional

import click

from kdtree.cli_support import MachineError, UsageError, common_options, run
from kdtree.kernels.jit import (JitError, build_extension, cache_root, capability_of, check_supported, clear_cache,
                                compile_arch, extension_archs, requested)

__all__ = ["DEFAULT_ARCHS", "main", "summarize_sass", "visible_capabilities", "warm_up"]

log = logging.getLogger(__name__)

_OPCODES = ("HMMA", "HGMMA", "UTCHMMA", "UTCQMMA", "LDGSTS", "LDSM", "LDL", "STL")
DEFAULT_ARCHS = ("sm_90a", "sm_120")


def summarize_sass(sass: str) -> dict[str, int]:
    """Count the opcodes that tell the story (tensor-core flavour, async copies, local memory)."""
    counts = Counter(re.findall(r"\b(" + "|".join(_OPCODES) + r")\b", sass))
    return {op: counts.get(op, 0) for op in _OPCODES}


def visible_capabilities() -> list[tuple[int, int]]:
    """The compute capability of each GPU torch sees here (empty without torch or a GPU)."""
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    return [tuple(torch.cuda.get_device_capability(i)) for i in range(torch.cuda.device_count())]


def warm_up(capabilities: list[tuple[int, int]]) -> list[tuple[list[str], Path]]:
    """Build (or find in the cache) the extension each capability loads; (archs, path) per build."""
    built: list[tuple[list[str], Path]] = []
    for cap in capabilities:
        archs = extension_archs(cap)
        if any(archs == done for done, _ in built):
            continue
        built.append((archs, build_extension(archs)))
    return built


def _arch(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    try:
        return tuple(check_supported(v) for v in values)
    except ValueError as exc:
        raise UsageError(f"Invalid value for '--arch': {exc}") from None


def _report(arch: str, sass: bool) -> bool:
    result = compile_arch(arch, sass=sass)
    click.echo(f"== {result.arch}: {'ok' if result.returncode == 0 else 'FAILED'}")
    for line in result.ptxas_log.splitlines():
        if result.returncode != 0 or "ptxas" in line or "error" in line or "spill" in line:
            click.echo("  " + line.strip())
    for record in result.smem_records:
        click.echo(f"  dynamic shared memory {record.kernel}: {record.dynamic_smem_bytes} bytes "
                   f"({record.threads} threads)")
    if sass:
        click.echo(f"  SASS: {summarize_sass(result.sass) if result.sass else 'cuobjdump not found'}")
    return result.returncode == 0


@click.command(help=__doc__.split("\n")[0])
@click.option("--arch", "archs", multiple=True, callback=_arch, metavar="ARCH",
              help="sm_90a, sm_120, ... (repeatable). Report: default sm_90a and sm_120. "
                   "--extension: build for GPUs of these archs instead of the visible ones.")
@click.option("--sass", is_flag=True, help="Also print the opcode summary of the SASS.")
@click.option("--extension", is_flag=True,
              help="Build the extension each GPU loads into the JIT cache (the warm-up), instead of the report.")
@click.option("--clear-cache", "clear", is_flag=True,
              help="Remove every cached build (the extension's and the allocator core's) and exit.")
@common_options
def main(archs: tuple[str, ...], sass: bool, extension: bool, clear: bool) -> None:
    if clear:
        removed, freed = clear_cache()
        click.echo(f"removed {removed} build(s), {freed / 2**20:.1f} MiB, from {cache_root()}")
        return
    try:
        if extension:
            _extension(archs)
            return
        failed = [arch for arch in (archs or DEFAULT_ARCHS) if not _report(arch, sass)]
    except JitError as exc:
        raise MachineError(str(exc).splitlines()[0]) from None
    if failed:
        raise click.exceptions.Exit(1)


def _extension(archs: tuple[str, ...]) -> None:
    req = requested()
    for arch in archs:
        if arch == "sm_90":
            log.info("--arch sm_90: a 9.0 GPU loads the sm_90a build (with the wgmma variant); building that")
    try:
        if req is not None and not archs:  # the variable names the GPUs: no need to see one
            built = [(list(req.archs), build_extension(req.archs))]
        else:
            capabilities = sorted({capability_of(a) for a in archs}) if archs else visible_capabilities()
            if not capabilities:
                raise MachineError("no CUDA GPU is visible here, so there is nothing to build for: name the GPUs' "
                                   "archs with --arch (e.g. --arch sm_90a --arch sm_120) or KDTREE_CUDA_ARCHS")
            built = warm_up(capabilities)
    except JitError as exc:
        if "failed:" not in str(exc):
            raise
        raise click.ClickException(str(exc)) from None  # exit 1; the compiler's output is the message
    for built_archs, path in built:
        click.echo(f"extension ({', '.join(built_archs)}): {path}")


def _main(args: Optional[list[str]] = None) -> None:
    run(main, args, prog_name="python -m kdtree.kernels.build")


if __name__ == "__main__":
    _main()
