"""Measure what an mma.sync design can reach on this GPU (the second roofline of phase 1).

    python -m kdtree.tools.mma_ceiling [--out DIR] [--iters N]

Builds `bench/microbench/mma_sync_ceiling.cu` (`kdtree.bench.mma_ceiling`) for the visible device and runs it:
the m16n8k16 bf16 MMA rate with operands in registers, the ldmatrix rate from shared memory,
and the MMA rate when each MMA needs B bytes of ldmatrix operands. Prints a table and writes
mma_ceiling.json into --out. Needs nvcc and a CUDA GPU (without them: a message, exit 2); no torch.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from kdtree.bench.mma_ceiling import measure
from kdtree.cli_support import MachineError, common_options
from kdtree.kernels import cli
from kdtree.kernels.jit import JitError


def format_table(rows: list[dict]) -> str:
    head = rows[0]
    lines = [f"{head['device']} (sm_{head['sm']}, {head['sms']} SMs)",
             "warps/SM | smem B per MMA | SM GHz | TFLOP/s | MMA/clk/SM | ldmatrix B/clk/SM"]
    for r in rows[1:]:
        per = "ldmatrix only" if not r["mma"] else str(r["ldsm_bytes_per_mma"])
        lines.append(f"{r['warps_per_sm']:>8} | {per:>14} | {r['sm_clock_ghz']:6.3f} | {r['tflops']:7.1f} | "
                     f"{r['mma_per_clk_per_sm']:10.3f} | {r['ldsm_bytes_per_clk_per_sm']:17.1f}")
    return "\n".join(lines)


@click.command(context_settings=cli.CONTEXT, help=__doc__.splitlines()[0])
@click.option("--out", default=lambda: os.environ.get("OUT", "."), show_default="$OUT or .")
@click.option("--iters", type=cli.POSITIVE_INT, default=20000, show_default=True)
@common_options
def command(out: str, iters: int) -> int:
    try:
        rows = measure(iters)
    except (JitError, RuntimeError) as exc:
        raise MachineError(f"kdtree.tools.mma_ceiling: {exc}") from None
    click.echo(format_table(rows))
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "mma_ceiling.json").write_text(json.dumps(rows, indent=1))
    return 0


main = cli.program(command, "python -m kdtree.tools.mma_ceiling")

if __name__ == "__main__":
    sys.exit(main())
