"""The speed measurement the speedup gate judges: a candidate, other candidates and a baseline on
the same input sets, outputs compared first, then timed interleaved (`kdtree.bench.timing`).

Protocol, per config (`SpeedConfig`):

- ``make_inputs(seed, device)`` returns one input set; ``trials`` (>= 2) are drawn, each from a
  fresh seed, and timing rotates among the sets round by round, so caches do not flatter a call
  that re-reads what the previous call left warm. ``refresh(inputs, seed)`` rewrites an input
  set's values in place (same shapes, same storage) before every timed round that reuses a set,
  so a candidate that keys a cache on shapes or pointers returns what it computed for other
  values; without one every floating-point tensor of the set is redrawn in place
  (`refresh_floats_`). A config may set ``skip_baseline`` with a ``skip_reason``: the baseline is
  not run;
- ``candidate(inputs)``, ``baseline(inputs)`` and each of ``others`` compute and return their
  outputs (a tensor or a dict / list / tuple of tensors); ``agree(candidate_out, baseline_out)
  -> float`` is their disagreement (default: worst rel-L2 over the output tensors, NaN/Inf =
  infinite);
- agreement on every input set first: a candidate that disagrees by more than ``agree_max`` is
  not timed, nor is another candidate that does (others are held against the baseline, or the
  candidate where the baseline is skipped); then ``warmup`` calls of each and ``repeats`` timed
  rounds ``candidate, others..., baseline`` with the inputs refreshed between rounds; then what
  each candidate's last timed call returned is held against the reference on the inputs it was
  given (``last_call_rel_l2``);
- ``floor_s(config) -> seconds | None``, when given, is the config's roofline floor.

`measure_speedup` returns a `SpeedMeasurement`: per config the raw disagreements and the seconds
(and host seconds, with a timer that keeps them) of every timed call; `kdtree.gates.speedup`
judges it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from kdtree.bench.timing import Timer, make_timer, round_robin, timer_label
from kdtree.gates.base import GateContext
from kdtree.gates.tensors import clone_tensors, flatten_tensors

CANDIDATE = ""  # the key of the candidate among a config's timed sides
BASELINE = "baseline"


@dataclass(frozen=True)
class SpeedConfig:
    """A named input factory for one timed configuration."""

    name: str
    make_inputs: Callable[[int, str], Any]
    refresh: Optional[Callable[[Any, int], None]] = None  # new values in place (module docstring)
    skip_baseline: bool = False
    skip_reason: str = ""
    params: dict[str, Any] = field(default_factory=dict)  # what the config is, for the report


@dataclass
class ConfigSamples:
    """What one config measured: disagreements (raw: NaN and inf kept) and seconds per timed side
    (``CANDIDATE``, each other candidate's name, ``BASELINE``)."""

    config: str
    params: dict[str, Any]
    seeds: list[int]
    input_sets: int
    skip_reason: Optional[str] = None  # set: the baseline was not run
    agree_rel_l2: Optional[float] = None  # candidate vs baseline, worst over the input sets
    others_agree_rel_l2: dict[str, float] = field(default_factory=dict)
    timed: bool = False  # False: the candidate disagreed and nothing was timed
    seconds: dict[str, list[float]] = field(default_factory=dict)
    host_seconds: dict[str, list[float]] = field(default_factory=dict)  # empty: the timer keeps none
    last_call_rel_l2: dict[str, float] = field(default_factory=dict)
    floor_s: Optional[float] = None


@dataclass
class SpeedMeasurement:
    """Every config's samples and how they were timed."""

    configs: list[ConfigSamples]
    timer: str
    lead_s: float
    others: list[str]


def rel_l2_disagreement(candidate_out: Any, baseline_out: Any) -> float:
    """Worst ``||c - b|| / ||b||`` over paired output tensors (float64); NaN/Inf gives inf."""
    import torch  # noqa: PLC0415

    cs, bs = flatten_tensors(candidate_out), flatten_tensors(baseline_out)
    if not cs or len(cs) != len(bs):
        raise ValueError(f"candidate returned {len(cs)} tensors and baseline {len(bs)}: cannot compare")
    worst = 0.0
    for c, b in zip(cs, bs):
        if tuple(c.shape) != tuple(b.shape):
            return math.inf
        c64, b64 = c.detach().to(torch.float64), b.detach().to(device=c.device, dtype=torch.float64)
        if not (bool(torch.isfinite(c64).all()) and bool(torch.isfinite(b64).all())):
            return math.inf
        num, den = float(torch.linalg.vector_norm(c64 - b64)), float(torch.linalg.vector_norm(b64))
        err = (0.0 if num == 0 else math.inf) if den == 0 else num / den
        worst = max(worst, err)
    return worst


def refresh_floats_(inputs: Any, seed: int) -> None:
    """Redraw every floating-point tensor of an input set in place (normal, same mean and std)."""
    import torch  # noqa: PLC0415

    for i, t in enumerate(flatten_tensors(inputs)):
        if t.dtype.is_floating_point and t.numel():
            gen = torch.Generator(device=t.device).manual_seed(seed + i)
            mean, std = float(t.float().mean()), float(t.float().std()) if t.numel() > 1 else 1.0
            t.normal_(mean, std if std > 0 else 1.0, generator=gen)


def _input_sets(cfg: SpeedConfig, trials: int, ctx: GateContext) -> tuple[list[Any], list[int]]:
    seeds = [ctx.fresh_seed() for _ in range(trials)]
    sets = [cfg.make_inputs(seed, ctx.device) for seed in seeds]
    if any(isinstance(s, list) for s in sets):
        raise ValueError(f"{cfg.name}: make_inputs must return one input set per seed (the gate draws "
                         f"spec.trials of them), got a list")
    return sets, seeds


def _agreement(sets: list[Any], fn, reference, agree) -> float:
    """Worst disagreement of ``fn`` with ``reference`` over the input sets (NaN kept)."""
    worst = 0.0
    for inputs in sets:
        # clone first: a reference writing into the same buffer must not make them agree trivially
        out = clone_tensors(fn(inputs))
        err = float(agree(out, reference(inputs)))
        worst = err if math.isnan(err) else max(worst, err)
    return worst


def _measure_config(cfg: SpeedConfig, candidate, baseline, ctx: GateContext, *, trials: int, warmup: int,
                    repeats: int, agree_max: float, timer: Timer, agree, floor_s,
                    others: dict[str, Callable[[Any], Any]]) -> ConfigSamples:
    sets, seeds = _input_sets(cfg, trials, ctx)
    got = ConfigSamples(config=cfg.name, params=cfg.params, seeds=seeds, input_sets=len(sets))
    with_baseline = not cfg.skip_baseline
    if with_baseline:
        got.agree_rel_l2 = _agreement(sets, candidate, baseline, agree)
        if not got.agree_rel_l2 <= agree_max:
            return got
    else:
        got.skip_reason = cfg.skip_reason or "no reason given"
    reference = baseline if with_baseline else candidate
    for name, fn in others.items():
        got.others_agree_rel_l2[name] = _agreement(sets, fn, reference, agree)
    timed_others = [name for name in others if got.others_agree_rel_l2[name] <= agree_max]
    refresh = cfg.refresh or refresh_floats_
    refresh_rng = ctx.fresh_seed()
    last: dict[str, dict[str, Any]] = {}

    def before_round(i: int) -> None:  # every set was used by the agreement check or warm-up
        refresh(sets[i % len(sets)], (refresh_rng + i) & 0x7FFFFFFF)

    def recording(key: str, fn):
        def call(i: int) -> Any:
            out = fn(sets[i % len(sets)])
            last[key] = {"out": out, "set": i % len(sets)}
            return out
        return call

    calls = {CANDIDATE: recording(CANDIDATE, candidate)}
    calls.update({name: recording(name, others[name]) for name in timed_others})
    if with_baseline:
        calls[BASELINE] = lambda i: baseline(sets[i % len(sets)])
    hosts = {key: [] for key in calls} if hasattr(timer, "host_seconds") else None
    got.seconds = round_robin(calls, warmup=warmup, repeats=repeats, timer=timer, host=hosts, before=before_round)
    got.host_seconds = hosts or {}
    got.timed = True
    for key in [CANDIDATE] + timed_others:
        if not with_baseline and key == CANDIDATE:
            continue
        out = clone_tensors(last[key]["out"])
        got.last_call_rel_l2[key] = float(agree(out, reference(sets[last[key]["set"]])))
    got.floor_s = floor_s(cfg) if floor_s is not None else None
    return got


def measure_speedup(configs: Iterable[SpeedConfig], candidate: Callable[[Any], Any], baseline: Callable[[Any], Any],
                    ctx: GateContext, *, trials: int, warmup: int, repeats: int, agree_max: float,
                    timer: Optional[Timer] = None, agree: Optional[Callable[[Any, Any], float]] = None,
                    floor_s: Optional[Callable[[SpeedConfig], Optional[float]]] = None,
                    others: Optional[dict[str, Callable[[Any], Any]]] = None) -> SpeedMeasurement:
    """Measure every config (module docstring). ``trials``, ``warmup``, ``repeats`` and
    ``agree_max`` are the speedup gate spec's (``trials``, ``warmup``, ``repeats``,
    ``agree_max_rel_l2``); ``timer`` defaults to `make_timer` (ctx.device, cold_l2=False,
    lead_s=0): launch cost included."""
    configs = list(configs)
    others = dict(others or {})
    timer = timer or make_timer(ctx.device, cold_l2=False, lead_s=0.0)
    agree = agree or rel_l2_disagreement
    measured = []
    for i, cfg in enumerate(configs):
        ctx.progress(f"speedup {cfg.name}", i / len(configs))
        measured.append(_measure_config(cfg, candidate, baseline, ctx, trials=trials, warmup=warmup,
                                        repeats=repeats, agree_max=agree_max, timer=timer, agree=agree,
                                        floor_s=floor_s, others=others))
    return SpeedMeasurement(configs=measured, timer=timer_label(timer), lead_s=getattr(timer, "lead_s", 0.0) or 0.0,
                            others=list(others))


def speed_protocol(spec: Any) -> dict[str, Any]:
    """`measure_speedup`'s protocol arguments from a `kdtree.gates.spec.SpeedupGateSpec`."""
    return {"trials": spec.trials, "warmup": spec.warmup, "repeats": spec.repeats, "agree_max": spec.agree_max_rel_l2}
