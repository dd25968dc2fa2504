"""A small driver for compute-sanitizer: every kernel variant on small shapes, checked.

    compute-sanitizer --tool memcheck python -m kdtree.tools.sanitize_driver

What it runs is `kdtree.bench.sanitize_cases`: every variant the device runs, forced through its
plan, with the plan's split count and with a forced one, against the oracle on the host; it
prints `DONE_MARKER` last, so a run that dies early can never pass as clean. Exit status 1 if
any output is wrong.
"""

from __future__ import annotations

import sys

import click

from kdtree.bench.sanitize_cases import check_every_variant
from kdtree.cli_support import common_options
from kdtree.kernels import cli


@click.command(context_settings=cli.CONTEXT, help=__doc__.splitlines()[0])
@common_options
def command() -> int:
    cli.require_cuda("kdtree.tools.sanitize_driver", "it launches every kernel variant")
    bad = check_every_variant(lambda line: print(line, flush=True))
    return 1 if bad else 0


main = cli.program(command, "python -m kdtree.tools.sanitize_driver")

if __name__ == "__main__":
    sys.exit(main())
