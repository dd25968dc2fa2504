"""The kernel on scattered against contiguous slots: the same shapes and values, two slot layouts
(`kdtree.bench.cases.uniform_case`), timed interleaved."""

from __future__ import annotations

import statistics
from typing import Any, Callable

from kdtree.bench.cases import case_args, uniform_case
from kdtree.bench.timing import Timer, round_robin

LAYOUT_PAIR = ("scattered", "contiguous")


def time_layouts(op: Callable, H: int, T: int, B: int, L: int, pool: Any, seed: int, timer: Timer, *,
                 input_sets: int = 3, repeats: int = 30) -> dict[str, Any]:
    """``op`` (the op contract) on ``input_sets`` cases per layout (seeds ``seed``, ``seed + 1``,
    ...), warmed up once each, then ``repeats`` rounds scattered, contiguous, rotating among the
    sets; the row of medians: ``scattered_ms``, ``contiguous_ms``, their ``ratio`` and the host
    time per call of each (the timer's ``host_seconds``)."""
    cases = {lay: [uniform_case(H, T, B, L, lay, pool, seed + i) for i in range(input_sets)] for lay in LAYOUT_PAIR}
    for sets in cases.values():
        for c in sets:
            op(*case_args(c))
    calls = {lay: (lambda r, sets=sets: op(*case_args(sets[r % input_sets]))) for lay, sets in cases.items()}
    host: dict[str, list[float]] = {lay: [] for lay in LAYOUT_PAIR}
    times = round_robin(calls, repeats=repeats, timer=timer, host=host)
    s, c = statistics.median(times["scattered"]), statistics.median(times["contiguous"])
    return {"config": f"H{H} T{T} B{B} L{L}", "scattered_ms": s * 1e3, "contiguous_ms": c * 1e3,
            "ratio": s / c, "scattered_host_us": statistics.median(host["scattered"]) * 1e6,
            "contiguous_host_us": statistics.median(host["contiguous"]) * 1e6}
