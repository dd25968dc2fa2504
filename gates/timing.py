"""Timers: a timer is ``timer(fn) -> seconds``, it calls ``fn()`` once and says how long it took.

`perf_counter_timer` suits host-synchronous work; `cuda_event_timer()` records CUDA events on the
current stream around the call and waits for the end event, so it measures GPU time of
asynchronous launches. `default_timer(device)` picks one for a device string. `interleaved`
times two callables alternately, so both see the same machine state.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

Timer = Callable[[Callable[[], Any]], float]


def perf_counter_timer(fn: Callable[[], Any]) -> float:
    """Wall time of one call by ``time.perf_counter`` (does not wait for a GPU)."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


perf_counter_timer.label = "perf_counter"  # type: ignore[attr-defined]


def cuda_event_timer() -> Timer:
    """A timer of CUDA events recorded on the current stream; it synchronises on the end event."""
    import torch  # noqa: PLC0415

    def timer(fn: Callable[[], Any]) -> float:
        stream = torch.cuda.current_stream()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    timer.label = "cuda_event"  # type: ignore[attr-defined]
    return timer


def default_timer(device: str) -> Timer:
    """CUDA events on a CUDA device (host time would measure only the launch), else perf_counter."""
    return cuda_event_timer() if str(device).startswith("cuda") else perf_counter_timer


def timer_label(timer: Timer) -> str:
    return getattr(timer, "label", getattr(timer, "__name__", type(timer).__name__))


@dataclass(frozen=True)
class Spread:
    """Median, min and max of a list of timings, in seconds."""

    median: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> "Spread":
        if not samples:
            raise ValueError("no timings to summarise")
        return cls(statistics.median(samples), min(samples), max(samples), len(samples))

    def ms(self) -> dict[str, float]:
        return {"median_ms": self.median * 1e3, "min_ms": self.min * 1e3, "max_ms": self.max * 1e3}


def interleaved(a: Callable[[int], Any], b: Callable[[int], Any] | None, *, warmup: int, repeats: int,
                timer: Timer) -> tuple[list[float], list[float]]:
    """Warm up then time ``a(i), b(i), a(i+1), b(i+1), ...``; ``i`` counts the round (to rotate
    among input sets). ``b`` may be None (only ``a`` is run). Returns the two lists of seconds."""
    for i in range(warmup):
        a(i)
        if b is not None:
            b(i)
    ta: list[float] = []
    tb: list[float] = []
    for i in range(repeats):
        ta.append(float(timer(lambda: a(i))))
        if b is not None:
            tb.append(float(timer(lambda: b(i))))
    return ta, tb
