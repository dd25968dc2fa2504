"""What an mma.sync design can reach on this GPU: the second roofline of phase 1's sm_120 path.

Builds `bench/microbench/mma_sync_ceiling.cu` for the visible device with nvcc and runs it: the
m16n8k16 bf16 MMA rate with operands in registers, the ldmatrix rate from shared memory, and the
MMA rate when each MMA needs B bytes of ldmatrix operands. Needs nvcc and a CUDA GPU; no torch.
`python -m kdtree.tools.mma_ceiling` is its command line.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from kdtree.kernels.jit import JitError, find_nvcc

__all__ = ["SOURCE", "build", "device_arch", "measure"]

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
    """Compile the microbenchmark for `arch` into `workdir`; the executable's path."""
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
