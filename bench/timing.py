"""The one timing stack: every timer, the interleaving loop and the measured ceilings.

A timer is ``timer(fn) -> seconds``: it calls ``fn()`` once and says how long it took. `make_timer`
is the one factory:

- on a CUDA device a `QueuedTimer`: CUDA events recorded on the current stream around the call,
  then a wait on the end event. By default (``cold_l2=True, lead_s=LEAD_S``) it first (a) streams
  through a preallocated buffer of twice the L2 (`l2_flush_bytes`, allocated on first use), so
  the call starts with a cold L2: by *reading* it (``flush_mode="read"``), which leaves the L2
  holding clean lines, so the timed call pays no write-back of someone else's dirty lines
  (``"write"`` zeroes it instead, as triton.testing.do_bench does, and the timed call then pays
  for writing those zeroes back), and (b) enqueues a GPU busy-wait (``torch.cuda._sleep``) of
  ``lead_s``. The host then records start and enqueues fn while the GPU is still busy, so the
  events measure **GPU time of fn's work only**, L2 cold, as triton.testing.do_bench and
  FlashInfer's bench utilities do. This holds while fn's host part is shorter than the lead and
  fn does not synchronise; a call whose host time exceeds ``lead_s`` is counted in ``overruns``.
  With ``cold_l2=False, lead_s=0`` the GPU is idle when the start event is recorded, so the span
  **includes the host time** fn() spends before and between its launches: right when launch
  cost is what is compared (eager calls vs a CUDA-graph replay);
- elsewhere a `HostTimer`: ``time.perf_counter`` around the call (calls are synchronous there).

Every timer also appends to ``host_seconds`` the perf_counter time fn() took to return: behind
a lead that is the host cost of enqueueing the call, reported apart from the GPU time.
`round_robin` times several callables alternately, so all see the same machine state;
`measure_ceilings` the copy bandwidth and bf16 matmul rate the roofline needs.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable, Mapping, Optional, Sequence, Union

Timer = Callable[[Callable[[], Any]], float]

LEAD_S = 200e-6  # GPU busy-wait queued before every timed call: longer than any launch path's host time
L2_FLUSH_FALLBACK_BYTES = 256 * 2**20  # when the device does not report its L2 size
FLUSH_MODES = ("read", "write")


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


class HostTimer:
    """``timer(fn) -> seconds`` by perf_counter, with a QueuedTimer's ``host_seconds`` / ``label``:
    the timer off CUDA, where calls are synchronous."""

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


def make_timer(device: Any = "cuda", *, cold_l2: bool = True, lead_s: float = LEAD_S,
               flush_mode: str = "read") -> Union[QueuedTimer, HostTimer]:
    """The timer for ``device`` (module docstring): a `QueuedTimer` on CUDA, flushing twice the L2
    before each call when ``cold_l2`` and queued behind a busy-wait of ``lead_s``; a `HostTimer`
    elsewhere."""
    import torch  # noqa: PLC0415

    if torch.device(device).type != "cuda":
        return HostTimer()
    flush = l2_flush_bytes(device) if cold_l2 else 0
    return QueuedTimer(flush_bytes=flush, lead_s=lead_s, flush_mode=flush_mode)


def timer_label(timer: Timer) -> str:
    """What a timer says it measures (its ``label``), for the records."""
    return getattr(timer, "label", getattr(timer, "__name__", type(timer).__name__))



Calls = Union[Sequence[Callable[[int], Any]], Mapping[str, Callable[[int], Any]]]


def round_robin(calls: Calls, *, repeats: Union[int, Sequence[int], Mapping[str, int]], timer: Timer,
                warmup: int = 0, host: Optional[Any] = None,
                before: Optional[Callable[[int], Any]] = None) -> Any:
    """Warm up then time ``calls[0](i), calls[1](i), ..., calls[0](i+1), ...``; ``i`` counts the
    round (to rotate among input sets). ``calls`` is a list (the result is one list of seconds per
    call, in order) or a dict of names (the result is a dict of lists by name). ``repeats`` is the
    timed rounds of every call, or one count per call (by position or name): a call sits out the
    rounds past its own count. ``before(i)``, when given, runs untimed before timed round ``i``
    (to change the inputs).

    ``host``: lists shaped like the result that get, call by call, the host seconds the timer
    recorded (the last entry of its ``host_seconds``)."""
    names = list(calls) if isinstance(calls, Mapping) else None
    fns = [calls[n] for n in names] if names is not None else list(calls)
    if isinstance(repeats, int):
        counts = [repeats] * len(fns)
    elif isinstance(repeats, Mapping):
        counts = [repeats[n] for n in names] if names is not None else list(repeats.values())
    else:
        counts = list(repeats)
    if len(counts) != len(fns):
        raise ValueError(f"repeats: expected one count per call ({len(fns)}), got {len(counts)}")
    hosts = None
    if host is not None:
        if not hasattr(timer, "host_seconds"):
            raise ValueError(f"host: timer {timer_label(timer)!r} records no host_seconds")
        hosts = [host[n] for n in names] if names is not None else list(host)
        if len(hosts) != len(fns):
            raise ValueError(f"host: expected {len(fns)} lists (one per call), got {len(hosts)}")

    for i in range(warmup):
        for fn in fns:
            fn(i)
    times: list[list[float]] = [[] for _ in fns]
    for i in range(max(counts, default=0)):
        if before is not None:
            before(i)
        for side, fn in enumerate(fns):
            if i >= counts[side]:
                continue
            times[side].append(float(timer(lambda: fn(i))))
            if hosts is not None:
                hosts[side].append(float(timer.host_seconds[-1]))  # type: ignore[attr-defined]
    return dict(zip(names, times)) if names is not None else times


def measure_ceilings(device="cuda", copy_bytes: int = 2 * 2**30, matmul_n: int = 8192,
                     reps: int = 10) -> tuple[float, float]:
    """(copy bandwidth in bytes/s, bf16 matmul rate in FLOP/s), medians of queued timings.

    Bandwidth counts bytes read + written by a large device-to-device copy; the rate is an
    n^3 ``torch.matmul`` of random bf16 matrices."""
    import torch  # noqa: PLC0415

    timer = QueuedTimer(lead_s=LEAD_S)  # a warm L2 is no concern for 2 GiB and 8192^2 operands
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
