"""Timers: a timer is ``timer(fn) -> seconds``, it calls ``fn()`` once and says how long it took.

`perf_counter_timer` suits host-synchronous work. `cuda_event_timer(flush_bytes, lead_s)` returns a
`QueuedTimer`: CUDA events recorded on the current stream around the call, then a wait on the end
event. What it measures depends on its two arguments:

- ``cuda_event_timer()`` (no flush, no lead; what `default_timer` gives on CUDA): the GPU is idle
  when the start event is recorded, so the span runs from that event to the end of the last
  kernel and **includes the host time** fn() spends before (and between) its launches: Python
  argument checks, pybind, the launch itself. That is right when launch cost is what is compared
  (eager calls vs a CUDA-graph replay); for a 5 µs kernel it reads ~40 µs.
- ``cuda_event_timer(flush_bytes=l2_flush_bytes(), lead_s=200e-6)``: before recording start it
  (a) streams through a preallocated buffer of ``flush_bytes`` (allocated once per timer on first
  use), so the call starts with a cold L2: by default by *reading* it (``flush_mode="read"``),
  which leaves the L2 holding clean lines, so the timed call pays no write-back of someone else's
  dirty lines (``"write"`` zeroes it instead, as triton.testing.do_bench does, and the timed call then
  pays for writing those zeroes back), and (b) enqueues a GPU busy-wait (``torch.cuda._sleep``) of
  ``lead_s``. The host then records start and enqueues fn while the GPU is still busy, so the
  events measure **GPU time of fn's work only**, L2 cold, as triton.testing.do_bench and
  FlashInfer's bench utilities do. This holds while fn's host part is shorter than the lead and
  fn does not synchronise; a call whose host time exceeds ``lead_s`` is counted in ``overruns``
  (its span may again include host time).

Every `QueuedTimer` also appends to ``host_seconds`` the ``time.perf_counter`` time fn() took to
return. Behind a lead that is the host cost of enqueueing the call (launch overhead), reported
separately from the GPU time; an fn that synchronises (``.tolist()``, ``.item()``) also waits there
for the GPU, lead included. `default_timer(device)` picks a timer for a device string;
`interleaved` times two callables alternately, so both see the same machine state.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

Timer = Callable[[Callable[[], Any]], float]

L2_FLUSH_FALLBACK_BYTES = 256 * 2**20  # when the device does not report its L2 size
FLUSH_MODES = ("read", "write")


def perf_counter_timer(fn: Callable[[], Any]) -> float:
    """Wall time of one call by ``time.perf_counter`` (does not wait for a GPU)."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


perf_counter_timer.label = "perf_counter"  # type: ignore[attr-defined]


def sleep_cycles(lead_s: float, cycles_per_s: float) -> int:
    """Clock cycles of a ``torch.cuda._sleep`` that lasts at least ``lead_s`` at ``cycles_per_s``."""
    if not (math.isfinite(lead_s) and lead_s >= 0):
        raise ValueError(f"lead_s: expected a finite number of seconds >= 0, got {lead_s!r}")
    if not (math.isfinite(cycles_per_s) and cycles_per_s > 0):
        raise ValueError(f"cycles_per_s: expected a finite rate > 0, got {cycles_per_s!r}")
    return math.ceil(lead_s * cycles_per_s)


def queued_label(flush_bytes: int, lead_s: float, flush_mode: str = "read") -> str:
    """The label a `QueuedTimer` reports: ``cuda_event`` plus its flush and lead when it has them."""
    parts = []
    if flush_bytes:
        parts.append(f"L2 flush {flush_bytes / 2**20:g} MiB" + (" written" if flush_mode == "write" else ""))
    if lead_s:
        parts.append(f"lead {lead_s * 1e6:g} us")
    return "cuda_event" + (f" ({', '.join(parts)})" if parts else "")


