"""The speed measurement (`kdtree.bench.speed`) and the speedup gate that judges it, end to end:
arithmetic and rules with a deterministic fake timer (speed is never asserted)."""

from __future__ import annotations

import itertools

import pytest
import torch

from kdtree.gates.base import GateContext, Outcome, run_check
from kdtree.gates.spec import SpeedupGateSpec
from kdtree.bench.speed import SpeedConfig, measure_speedup, rel_l2_disagreement, speed_protocol
from kdtree.bench.timing import HostTimer
from kdtree.gates.speedup import judge_speedup


def check_speedup(spec, configs, candidate, baseline, ctx, **kw):
    """What a phase does: measure with the spec's protocol, then judge."""
    return judge_speedup(spec, measure_speedup(configs, candidate, baseline, ctx, **speed_protocol(spec), **kw), ctx)

SPEC = SpeedupGateSpec(name="toy-speed", baseline="toy-baseline", min_median_speedup=2.0, min_each_speedup=1.5,
                       trials=2, warmup=2, repeats=5)


class Bench:
    """Candidate and baseline that log every call; a fake timer that returns scripted seconds."""

    def __init__(self, cand_times=(1.0,), base_times=(3.0,), cand_scale=1.0):
        self.calls: list[tuple[str, int, bool]] = []
        self._timing = False
        self.cand_times = {}
        self.base_times = {}
        self._default = (cand_times, base_times)
        self.cand_scale = cand_scale

    def _iters(self, cfg):
        if cfg not in self.cand_times:
            self.cand_times[cfg] = itertools.cycle(self._default[0])
            self.base_times[cfg] = itertools.cycle(self._default[1])
        return self.cand_times[cfg], self.base_times[cfg]

    def candidate(self, inputs):
        self.calls.append(("c", inputs["set"], self._timing))
        return inputs["x"] * 2 * self.cand_scale

    def baseline(self, inputs):
        self.calls.append(("b", inputs["set"], self._timing))
        return inputs["x"] * 2

    def timer(self, fn):
        self._timing = True
        fn()
        self._timing = False
        who = self.calls[-1][0]
        cand, base = self._iters(self.calls[-1][1] // 100)
        return next(cand if who == "c" else base)


def config(name, cfg_id=0, **kw):
    drawn = itertools.count()

    def make_inputs(seed, device):  # one set per seed; "set" numbers them within the config
        g = torch.Generator().manual_seed(seed)
        return {"set": cfg_id * 100 + next(drawn), "x": torch.randn(8, generator=g)}

    return SpeedConfig(name=name, make_inputs=make_inputs, **kw)


def fig(result, name):
    return next(f for f in result.figures if f.name == name)


def test_median_min_max_and_speedup_arithmetic():
    b = Bench(cand_times=(1e-3, 3e-3, 2e-3), base_times=(4e-3, 8e-3, 6e-3))
    r = check_speedup(SPEC, [config("a")], b.candidate, b.baseline, GateContext(), timer=b.timer)
    assert r.outcome is Outcome.PASSED, r.summary
    (row,) = r.details["configs"]
    # five timed calls each: c = 1,3,2,1,3 ms; b = 4,8,6,4,8 ms
    assert row["candidate"] == pytest.approx({"median_ms": 2.0, "min_ms": 1.0, "max_ms": 3.0})
    assert row["baseline"] == pytest.approx({"median_ms": 6.0, "min_ms": 4.0, "max_ms": 8.0})
    assert row["speedup"] == pytest.approx(3.0)
    assert fig(r, "median_speedup").value == pytest.approx(3.0) and fig(r, "median_speedup").key


def test_calls_are_interleaved_after_agreement_and_warmup_and_rotate_input_sets():
    b = Bench()
    check_speedup(SPEC, [config("a")], b.candidate, b.baseline, GateContext(), timer=b.timer)
    agreement = [("c", 0, False), ("b", 0, False), ("c", 1, False), ("b", 1, False)]
    warmup = [("c", 0, False), ("b", 0, False), ("c", 1, False), ("b", 1, False)]
    timed = [(w, i % 2, True) for i in range(5) for w in ("c", "b")]
    last_call_check = [("b", 0, False)]  # the baseline on the inputs of the candidate's last timed call
    assert b.calls == agreement + warmup + timed + last_call_check


def test_median_and_min_over_configs():
    b = Bench()
    b.cand_times = {0: itertools.cycle([1.0]), 1: itertools.cycle([1.0]), 2: itertools.cycle([1.0])}
    b.base_times = {0: itertools.cycle([3.0]), 1: itertools.cycle([5.0]), 2: itertools.cycle([1.6])}
    cfgs = [config(f"c{i}", cfg_id=i) for i in range(3)]
    r = check_speedup(SPEC, cfgs, b.candidate, b.baseline, GateContext(), timer=b.timer)
    assert fig(r, "median_speedup").value == pytest.approx(3.0)
    assert fig(r, "min_speedup").value == pytest.approx(1.6)
    assert r.outcome is Outcome.PASSED
    b.base_times[2] = itertools.cycle([1.2])
    b.cand_times = {k: itertools.cycle([1.0]) for k in range(3)}
    b.base_times[0], b.base_times[1] = itertools.cycle([3.0]), itertools.cycle([5.0])
    r = check_speedup(SPEC, cfgs, b.candidate, b.baseline, GateContext(), timer=b.timer)
    assert r.outcome is Outcome.FAILED and not fig(r, "min_speedup").ok


def test_a_faster_candidate_that_disagrees_fails_and_its_time_does_not_count():
    b = Bench(cand_times=(1e-6,), base_times=(1.0,), cand_scale=1.1)
    r = check_speedup(SPEC, [config("a")], b.candidate, b.baseline, GateContext(), timer=b.timer)
    assert r.outcome is Outcome.FAILED
    assert fig(r, "disagreeing_configs").value == 1
    assert fig(r, "median_speedup").value is None
    assert "disagree" in r.summary
    assert not any(timed for _, _, timed in b.calls)  # nothing was timed


def test_disagreement_on_one_config_fails_even_if_others_are_fast():
    b = Bench(cand_times=(1.0,), base_times=(10.0,))

    def cand(inputs):
        out = b.candidate(inputs)
        return out + 1 if inputs["set"] >= 100 else out

    r = check_speedup(SPEC, [config("ok"), config("bad", cfg_id=1)], cand, b.baseline, GateContext(), timer=b.timer)
    assert r.outcome is Outcome.FAILED
    assert fig(r, "median_speedup").ok and fig(r, "configs_timed").value == 1
    assert [row["status"] for row in r.details["configs"]] == ["ok", "disagree"]


def test_candidate_sharing_the_baselines_output_buffer_cannot_agree_trivially():
    shared = torch.zeros(8)

    def cand(inputs):
        shared.copy_(inputs["x"] * 3)  # wrong
        return shared

    def base(inputs):
        shared.copy_(inputs["x"] * 2)
        return shared

    b = Bench()
    r = check_speedup(SPEC, [config("a")], cand, base, GateContext(), timer=b.timer)
    assert r.outcome is Outcome.FAILED and fig(r, "disagreeing_configs").value == 1


def test_roofline_above_the_maximum_is_a_measurement_error():
    b = Bench(cand_times=(1e-3,), base_times=(5e-3,))
    r = check_speedup(SPEC, [config("a")], b.candidate, b.baseline, GateContext(), timer=b.timer,
                      floor_s=lambda cfg: 2e-3)
    assert r.outcome is Outcome.ERROR
    assert "impossible" in r.summary and r.details["configs"][0]["roofline"] == pytest.approx(2.0)


def test_roofline_figures_against_the_spec():
    spec = SPEC.model_copy(update={"min_roofline_median": 0.5, "min_roofline_each": 0.3})
    b = Bench(cand_times=(1e-3,), base_times=(5e-3,))
    floors = {"a": 0.6e-3, "b": 0.2e-3}
    cfgs = [config("a"), config("b")]
    r = check_speedup(spec, cfgs, b.candidate, b.baseline, GateContext(), timer=b.timer,
                      floor_s=lambda cfg: floors[cfg.name])
    assert fig(r, "median_roofline").value == pytest.approx(0.4)
    assert fig(r, "min_roofline").value == pytest.approx(0.2)
    assert r.outcome is Outcome.FAILED


def test_roofline_spec_without_a_floor_is_an_error():
    spec = SPEC.model_copy(update={"min_roofline_median": 0.5})
    b = Bench()
    r = run_check(spec, lambda s, ctx: check_speedup(s, [config("a")], b.candidate, b.baseline, ctx, timer=b.timer),
                  GateContext())
    assert r.outcome is Outcome.ERROR and "floor_s" in r.summary


def test_skipped_baseline_is_reported_excluded_from_speedup_and_counted_for_roofline():
    b = Bench(cand_times=(1e-3,), base_times=(3e-3,))
    cfgs = [config("small"), config("huge", cfg_id=1, skip_baseline=True, skip_reason="estimated 40 s")]
    r = check_speedup(SPEC, cfgs, b.candidate, b.baseline, GateContext(), timer=b.timer,
                      floor_s=lambda cfg: 0.5e-3)
    assert r.outcome is Outcome.PASSED, r.summary
    huge = r.details["configs"][1]
    assert huge["status"] == "baseline skipped" and huge["speedup"] is None and huge["roofline"] == pytest.approx(0.5)
    assert "estimated 40 s" in r.summary
    assert fig(r, "configs_timed").value == 1
    assert all(who == "c" for who, s, _ in b.calls if s >= 100)  # the baseline never ran on it


def test_only_skipped_baselines_never_pass():
    b = Bench()
    r = check_speedup(SPEC, [config("huge", skip_baseline=True, skip_reason="slow")], b.candidate, b.baseline,
                      GateContext(), timer=b.timer)
    assert r.outcome is Outcome.FAILED and fig(r, "median_speedup").value is None


def test_no_configs_is_an_error():
    b = Bench()
    r = check_speedup(SPEC, [], b.candidate, b.baseline, GateContext(), timer=b.timer)
    assert r.outcome is Outcome.ERROR


def test_real_timer_runs_and_reports_spread():
    spec = SPEC.model_copy(update={"min_median_speedup": 1e-9, "min_each_speedup": 1e-9, "repeats": 3,
                                   "warmup": 1})
    cfg = config("a")
    r = check_speedup(spec, [cfg], lambda i: i["x"] * 2, lambda i: (i["x"] + i["x"]), GateContext())
    assert r.details["timer"] == "perf_counter"
    row = r.details["configs"][0]
    assert row["candidate"]["min_ms"] <= row["candidate"]["median_ms"] <= row["candidate"]["max_ms"]
    assert r.outcome is Outcome.PASSED


class ShapeKeyedCache:
    """A cheat: computes each shape once and returns that answer for every later call."""

    def __init__(self, fn):
        self.fn, self.cache = fn, {}

    def __call__(self, inputs):
        key = tuple(inputs["x"].shape)
        if key not in self.cache:
            self.cache[key] = self.fn(inputs)
        return self.cache[key]


class PointerKeyedCache(ShapeKeyedCache):
    def __call__(self, inputs):
        key = inputs["x"].data_ptr()
        if key not in self.cache:
            self.cache[key] = self.fn(inputs).clone()
        return self.cache[key]


def test_a_shape_keyed_cache_fails_on_agreement_with_two_input_sets():
    b = Bench(cand_times=(1e-6,), base_times=(1.0,))
    r = check_speedup(SPEC, [config("a")], ShapeKeyedCache(b.candidate), b.baseline, GateContext(), timer=b.timer)
    assert r.outcome is Outcome.FAILED
    assert r.details["configs"][0]["status"] == "disagree" and "disagree" in r.summary


def test_a_pointer_keyed_cache_passes_agreement_but_fails_on_its_last_timed_call():
    b = Bench(cand_times=(1e-6,), base_times=(1.0,))
    r = check_speedup(SPEC, [config("a")], PointerKeyedCache(b.candidate), b.baseline, GateContext(), timer=b.timer)
    (row,) = r.details["configs"]
    assert row["agree_rel_l2"] == 0.0  # the first call of every set is honest
    assert row["status"] == "stale" and row["last_call_rel_l2"] > SPEC.agree_max_rel_l2
    assert r.outcome is Outcome.FAILED and fig(r, "stale_configs").value == 1 and not fig(r, "stale_configs").ok
    assert "last timed call" in r.summary and "changed in place" in r.summary
    assert fig(r, "median_speedup").value is None  # its time does not count


def test_inputs_are_refreshed_in_place_before_every_timed_round():
    seen = []

    def refresh(inputs, seed):
        seen.append((inputs["set"], seed))
        inputs["x"].copy_(torch.randn(8, generator=torch.Generator().manual_seed(seed)))

    b = Bench()
    r = check_speedup(SPEC, [config("a", refresh=refresh)], b.candidate, b.baseline, GateContext(), timer=b.timer)
    assert r.outcome is Outcome.PASSED, r.summary
    assert [s for s, _ in seen] == [i % 2 for i in range(SPEC.repeats)]
    assert len({seed for _, seed in seen}) == SPEC.repeats
    assert r.details["configs"][0]["last_call_rel_l2"] == 0.0


def test_trials_below_two_are_refused_by_the_schema():
    with pytest.raises(ValueError, match="trials"):
        SpeedupGateSpec(name="x", baseline="b", min_median_speedup=1, min_each_speedup=1, trials=1)


def test_a_list_of_input_sets_is_refused():
    b = Bench()
    cfg = SpeedConfig("a", lambda seed, device: [{"set": 0, "x": torch.zeros(8)}])
    r = run_check(SPEC, lambda s, ctx: check_speedup(s, [cfg], b.candidate, b.baseline, ctx, timer=b.timer),
                  GateContext())
    assert r.outcome is Outcome.ERROR and "one input set per seed" in r.summary


def test_disagreement_measure():
    x = torch.ones(4)
    assert rel_l2_disagreement(x, x) == 0.0
    assert rel_l2_disagreement({"o": x * 1.1}, {"o": x}) == pytest.approx(0.1)
    assert rel_l2_disagreement(x * float("nan"), x) == float("inf")
    with pytest.raises(ValueError):
        rel_l2_disagreement(None, x)


def test_host_timer_returns_seconds():
    assert HostTimer()(lambda: None) >= 0.0


@pytest.mark.gpu
def test_gpu_cuda_event_timer_is_the_default_on_cuda():
    spec = SPEC.model_copy(update={"min_median_speedup": 1e-9, "min_each_speedup": 1e-9, "repeats": 3})

    def make_inputs(seed, device):
        g = torch.Generator().manual_seed(seed)
        return {"x": torch.randn(256, 256, generator=g).to(device)}

    r = check_speedup(spec, [SpeedConfig("mm", make_inputs)], lambda i: i["x"] @ i["x"],
                      lambda i: (i["x"].double() @ i["x"].double()).float(), GateContext(device="cuda"))
    assert r.details["timer"] == "cuda_event"
    assert r.outcome is Outcome.PASSED, r.summary
    assert r.details["configs"][0]["input_sets"] == spec.trials


class OthersBench(Bench):
    """A Bench with another candidate "o" that costs 1.5 s per call (candidate 1 s, baseline 3 s)."""

    def __init__(self, other_scale=1.0, other_cache=False):
        super().__init__()
        self.other_scale, self.other_cache, self._memo = other_scale, other_cache, {}

    def other(self, inputs):
        self.calls.append(("o", inputs["set"], self._timing))
        if self.other_cache:
            return self._memo.setdefault(inputs["set"], inputs["x"].clone() * 2)
        return inputs["x"] * 2 * self.other_scale

    def timer(self, fn):
        self._timing = True
        fn()
        self._timing = False
        return {"c": 1.0, "o": 1.5, "b": 3.0}[self.calls[-1][0]]


def test_other_candidates_are_timed_in_the_same_rounds_with_their_own_figures():
    b = OthersBench()
    r = check_speedup(SPEC, [config("a"), config("b", 1)], b.candidate, b.baseline, GateContext(), timer=b.timer,
                      others={"second": b.other})
    assert r.outcome is Outcome.PASSED, r.summary
    timed = [who for who, _, timing in b.calls if timing]
    assert timed == ["c", "o", "b"] * SPEC.repeats * 2  # interleaved: candidate, other, baseline per round
    assert fig(r, "median_speedup").value == pytest.approx(3.0)
    assert fig(r, "second_median_speedup").value == pytest.approx(2.0)
    assert fig(r, "second_min_speedup").threshold is None  # reported: the spec's thresholds hold the candidate
    assert fig(r, "second_disagreeing_configs").value == 0 and fig(r, "second_configs_timed").value == 2
    assert r.details["configs"][0]["others"]["second"]["ms"]["median_ms"] == pytest.approx(1500.0)


def test_a_wrong_other_candidate_fails_the_gate_and_its_time_does_not_count():
    b = OthersBench(other_scale=1.3)
    r = check_speedup(SPEC, [config("a")], b.candidate, b.baseline, GateContext(), timer=b.timer,
                      others={"second": b.other})
    assert r.outcome is Outcome.FAILED
    assert fig(r, "second_disagreeing_configs").value == 1 and fig(r, "second_median_speedup").value is None
    assert fig(r, "median_speedup").value == pytest.approx(3.0)  # the candidate's figures stand
    assert not [who for who, _, timing in b.calls if timing and who == "o"]
    assert "second" in r.summary


def test_an_other_candidate_that_answers_from_a_cache_is_stale():
    b = OthersBench(other_cache=True)
    r = check_speedup(SPEC, [config("a")], b.candidate, b.baseline, GateContext(), timer=b.timer,
                      others={"second": b.other})
    assert r.outcome is Outcome.FAILED and fig(r, "second_stale_configs").value == 1


def test_other_candidate_names_must_prefix_figures():
    b = OthersBench()
    with pytest.raises(ValueError, match="prefix figure names"):
        check_speedup(SPEC, [config("a")], b.candidate, b.baseline, GateContext(), timer=b.timer,
                      others={"sm-120": b.other})
