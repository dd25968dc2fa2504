"""Per-kernel GPU time of one op call, from CUPTI (torch.profiler): the main kernel and the
split-combine pass apart, for each shape and each forced split count.

    python -m kdtree.tools.kernel_times --configs "8,16,1,32768;64,4,1,32768" [--splits auto,8,33]
                                        [--variant ws] [--reps 20]

Each config gets one random case (scattered slots in a pool of its own); every call is queued
behind an L2 wipe and a GPU busy-wait by the tools' timer (`kdtree.bench.timing`), as in the
benchmark, so kernel durations are neither helped by a warm L2 nor stretched by the host. Prints,
per config and split count, the median microseconds of every CUDA kernel the call launched and
their sum, next to the roofline floor (copy bandwidth and matmul rate measured in the same run).
GPU only.
"""

from __future__ import annotations

import os
import statistics
import sys

import click
import torch

from kdtree.bench.cases import call, make_case
from kdtree.bench.forced import forced_kernel
from kdtree.bench.kernel_check import parse_configs
from kdtree.bench.kernel_profile import kernel_times
from kdtree.bench.roofline import Shape, floor_seconds
from kdtree.bench.timing import make_timer, measure_ceilings
from kdtree.cli_support import common_options
from kdtree.kernels import cli
from kdtree.kernels.launch_plan import VARIANTS


def short_name(name: str) -> str:
    """The kernel's name without namespace and template noise."""
    base = name.split("(")[0].split("<")[0]
    return base.rsplit("::", 1)[-1] or name[:40]


def parse_split_list(text: str) -> list:
    """'auto,8,33' -> [None, 8, 33] (None: the launch plan's own choice)."""
    return [None if s.strip() == "auto" else cli.positive_int(s.strip()) for s in text.split(",") if s.strip()]


@click.command(context_settings=cli.CONTEXT, help=__doc__.split("\n\n")[0])
@click.option("--configs", required=True, type=cli.Parsed(parse_configs, "H,T,B,L;..."), help="'H,T,B,L;...'")
@click.option("--splits", type=cli.Parsed(parse_split_list, "auto,N,..."), default="auto", show_default=True,
              help="comma list of split counts, 'auto' = the launch plan's")
@click.option("--variant", type=click.Choice(sorted(VARIANTS)), help="force the kernel variant")
@click.option("--reps", type=cli.POSITIVE_INT, default=20, show_default=True)
@common_options
def command(configs, splits, variant, reps) -> int:
    cli.require_cuda("kdtree.tools.kernel_times", "it times the kernel's launches with the CUDA profiler")
    bw, rate = measure_ceilings()
    timer = make_timer()
    click.echo(f"{torch.cuda.get_device_name()}: copy {bw / 1e9:.0f} GB/s, bf16 matmul {rate / 1e12:.0f} TFLOP/s")
    for H, T, B, L in configs:
        case = make_case(H, [(T, L)] * B, "random", int.from_bytes(os.urandom(4), "little"), pool_slots=4 * B * (L + T))
        floor_us = floor_seconds(Shape(H, T, B, L), bw, rate) * 1e6
        for n_splits in splits:
            fn = forced_kernel(variant, n_splits)
            times = kernel_times(lambda: call(fn, case), reps, timer)
            parts = {short_name(k): statistics.median(v) for k, v in times.items()}
            total = sum(parts.values())
            desc = ", ".join(f"{k} {v:.1f}" for k, v in parts.items())
            print(f"H{H} T{T} B{B} L{L} splits={n_splits or 'auto'}: floor {floor_us:.1f} us | kernels {total:.1f} us "
                  f"({floor_us / total:.2f} of the floor) = {desc}", flush=True)
    return 0


main = cli.program(command, "python -m kdtree.tools.kernel_times")

if __name__ == "__main__":
    sys.exit(main())
