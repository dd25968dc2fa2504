"""Host time of one `tree_verify_mla` call without a GPU: ``python -m kdtree.tools.host_path_bench``.

Times the pure-Python part of `kdtree.kernels.cuda_op.launch` — validation (shape,
dtype, device checks; the index-value checks stay off, as they do for CUDA inputs outside debug
mode), the launch plan and the argument tuple — on CPU tensors, with a fake extension, stream and
device facts. Not timed: the CUDA-only lookups a real call adds (`q.is_cuda`, the per-device
state, the current-device check, the raw stream), each a single dict lookup or C call.
"""

from __future__ import annotations

import sys
import time

import click
import torch

from kdtree.bench.cases import case_args, make_case
from kdtree.cli_support import common_options
from kdtree.kernels import cli, cuda_op
from kdtree.kernels.contract import LATENT_DIM, validate


class FakeExtension:
    """Stands in for the compiled extension: `run` takes the launch arguments and does nothing."""

    def run(self, *args) -> None:
        pass


def fake_state(sm_count: int = 132, capability: tuple[int, int] = (9, 0)) -> cuda_op.DeviceState:
    """A `DeviceState` for CPU runs: fake extension, stream 0, made-up workspace pointers."""
    return cuda_op.DeviceState(index=0, sm_count=sm_count, capability=capability, ext=FakeExtension(),
                               workspace_ptrs=(0x1000, 0x2000), stream=lambda index: 0)


def host_call(case: dict, state: cuda_op.DeviceState, out=None, lse=None) -> torch.Tensor:
    """What `cuda_op.launch` does on the host, for CPU tensors; returns `out`."""
    q = case["q"]
    problem = validate(q, case["kv_cache"], case["qo_indptr"], case["kv_indptr"], case["kv_indices"],
                       case["tree_mask"], case["sm_scale"], out, lse, check_values=False)
    if out is None:
        out = torch.empty(problem.num_rows, problem.num_heads, LATENT_DIM, dtype=q.dtype, device=q.device)
    state.ext.run(cuda_op.launch_args(problem, q, case["kv_cache"], case["qo_indptr"], case["kv_indptr"],
                                       case["kv_indices"], case["tree_mask"], case["sm_scale"], out, lse,
                                       state))
    return out


def time_calls(fn, calls: int, repeats: int = 5) -> float:
    """Best of `repeats` runs of `calls` calls of fn(), in microseconds per call."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


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
