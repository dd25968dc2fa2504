"""Where one verify step spends its time: wall time with the device synchronised around it, host
time (the call returning, no synchronisation inside), the GPU's busy time (the sum of the step's
kernel durations, from torch.profiler), the launch count and the host operators that cost the
most (`kdtree.tools.step_profile` prints them).
"""

from __future__ import annotations

import statistics
import time


def profile_step(setup, name: str, repeats: int = 10, top: int = 15) -> dict:
    """Wall, host and GPU-busy milliseconds of `setup.step(name)`, the launch count and the top
    host operators by self CPU time."""
    import torch  # noqa: PLC0415
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    dev = setup.pool.kv[0].device
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    for _ in range(3):
        setup.step(name)
    sync()
    walls, hosts = [], []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        setup.step(name)
        t1 = time.perf_counter()
        sync()
        walls.append(time.perf_counter() - t0)
        hosts.append(t1 - t0)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=activities) as prof:
        setup.step(name)
        sync()
    events = prof.key_averages()
    gpu_us = sum(getattr(e, "self_device_time_total", 0.0) or 0.0 for e in events)
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC",
                                                          "cuLaunchKernelEx"))
    ops = sorted((e for e in events if not e.key.startswith("cuda") and not e.key.startswith("cu")),
                 key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return {
        "wall_ms": statistics.median(walls) * 1e3,
        "host_ms": statistics.median(hosts) * 1e3,
        "gpu_busy_ms": gpu_us / 1e3,
        "launches": launches,
        "top_host_ops": [{"op": e.key, "calls": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3}
                         for e in ops],
    }
