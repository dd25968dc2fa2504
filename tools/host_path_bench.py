"""Host time of one `tree_verify_mla` call without a GPU: ``python -m kdtree.tools.host_path_bench``.

Times (`kdtree.bench.host_path`) the pure-Python part of `kdtree.kernels.cuda_op.launch` — validation (shape,
dtype, device checks; the index-value checks stay off, as they do for CUDA inputs outside debug
mode), the launch plan and the argument tuple — on CPU tensors, with a fake extension, stream and
device facts. Not timed: the CUDA-only lookups a real call adds (`q.is_cuda`, the per-device
state, the current-device check, the raw stream), each a single dict lookup or C call.
"""

from __future__ import annotations

import sys

import click
import torch

from kdtree.bench.cases import case_args, make_case
from kdtree.bench.host_path import fake_state, host_call, time_calls
from kdtree.cli_support import common_options
from kdtree.kernels import cli, cuda_op
from kdtree.kernels.contract import LATENT_DIM, validate


@click.command(context_settings=cli.CONTEXT, help=__doc__.splitlines()[0])
@click.option("--calls", type=cli.POSITIVE_INT, default=10_000, show_default=True)
@click.option("--heads", type=cli.POSITIVE_INT, default=8, show_default=True)
@click.option("--tree", type=cli.POSITIVE_INT, default=16, show_default=True, help="T_b of every request")
@click.option("--batch", type=cli.POSITIVE_INT, default=1, show_default=True)
@click.option("--prefix", type=click.IntRange(0), default=4096, show_default=True, help="L_b of every request")
@common_options
def command(calls: int, heads: int, tree: int, batch: int, prefix: int) -> int:
    case = make_case(heads, [(tree, prefix)] * batch, "random", 1, device="cpu")
    nq = tree * batch
    out = torch.empty(nq, heads, LATENT_DIM, dtype=torch.bfloat16)
    lse = torch.empty(nq, heads)
    state = fake_state()

    def plan_miss():
        cuda_op._plans.clear()
        host_call(case, state, out, lse)

    rows = [("out and lse given", lambda: host_call(case, state, out, lse)),
            ("out allocated", lambda: host_call(case, state)),
            ("out given, plan cache miss", plan_miss),
            ("validate only", lambda: validate(*case_args(case), out, lse, check_values=False))]
    click.echo(f"H={heads} T={tree} B={batch} L={prefix}, best of 5 x {calls} calls")
    for name, fn in rows:
        click.echo(f"{time_calls(fn, calls):8.2f} us/call  {name}")
    return 0


main = cli.program(command, "python -m kdtree.tools.host_path_bench")

if __name__ == "__main__":
    sys.exit(main())
