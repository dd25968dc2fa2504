"""Benchmark of the tree-verify implementations on a GPU, against the measured roofline.

    python -m kdtree.tools.bench [--quick] [--impl cuda --impl triton ...] [--layout both]
                                 [--pool-gb 8] [--out plans/results/phase1] [--filter REGEX]
                                 [--flush read|write] [--variant ws] [--splits 8]

One run measures the copy bandwidth and the bf16 matmul rate, allocates one pool of random bf16
latent rows (8 GB by default), then for every shape of the grid (`roofline.grid`) and layout
(slots scattered over the pool, or one contiguous range) times each implementation on fresh
random trees (`kdtree.bench.cases`), rotating over a few input sets, candidates interleaved.
Every call is timed by the tools' queued timer (`kdtree.bench.timing`: L2 wiped, GPU busy-wait
lead, so the events measure GPU time with a cold L2, not host launch overhead); the host time
each call took to return is kept per row as ``host_us``. Outputs are checked against each other
(rel-L2 against naive, else cuda) before their times count. A call that would take over 2 s is
left out. ``--variant`` / ``--splits`` force the CUDA kernel's variant and KV split count.
Writes bench.json (rows + machine facts), bench.md and two PNGs into --out (`bench_report`).

The measurement is `kdtree.bench.grid` (`bench_grid`, `bench_config`, `run`); this module parses
the arguments and writes the report. Nothing here touches CUDA at import time.
"""

from __future__ import annotations

import re
import sys

import click

from kdtree.bench.cases import LAYOUTS
from kdtree.bench.grid import IMPLEMENTATIONS, bench_grid, run
from kdtree.bench.timing import FLUSH_MODES
from kdtree.cli_support import UsageError, common_options
from kdtree.kernels import cli
from kdtree.kernels.launch_plan import VARIANTS
from kdtree.tools.bench_report import write_report


DEFAULT_OUT = "plans/results/phase1"


# ---------------------------------------------------------------- inputs


# ---------------------------------------------------------------- measuring


# ---------------------------------------------------------------- machine facts


# ---------------------------------------------------------------- driver


@click.command(context_settings=cli.CONTEXT, help=__doc__.split("\n")[0])
@click.option("--impl", "impls", multiple=True, type=click.Choice(list(IMPLEMENTATIONS)),
              help="implementation to time (repeatable; default: all)")
@click.option("--quick", is_flag=True, help="the small subset (speedup gate, smoke tests)")
@click.option("--layout", type=click.Choice([*LAYOUTS, "both"]), default="scattered", show_default=True)
@click.option("--pool-gb", type=cli.POSITIVE_FLOAT, default=8.0, show_default=True,
              help="size of the latent pool in GiB")
@click.option("--out", default=DEFAULT_OUT, show_default=True, help="output folder")
@click.option("--filter", "shape_filter", help="regex on the shape label, e.g. 'H64 T16' or 'L128k'")
@click.option("--budget-s", type=cli.POSITIVE_FLOAT, default=480.0, show_default=True,
              help="start no new config after this many seconds (the device lease is short)")
@click.option("--flush", type=click.Choice(FLUSH_MODES), default="read", show_default=True,
              help="how the L2 is wiped before each timed call (read: leaves it clean)")
@click.option("--variant", type=click.Choice(sorted(VARIANTS)), help="force the CUDA kernel's variant")
@click.option("--splits", type=cli.POSITIVE_INT, help="force the CUDA kernel's KV split count")
@common_options
def command(impls, quick, layout, pool_gb, out, shape_filter, budget_s, flush, variant, splits) -> int:
    if shape_filter:
        try:
            re.compile(shape_filter)
        except re.error as exc:
            raise click.BadParameter(f"{shape_filter!r} is not a regular expression: {exc}",
                                     param_hint="--filter") from None
    cli.require_cuda("kdtree.tools.bench", "the benchmark times GPU kernels: nothing was measured")
    shapes = bench_grid(quick)
    if shape_filter:
        shapes = [s for s in shapes if re.search(shape_filter, s.label)]
    if not shapes:
        raise UsageError(f"--filter {shape_filter!r} matches no shape")
    layouts = list(LAYOUTS) if layout == "both" else [layout]
    rows, facts = run(list(impls) or list(IMPLEMENTATIONS), shapes, layouts, pool_gb, budget_s, cli.invoked_argv(),
                      flush_mode=flush, variant=variant, num_splits=splits)
    for path in write_report(rows, facts, out):
        click.echo(f"wrote {path}")
    return 0


main = cli.program(command, "python -m kdtree.tools.bench")

if __name__ == "__main__":
    sys.exit(main())
