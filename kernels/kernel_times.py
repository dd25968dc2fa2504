"""Per-kernel GPU time of one op call, from CUPTI (torch.profiler): the main kernel and the
split-combine pass apart, for each shape and each forced split count.

    python -m kdtree.kernels.kernel_times --configs "8,16,1,32768;64,4,1,32768" [--splits auto,8,33]

Each config gets one random case (scattered slots in a pool of its own); every call is queued
behind an L2 wipe and a GPU busy-wait, as in the benchmark, so kernel durations are neither
helped by a warm L2 nor stretched by the host. Prints, per config and split count, the median microseconds of every CUDA kernel the
call launched and their sum, next to the roofline floor (copy bandwidth and matmul rate measured
in the same run). GPU only.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections import defaultdict

import torch

from kdtree.kernels.bench import busy_wait, l2_flush, measure_ceilings
from kdtree.kernels.cases import call, make_case
from kdtree.kernels.devcheck import parse_configs, restore_env
from kdtree.kernels.roofline import Shape, floor_seconds


def kernel_times(fn, reps: int, flush=None) -> dict[str, list[float]]:
    """Microseconds per launch of each of the project's CUDA kernels (namespace kdtree) that `fn`
    runs, over `reps` calls."""
    lead = busy_wait()
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(reps):
            if flush is not None:
                flush()
            if lead is not None:
                lead()
            fn()
        torch.cuda.synchronize()
    times: dict[str, list[float]] = defaultdict(list)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and "kdtree" in ev.name:
            times[ev.name].append(ev.time_range.end - ev.time_range.start)
    return times


def short_name(name: str) -> str:
    """The kernel's name without namespace and template noise."""
    base = name.split("(")[0].split("<")[0]
    return base.rsplit("::", 1)[-1] or name[:40]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", required=True, help="'H,T,B,L;...'")
    ap.add_argument("--splits", default="auto", help="comma list of split counts, 'auto' = the launch plan's")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("kernel_times needs a CUDA GPU: torch.cuda.is_available() is False")
    from kdtree.kernels import tree_verify_mla  # noqa: PLC0415

    bw, rate = measure_ceilings()
    flush = l2_flush(torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda"))
    forced = os.environ.get("KDTREE_SPLITS")
    print(f"{torch.cuda.get_device_name()}: copy {bw / 1e9:.0f} GB/s, bf16 matmul {rate / 1e12:.0f} TFLOP/s")
    for H, T, B, L in parse_configs(args.configs):
        case = make_case(H, [(T, L)] * B, "random", int.from_bytes(os.urandom(4), "little"), pool_slots=4 * B * (L + T))
        floor_us = floor_seconds(Shape(H, T, B, L), bw, rate) * 1e6
        for s in args.splits.split(","):
            if s == "auto":
                os.environ.pop("KDTREE_SPLITS", None)
            else:
                os.environ["KDTREE_SPLITS"] = s
            times = kernel_times(lambda: call(tree_verify_mla, case), args.reps, flush=flush)
            parts = {short_name(k): statistics.median(v) for k, v in times.items()}
            total = sum(parts.values())
            desc = ", ".join(f"{k} {v:.1f}" for k, v in parts.items())
            print(f"H{H} T{T} B{B} L{L} splits={s}: floor {floor_us:.1f} us | kernels {total:.1f} us "
                  f"({floor_us / total:.2f} of the floor) = {desc}", flush=True)
    restore_env("KDTREE_SPLITS", forced)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
