"""Measure what an mma.sync design can reach on this GPU (the second roofline of phase 1).

    python -m kdtree.tools.mma_ceiling [--out DIR] [--iters N]

Builds `tools/microbench/mma_sync_ceiling.cu` for the visible device with nvcc and runs it:
the m16n8k16 bf16 MMA rate with operands in registers, the ldmatrix rate from shared memory,
and the MMA rate when each MMA needs B bytes of ldmatrix operands. Prints a table and writes
mma_ceiling.json into --out. Needs nvcc and a CUDA GPU (without them: a message, exit 2); no torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import click

from kdtree.cli_support import MachineError, common_options
from kdtree.kernels import cli
from kdtree.kernels.jit import JitError, find_nvcc

SOURCE = Path(__file__).resolve().parent / "microbench" / "mma_sync_ceiling.cu"


def device_arch() -> str:
    """sm_XY of device 0, from nvidia-smi (no torch needed)."""
    try:
        cap = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, check=True).stdout.split()[0]
    except (OSError, subprocess.CalledProcessError, IndexError) as exc:
        raise JitError(f"no CUDA GPU is visible (nvidia-smi: {exc}); this measurement needs one") from exc
    return "sm_" + cap.replace(".", "")


def build(arch: str, workdir: Path) -> Path:
    exe = workdir / f"mma_sync_ceiling_{arch}"
    cmd = [find_nvcc(), "-O3", f"-arch={arch}", "-o", str(exe), str(SOURCE)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise JitError("nvcc failed on the ceiling benchmark:\n" + " ".join(cmd) + "\n" + done.stderr)
    return exe


def measure(iters: int = 20000) -> list[dict]:
    """Build and run the microbenchmark; its JSON lines as dicts (the first is the device)."""
    with tempfile.TemporaryDirectory(prefix="kdtree-ceiling-") as tmp:
        exe = build(device_arch(), Path(tmp))
        done = subprocess.run([str(exe), str(iters)], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"the ceiling benchmark failed (exit {done.returncode}):\n{done.stderr}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


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
