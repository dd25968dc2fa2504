"""The tools' timing, on the gates' queued timer (`kdtree.gates.timing.QueuedTimer`), so the
benchmark, devcheck, kernel_times and the speed gates measure the same way:

every timed call is queued behind an L2 wipe (a read of twice the L2, leaving no dirty lines;
``flush_mode="write"`` zeroes instead) and a GPU busy-wait of `LEAD_S`, so the host enqueues it
while the GPU is busy and the events measure its GPU time with a cold L2, not its launch
overhead; the host time the call took to return is kept apart (``host_seconds``).

`gpu_timer` builds that timer (a `HostTimer` off CUDA, for CPU runs and tests),
`time_round_robin` times several implementations interleaved, `measure_ceilings` the copy
bandwidth and bf16 matmul rate the roofline needs.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

from kdtree.gates.timing import QueuedTimer, l2_flush_bytes

LEAD_S = 200e-6  # GPU busy-wait queued before every timed call: longer than any launch path's host time


class HostTimer:
    """``timer(fn) -> seconds`` by perf_counter, with a QueuedTimer's ``host_seconds`` / ``label``:
    the stand-in off CUDA, where calls are synchronous."""

    label = "perf_counter"

    def __init__(self):
        self.host_seconds: list[float] = []
        self.overruns = 0
        self.lead_s = 0.0

    def __call__(self, fn: Callable[[], Any]) -> float:
        t0 = time.perf_counter()
        fn()
        seconds = time.perf_counter() - t0
        self.host_seconds.append(seconds)
        return seconds


def gpu_timer(device="cuda", flush_mode: str = "read", lead_s: float = LEAD_S):
    """The tools' timer for ``device``: a `QueuedTimer` (L2 wipe of twice the L2, busy-wait lead)
    on CUDA, a `HostTimer` elsewhere."""
    import torch  # noqa: PLC0415

    if torch.device(device).type != "cuda":
        return HostTimer()
    return QueuedTimer(flush_bytes=l2_flush_bytes(device), lead_s=lead_s, flush_mode=flush_mode)


def time_round_robin(calls: dict[str, Callable[[int], Any]], reps: dict[str, int], timer) -> tuple[dict, dict]:
    """Seconds per call of each ``calls[name](r)`` (r = repetition index), interleaved: round r
    runs every implementation with ``reps[name] > r``, so candidates and baselines share the same
    clocks and thermal state. Returns ``(gpu, host)``: per name, the timer's seconds of each call
    and the host seconds it took to return."""
    gpu: dict[str, list[float]] = {name: [] for name in calls}
    host: dict[str, list[float]] = {name: [] for name in calls}
    for r in range(max(reps.values(), default=0)):
        for name, call in calls.items():
            if r < reps[name]:
                gpu[name].append(float(timer(lambda: call(r))))
                host[name].append(float(timer.host_seconds[-1]))
    return gpu, host


def measure_ceilings(device="cuda", copy_bytes: int = 2 * 2**30, matmul_n: int = 8192,
                     reps: int = 10) -> tuple[float, float]:
    """(copy bandwidth in bytes/s, bf16 matmul rate in FLOP/s), medians of queued timings.

    Bandwidth counts bytes read + written by a large device-to-device copy; the rate is an
    n^3 ``torch.matmul`` of random bf16 matrices."""
    import torch  # noqa: PLC0415

    timer = QueuedTimer(lead_s=LEAD_S)
    src = torch.ones(copy_bytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    bw = 2 * copy_bytes / statistics.median(timer(lambda: dst.copy_(src)) for _ in range(reps))
    del src, dst
    a = torch.randn(matmul_n, matmul_n, dtype=torch.bfloat16, device=device)
    b = torch.randn(matmul_n, matmul_n, dtype=torch.bfloat16, device=device)
    for _ in range(3):
        torch.matmul(a, b)
    rate = 2 * matmul_n**3 / statistics.median(timer(lambda: torch.matmul(a, b)) for _ in range(reps))
    return bw, rate