def l2_flush_bytes(device: Any = None) -> int:
    """Bytes to write to wipe the L2 of a CUDA device: twice its L2 size, else 256 MiB."""
    import torch  # noqa: PLC0415

    props = torch.cuda.get_device_properties(torch.cuda.current_device() if device is None else device)
    l2 = int(getattr(props, "L2_cache_size", 0) or 0)
    return 2 * l2 if l2 > 0 else L2_FLUSH_FALLBACK_BYTES


def gpu_cycles_per_s(device: Any = None) -> float:
    """SM clock of a CUDA device in Hz, for sizing ``torch.cuda._sleep``.

    The device's rated clock (``get_device_properties().clock_rate``, kHz, in recent torch): the
    highest it runs at, so a sleep sized from it never ends early. Without it (older torch, or
    0 as some CUDA 13 builds report) the rate is calibrated once by timing a known sleep with
    events, itself queued behind a sleep so that host time stays out.
    """
    import torch  # noqa: PLC0415

    dev = torch.device("cuda") if device is None else torch.device(device)
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if index in _CYCLES_PER_S:
        return _CYCLES_PER_S[index]
    khz = int(getattr(torch.cuda.get_device_properties(index), "clock_rate", 0) or 0)
    rate = khz * 1e3 if khz > 0 else calibrated_cycles_per_s(index)
    _CYCLES_PER_S[index] = rate
    return rate


def calibrated_cycles_per_s(index: int, cycles: int = 1 << 21) -> float:
    """Cycles per second ``torch.cuda._sleep`` runs at on device ``index``, from CUDA events
    around one sleep of ``cycles`` queued behind another (so no host time is in the span)."""
    import torch  # noqa: PLC0415

    with torch.cuda.device(index):
        torch.cuda._sleep(1 << 10)  # loads the kernel
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(cycles)  # keeps the GPU busy while the timed sleep is enqueued
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return cycles / (start.elapsed_time(end) / 1e3)


_CYCLES_PER_S: dict[int, float] = {}


