"""The bench's timers: what the queued CUDA-event timer measures (GPU part), and its pure logic on
the CPU: sleep length, label, argument checks, the order of what it queues, the interleaving
loop, host times through the speed measurement and the gate that judges it."""

from __future__ import annotations

import math
import time

import pytest
import torch

from kdtree.bench import timing
from kdtree.bench.speed import SpeedConfig, measure_speedup, speed_protocol
from kdtree.bench.timing import QueuedTimer, queued_label, round_robin, sleep_cycles
from kdtree.gates.base import GateContext, Outcome
from kdtree.gates.spec import SpeedupGateSpec
from kdtree.gates.speedup import judge_speedup

cuda_event_timer = QueuedTimer


def test_sleep_cycles_cover_the_lead():
    assert sleep_cycles(200e-6, 1.98e9) == 396_000
    assert sleep_cycles(1e-9, 1.5e9) == 2  # rounded up: never shorter than asked
    assert sleep_cycles(0.0, 1e9) == 0
    for bad in (-1e-6, math.nan, math.inf):
        with pytest.raises(ValueError, match="lead_s"):
            sleep_cycles(bad, 1e9)
    with pytest.raises(ValueError, match="cycles_per_s"):
        sleep_cycles(1e-4, 0.0)


@pytest.mark.parametrize("kwargs, match", [
    ({"lead_s": -1e-6}, "lead_s"), ({"lead_s": math.nan}, "lead_s"), ({"lead_s": "200us"}, "lead_s"),
    ({"flush_mode": "evict"}, "flush_mode"), ({"flush_bytes": -1}, "flush_bytes"),
    ({"flush_bytes": 1.5}, "flush_bytes"), ({"flush_bytes": True}, "flush_bytes"),
])
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        cuda_event_timer(**kwargs)


def test_labels_say_what_is_measured():
    assert cuda_event_timer().label == "cuda_event" == timing.timer_label(cuda_event_timer())
    assert queued_label(120 * 2**20, 200e-6) == "cuda_event (L2 flush 120 MiB, lead 200 us)"
    assert queued_label(2**20, 0, "write") == "cuda_event (L2 flush 1 MiB written)"
    assert queued_label(0, 5e-4) == "cuda_event (lead 500 us)"
    t = cuda_event_timer(flush_bytes=1 << 20, lead_s=1e-4)  # building one touches no GPU
    assert t.label == "cuda_event (L2 flush 1 MiB, lead 100 us)" and t.host_seconds == [] and t.overruns == 0


def _fake_device(monkeypatch, **props):
    from types import SimpleNamespace

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(**props))
    monkeypatch.setattr(timing, "_CYCLES_PER_S", {})


def test_clock_and_flush_size_from_device_properties(monkeypatch):
    _fake_device(monkeypatch, clock_rate=1_980_000, L2_cache_size=60 * 2**20)  # kHz, bytes: an H200
    assert timing.gpu_cycles_per_s() == 1.98e9 and timing.gpu_cycles_per_s("cuda:0") == 1.98e9
    assert timing.l2_flush_bytes() == 120 * 2**20
    _fake_device(monkeypatch, clock_rate=0)  # not reported: calibrated once, then cached
    calls = []
    monkeypatch.setattr(timing, "calibrated_cycles_per_s", lambda index: calls.append(index) or 1.5e9)
    assert timing.gpu_cycles_per_s() == 1.5e9 == timing.gpu_cycles_per_s() and calls == [0]
    assert timing.l2_flush_bytes() == timing.L2_FLUSH_FALLBACK_BYTES == 256 * 2**20


class _FakeCuda:
    """Stands in for torch.cuda: logs what the timer queues, events read the host clock."""

    def __init__(self, monkeypatch):
        self.log: list[str] = []
        log = self.log

        class Event:
            def __init__(self, enable_timing=False):
                self.t = None

            def record(self, stream=None):
                log.append("record")
                self.t = time.perf_counter()

            def synchronize(self):
                log.append("sync")

            def elapsed_time(self, other):
                return (other.t - self.t) * 1e3

        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda: None)
        monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: log.append(f"sleep {cycles}"))


def test_queued_timer_flushes_then_waits_then_times_and_keeps_host_seconds(monkeypatch):
    fake = _FakeCuda(monkeypatch)
    t = QueuedTimer(flush_bytes=1 << 20, lead_s=1e-3)
    t._flush, t._cycles = (lambda: fake.log.append("flush")), 1234  # what _prepare makes on a GPU
    t(lambda: fake.log.append("fn"))
    assert fake.log == ["flush", "sleep 1234", "record", "fn", "record", "sync"]
    t(lambda: time.sleep(0.003))  # host part longer than the lead: counted as an overrun
    assert len(t.host_seconds) == 2 and t.host_seconds[1] >= 0.003 and t.overruns == 1
    plain = QueuedTimer()
    fake.log.clear()
    plain(lambda: fake.log.append("fn"))
    assert fake.log == ["record", "fn", "record", "sync"] and plain.overruns == 0 and len(plain.host_seconds) == 1


