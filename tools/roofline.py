"""Bytes, FLOPs and the two floors of every shape of the benchmark grid (docs/design.md section 3b).

    python -m kdtree.tools.roofline --bw 4.244e12 --flops 7.88e14 [--quick]

prints, per shape of the benchmark grid, the bytes, the FLOPs, both times and which one bounds
(the counts are `kdtree.bench.roofline`'s).
"""

from __future__ import annotations

import sys

import click

from kdtree.bench.roofline import H200_BF16_FLOPS_PER_S, H200_COPY_BYTES_PER_S, grid, markdown_table
from kdtree.cli_support import common_options
from kdtree.kernels import cli


@click.command(context_settings=cli.CONTEXT, help=__doc__.split("\n")[0])
@click.option("--bw", type=cli.POSITIVE_FLOAT, default=H200_COPY_BYTES_PER_S, show_default=True,
              help="copy bandwidth, bytes/s (> 0)")
@click.option("--flops", type=cli.POSITIVE_FLOAT, default=H200_BF16_FLOPS_PER_S, show_default=True,
              help="bf16 matmul rate, FLOP/s (> 0)")
@click.option("--quick", is_flag=True, help="the quick subset of the grid")
@common_options
def command(bw: float, flops: float, quick: bool) -> int:
    click.echo(markdown_table(grid(quick), bw, flops))
    return 0


main = cli.program(command, "python -m kdtree.tools.roofline")

if __name__ == "__main__":
    sys.exit(main())