class QueuedTimer:
    """``timer(fn) -> seconds`` of CUDA events around ``fn()``, optionally behind an L2 wipe and a
    GPU busy-wait (see the module docstring for what is measured).

    ``host_seconds`` gets one entry per call: the perf_counter time fn() took to return.
    ``overruns`` counts calls (with a lead) whose host time exceeded ``lead_s``. Nothing touches
    CUDA before the first call: the flush buffer and the sleep length are made then, once.
    """

    def __init__(self, flush_bytes: int = 0, lead_s: float = 0.0, flush_mode: str = "read"):
        if isinstance(flush_bytes, bool) or not isinstance(flush_bytes, int) or flush_bytes < 0:
            raise ValueError(f"flush_bytes: expected an int >= 0, got {flush_bytes!r}")
        if isinstance(lead_s, bool) or not isinstance(lead_s, (int, float)) or not (
                math.isfinite(lead_s) and lead_s >= 0):
            raise ValueError(f"lead_s: expected a finite number of seconds >= 0, got {lead_s!r}")
        if flush_mode not in FLUSH_MODES:
            raise ValueError(f"flush_mode: expected one of {FLUSH_MODES}, got {flush_mode!r}")
        self.flush_bytes = flush_bytes
        self.flush_mode = flush_mode
        self.lead_s = float(lead_s)
        self.label = queued_label(flush_bytes, self.lead_s, flush_mode)
        self.host_seconds: list[float] = []
        self.overruns = 0
        self._flush_buffer: Optional[Any] = None
        self._flush: Optional[Callable[[], Any]] = None
        self._cycles: Optional[int] = None

    def _prepare(self, torch) -> None:
        if self.flush_bytes and self._flush is None:
            self._flush_buffer = torch.zeros(self.flush_bytes, dtype=torch.uint8, device="cuda")
            if self.flush_mode == "write":
                self._flush = self._flush_buffer.zero_
            else:
                words = self._flush_buffer[: self.flush_bytes // 4 * 4].view(torch.int32)
                self._flush = lambda: torch.amax(words)
        if self.lead_s and self._cycles is None:
            self._cycles = sleep_cycles(self.lead_s, gpu_cycles_per_s())

    def __call__(self, fn: Callable[[], Any]) -> float:
        import torch  # noqa: PLC0415

        self._prepare(torch)
        stream = torch.cuda.current_stream()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        if self._flush is not None:
            self._flush()
        if self._cycles:
            torch.cuda._sleep(self._cycles)
        start.record(stream)
        t0 = time.perf_counter()
        fn()
        host = time.perf_counter() - t0
        end.record(stream)
        end.synchronize()
        self.host_seconds.append(host)
        if self.lead_s and host > self.lead_s:
            self.overruns += 1
        return start.elapsed_time(end) / 1e3


def cuda_event_timer(flush_bytes: int = 0, lead_s: float = 0.0, flush_mode: str = "read") -> QueuedTimer:
    """A `QueuedTimer`: CUDA events on the current stream, synchronised on the end event.

    With no arguments it behaves as it always has (no flush, no lead: host launch time counts,
    label ``cuda_event``). Pass ``flush_bytes`` (e.g. `l2_flush_bytes()`) for a cold L2 and
    ``lead_s`` (e.g. 200e-6) to keep host enqueue time out of the measurement.
    """
    return QueuedTimer(flush_bytes, lead_s, flush_mode)


def default_timer(device: str) -> Timer:
    """CUDA events on a CUDA device (host time would measure only the launch), else perf_counter.

    On CUDA this is the plain ``cuda_event_timer()`` (launch cost included); gates that compare
    kernels' GPU time pass a queued timer themselves."""
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


def round_robin(calls: Sequence[Callable[[int], Any]], *, warmup: int, repeats: int, timer: Timer,
                host: Optional[list[list[float]]] = None,
                before: Optional[Callable[[int], Any]] = None) -> list[list[float]]:
    """Warm up then time ``calls[0](i), calls[1](i), ..., calls[0](i+1), ...``; ``i`` counts the
    round (to rotate among input sets). Returns one list of seconds per call, in `calls` order.
    ``before(i)``, when given, runs untimed before timed round ``i`` (to change the inputs).

    ``host``: one list per call that gets, call by call, the host seconds the timer recorded (the
    last entry of its ``host_seconds``, as a `QueuedTimer` keeps)."""
    if host is not None:
        if not hasattr(timer, "host_seconds"):
            raise ValueError(f"host: timer {timer_label(timer)!r} records no host_seconds")
        if len(host) != len(calls):
            raise ValueError(f"host: expected {len(calls)} lists (one per call), got {len(host)}")

    def timed(fn: Callable[[int], Any], i: int, side: int) -> float:
        seconds = float(timer(lambda: fn(i)))
        if host is not None:
            host[side].append(float(timer.host_seconds[-1]))  # type: ignore[attr-defined]
        return seconds

    for i in range(warmup):
        for fn in calls:
            fn(i)
    times: list[list[float]] = [[] for _ in calls]
    for i in range(repeats):
        if before is not None:
            before(i)
        for side, fn in enumerate(calls):
            times[side].append(timed(fn, i, side))
    return times


def interleaved(a: Callable[[int], Any], b: Callable[[int], Any] | None, *, warmup: int, repeats: int,
                timer: Timer, host: Optional[tuple[list[float], list[float]]] = None,
                before: Optional[Callable[[int], Any]] = None) -> tuple[list[float], list[float]]:
    """Warm up then time ``a(i), b(i), a(i+1), b(i+1), ...``; ``i`` counts the round (to rotate
    among input sets). ``b`` may be None (only ``a`` is run). Returns the two lists of seconds.
    ``before(i)``, when given, runs untimed before timed round ``i`` (to change the inputs).

    ``host``: two lists that get, call by call, the host seconds the timer recorded for ``a`` and
    for ``b`` (the last entry of its ``host_seconds``, as a `QueuedTimer` keeps)."""
    calls = [a] if b is None else [a, b]
    got = round_robin(calls, warmup=warmup, repeats=repeats, timer=timer,
                      host=None if host is None else list(host)[: len(calls)], before=before)
    return got[0], (got[1] if b is not None else [])