class _HostTimer:
    """A timer with scripted GPU seconds and host seconds per side (c, b, c, b, ...)."""

    label = "scripted"
    lead_s = 1e-3

    def __init__(self):
        self.host_seconds: list[float] = []
        self.side = 0

    def __call__(self, fn):
        fn()
        self.host_seconds.append([20e-6, 2e-3][self.side])  # the baseline overruns the lead
        self.side ^= 1
        return [1e-3, 3e-3][self.side ^ 1]


def test_round_robin_splits_host_seconds_by_side():
    host = ([], [])
    ta, tb = round_robin([lambda i: None, lambda i: None], warmup=2, repeats=3, timer=_HostTimer(), host=host)
    assert ta == [1e-3] * 3 and tb == [3e-3] * 3
    assert host == ([20e-6] * 3, [2e-3] * 3)
    with pytest.raises(ValueError, match="host_seconds"):
        round_robin([lambda i: None], repeats=1, timer=lambda fn: fn() or 0.0, host=([],))
    with pytest.raises(ValueError, match="one count per call"):
        round_robin([lambda i: None], repeats=[1, 2], timer=_HostTimer())


def test_round_robin_by_name_lets_a_call_sit_out_rounds_past_its_count():
    order = []
    got = round_robin({"a": lambda i: order.append(("a", i)), "b": lambda i: order.append(("b", i))},
                      repeats={"a": 3, "b": 1}, timer=timing.HostTimer(), before=lambda i: order.append(("-", i)))
    assert order == [("-", 0), ("a", 0), ("b", 0), ("-", 1), ("a", 1), ("-", 2), ("a", 2)]
    assert [len(got["a"]), len(got["b"])] == [3, 1]


def test_make_timer_off_cuda_is_the_host_timer():
    t = timing.make_timer("cpu")
    assert isinstance(t, timing.HostTimer) and t.label == "perf_counter"
    assert t(lambda: None) >= 0 and len(t.host_seconds) == 1


def test_speedup_gate_reports_host_time_per_side():
    spec = SpeedupGateSpec(name="toy", baseline="toy-base", min_median_speedup=2.0, min_each_speedup=1.5,
                           warmup=1, repeats=4)

    def make_inputs(seed, device):
        return {"x": torch.randn(8, generator=torch.Generator().manual_seed(seed))}

    measured = measure_speedup([SpeedConfig("a", make_inputs)], lambda i: i["x"] * 2, lambda i: i["x"] + i["x"],
                               GateContext(), **speed_protocol(spec), timer=_HostTimer())
    r = judge_speedup(spec, measured)
    assert r.outcome is Outcome.PASSED, r.summary
    (row,) = r.details["configs"]
    assert row["candidate_host_us"] == pytest.approx(20.0) and row["baseline_host_us"] == pytest.approx(2000.0)
    assert row["candidate_lead_overruns"] == 0 and row["baseline_lead_overruns"] == 4
    assert r.details["timer"] == "scripted"
    assert r.details["host_us_median"] == pytest.approx({"candidate": 20.0, "baseline": 2000.0})
    assert r.details["lead_overruns"] == {"candidate": 0, "baseline": 4}


# ---------------------------------------------------------------- on a GPU

def _tiny_kernel():
    x = torch.ones(1024, device="cuda")
    x.add_(1)  # warm: allocated and launched once before timing
    return lambda: x.add_(1)


@pytest.mark.gpu
def test_gpu_queued_timer_does_not_count_host_time():
    kernel = _tiny_kernel()
    torch.cuda.synchronize()

    def fn():
        time.sleep(0.005)  # 5 ms on the host before the launch
        kernel()

    plain = cuda_event_timer()
    queued = cuda_event_timer(flush_bytes=timing.l2_flush_bytes(), lead_s=0.02)  # lead covers the 5 ms
    plain_s = [plain(fn) for _ in range(3)]
    queued_s = [queued(fn) for _ in range(3)]
    assert min(plain_s) >= 0.0049, plain_s  # the idle GPU waited for the host: host time counted
    assert max(queued_s) < 0.0025, queued_s  # only the kernel (and the gap after the lead): far less
    assert min(queued.host_seconds) >= 0.005 and queued.overruns == 0  # host time reported, separately
    assert queued._flush_buffer is not None and queued._flush_buffer.numel() == timing.l2_flush_bytes()


@pytest.mark.gpu
def test_gpu_clock_and_flush_size_are_plausible():
    rate = timing.gpu_cycles_per_s()
    assert 1e8 < rate < 1e10
    assert timing.calibrated_cycles_per_s(torch.cuda.current_device()) < 1.1 * rate  # the rated clock is the top
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    l2 = getattr(props, "L2_cache_size", 0)
    assert timing.l2_flush_bytes() == (2 * l2 if l2 else timing.L2_FLUSH_FALLBACK_BYTES)
