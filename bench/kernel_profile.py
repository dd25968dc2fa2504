"""Per-kernel GPU time of one op call from CUPTI (torch.profiler): every CUDA kernel of the project
that a call launches (the main kernel and the split-combine pass apart), each call queued by the
timer it is given. `kdtree.tools.kernel_times` is its command line.
"""

from __future__ import annotations

from collections import defaultdict

import torch


def kernel_times(fn, reps: int, timer) -> dict[str, list[float]]:
    """Microseconds per launch of each of the project's CUDA kernels (namespace kdtree) that `fn`
    runs, over `reps` calls, each queued by ``timer``."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(reps):
            timer(fn)
        torch.cuda.synchronize()
    times: dict[str, list[float]] = defaultdict(list)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and "kdtree" in ev.name:
            times[ev.name].append(ev.time_range.end - ev.time_range.start)
    return times
