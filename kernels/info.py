"""What the kernel would do on this machine: toolkit, archs, cache, each GPU's variant, the SGLang plugin.

    python -m kdtree.kernels.info

Prints, without building anything: the CUDA toolkit found (`kdtree.cuda_toolkit`), the archs
the JIT builds and where they come from ($KDTREE_CUDA_ARCHS, $TORCH_CUDA_ARCH_LIST or the GPU in
use), the cache folder and whether each GPU's extension is in it, the kernel variants each
visible GPU dispatches by tree size, and whether the SGLang plugin is installed and enabled.
Works without torch or a GPU (it says so). Exit status 0; 2 for a configuration that cannot work
(an arch variable naming no arch a visible GPU runs, or naming no arch at all).
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass, field
from typing import Optional

import click

from kdtree import __version__, cuda_toolkit, envvars
from kdtree.cli_support import UsageError, common_options, run
from kdtree.kernels import jit

__all__ = ["GpuInfo", "PluginInfo", "dispatch_ranges", "gpus", "main", "plugin_info"]

PLUGIN_GROUP = "sglang.srt.plugins"
PLUGIN_NAME = "kdtree"
_MAX_ROWS = 1024  # rows per request the dispatch is described up to (T_b's supported maximum)


def dispatch_ranges(capability: tuple[int, int]) -> list[tuple[int, int, str]]:
    """(first, last, variant) rows-per-request ranges of the default dispatch on a device."""
    from kdtree.kernels.launch_plan import choose_variant, variant_name  # noqa: PLC0415 - needs torch

    ranges: list[tuple[int, int, str]] = []
    for rows in range(1, _MAX_ROWS + 1):
        name = variant_name(choose_variant(rows, capability))
        if ranges and ranges[-1][2] == name:
            ranges[-1] = (ranges[-1][0], rows, name)
        else:
            ranges.append((rows, rows, name))
    return ranges


@dataclass
class GpuInfo:
    """One visible GPU: what it loads and runs."""

    index: int
    name: str
    capability: tuple[int, int]
    archs: list[str] = field(default_factory=list)  # the extension it loads; empty with `problem`
    extension: Optional[str] = None  # the cached .so, None when not built yet
    problem: Optional[str] = None  # why it cannot run the kernel


def gpus() -> tuple[list[GpuInfo], Optional[str]]:
    """The visible GPUs, or an empty list and why there are none."""
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        return [], "torch is not installed"
    if not torch.cuda.is_available():
        return [], "torch.cuda.is_available() is False"
    found = []
    for index in range(torch.cuda.device_count()):
        cap = tuple(torch.cuda.get_device_capability(index))
        gpu = GpuInfo(index, torch.cuda.get_device_name(index), cap)  # type: ignore[arg-type]
        if cap < jit.MIN_CAPABILITY:
            gpu.problem = jit.unsupported_reason(f"sm_{cap[0]}{cap[1]}")
        else:
            try:
                gpu.archs = jit.extension_archs(cap)  # type: ignore[arg-type]
                path = jit.extension_path(gpu.archs)
                gpu.extension = str(path) if path.exists() else None
            except jit.JitError as exc:
                gpu.problem = str(exc).splitlines()[0]
        found.append(gpu)
    return found, None


@dataclass
class PluginInfo:
    """The SGLang plugin as SGLang would see it."""

    entry_point: Optional[str]  # "kdtree = module:function", None when not installed
    sglang_version: Optional[str]
    disabled_by_env: bool  # KDTREE_SGLANG=0

    @property
    def enabled(self) -> bool:
        return self.entry_point is not None and self.sglang_version is not None and not self.disabled_by_env


def plugin_info() -> PluginInfo:
    """Whether the ``sglang.srt.plugins`` entry point is installed, SGLang is, and KDTREE_SGLANG allows it."""
    entry = next((ep for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP) if ep.name == PLUGIN_NAME), None)
    try:
        sglang_version: Optional[str] = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        sglang_version = None
    return PluginInfo(entry_point=f"{entry.name} = {entry.value}" if entry else None,
                      sglang_version=sglang_version,
                      disabled_by_env=envvars.KDTREE_SGLANG.is_off())


def _toolkit_lines() -> list[str]:
    tk = cuda_toolkit.locate()
    if tk.nvcc is None:
        return ["CUDA toolkit: nvcc not found (set CUDA_HOME, or put the toolkit's bin/ on PATH); "
                "the kernel cannot be built here"]
    return [f"CUDA toolkit: {tk.home} (nvcc {tk.version or '?'}: {tk.nvcc})",
            f"  compute-sanitizer: {tk.compute_sanitizer or 'not found'}; cuobjdump: {tk.cuobjdump or 'not found'}"]


def _arch_lines() -> list[str]:
    requested = jit.requested()
    if requested is None:
        return ["archs: each GPU's own (9.0 -> sm_90a), with its PTX; "
                f"set {' or '.join(jit.ARCH_VARIABLES)} to choose"]
    return [f"archs: {requested.describe()}, PTX for {jit.ptx_arch(requested.archs)}"]


def _cache_lines() -> list[str]:
    root = jit.cache_root()
    source = ("KDTREE_CACHE_DIR" if envvars.KDTREE_CACHE_DIR.get()
              else "XDG_CACHE_HOME" if envvars.XDG_CACHE_HOME.get() else "default")
    builds = jit.cached_builds(root)
    return [f"cache: {root} ({source}; {len(builds)} build(s) in it; "
            "python -m kdtree.kernels.build --clear-cache empties it)"]


def _gpu_lines() -> list[str]:
    found, why = gpus()
    if not found:
        return [f"GPUs: none visible ({why})"]
    lines = ["GPUs:"]
    for gpu in found:
        major, minor = gpu.capability
        lines.append(f"  cuda:{gpu.index} {gpu.name} (sm_{major}{minor})")
        if gpu.problem:
            lines.append(f"    cannot run the kernel: {gpu.problem}")
            continue
        lines.append(f"    extension: {', '.join(gpu.archs)}: {gpu.extension or 'not built yet (python -m kdtree.kernels.build --extension)'}")
        from kdtree.kernels.launch_plan import runnable_variants  # noqa: PLC0415 - needs torch

        lines.append(f"    variants: {', '.join(runnable_variants(gpu.capability))}; default dispatch: "
                     + ", ".join(f"{lo}-{hi} rows/request {name}" for lo, hi, name in dispatch_ranges(gpu.capability)))
    return lines


def _plugin_lines() -> list[str]:
    plugin = plugin_info()
    installed = f"installed ({plugin.entry_point})" if plugin.entry_point else "not installed (pip install '.[sglang]')"
    sglang = f"sglang {plugin.sglang_version}" if plugin.sglang_version else "sglang not installed"
    state = ("enabled: --attention-backend triton runs MLA target verify on the kernel" if plugin.enabled
             else "disabled (KDTREE_SGLANG=0)" if plugin.disabled_by_env else "inactive")
    return [f"SGLang plugin: {installed}; {sglang}; {state}"]


def report() -> list[str]:
    """The lines `python -m kdtree.kernels.info` prints."""
    try:
        return [f"kdtree-engine {__version__}", *_toolkit_lines(), *_arch_lines(), *_cache_lines(),
                *_gpu_lines(), *_plugin_lines()]
    except jit.JitError as exc:
        raise UsageError(str(exc).splitlines()[0]) from None


@click.command(help=__doc__.split("\n")[0])
@common_options
def main() -> None:
    for line in report():
        click.echo(line)


if __name__ == "__main__":
    run(main, prog_name="python -m kdtree.kernels.info")
