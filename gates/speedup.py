"""Speedup gate: candidate vs baseline, same process, outputs agreeing, timed interleaved.

Protocol:

- a config is a `SpeedConfig`: ``make_inputs(seed, device)`` returns one input set; the gate
  draws ``spec.trials`` (>= 2) of them, each from a fresh seed, and timing rotates among the sets
  round by round, so caches do not flatter a call that re-reads what the previous call left
  warm. ``refresh(inputs, seed)`` rewrites an input set's values in place (same shapes, same
  storage); the gate calls it before every timed round that reuses a set, so a candidate that
  keys a cache on shapes or pointers returns what it computed for other values. Without a
  ``refresh`` every floating-point tensor of the set is redrawn in place (`refresh_floats_`).
  A config may set ``skip_baseline`` with a
  ``skip_reason`` (say the baseline is estimated above 2 s): it is reported, left out of the
  speedup figures, and still counted for the roofline;
- ``candidate(inputs)`` and ``baseline(inputs)`` compute and return their outputs (a tensor or a
  dict / list / tuple of tensors);
- ``agree(candidate_out, baseline_out) -> float`` is the disagreement held against
  ``spec.agree_max_rel_l2`` (default: worst rel-L2 over the output tensors, NaN/Inf = infinite);
- ``timer(fn) -> seconds`` times one call (default `kdtree.gates.timing.default_timer`: CUDA
  events on a CUDA device, perf_counter otherwise, both counting host launch time; pass a
  `kdtree.gates.timing.cuda_event_timer` with a flush and a lead for GPU time only). A timer that
  keeps ``host_seconds`` (a `QueuedTimer`) also gets each side's median host time per call
  reported, and with a lead the calls whose host time overran it;
- ``floor_s(config) -> seconds | None`` is the roofline floor of the config.

Per config: agreement on every input set first (a config that disagrees is failed and its time
does not count), then ``spec.warmup`` calls of each, then ``spec.repeats`` timed calls of each
interleaved ``c, b, c, b, ...`` with the inputs refreshed between rounds; then what the
candidate's last timed call returned is held against the baseline on the inputs it was given
(status ``stale`` when they disagree: its time does not count). A roofline fraction (floor / candidate median) above
``spec.max_roofline`` is an impossible measurement: the gate's outcome is ``error``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from kdtree.gates.base import Figure, GateContext, GateResult, Outcome, verdict
from kdtree.gates.spec import SpeedupGateSpec
from kdtree.gates.tensors import clone_tensors, flatten_tensors
from kdtree.gates.timing import (  # noqa: F401 - re-exported: the timers belong to this gate's API
    Spread, Timer, cuda_event_timer, default_timer, interleaved, perf_counter_timer, round_robin, timer_label,
)


@dataclass(frozen=True)
class SpeedConfig:
    """A named input factory for one timed configuration."""

    name: str
    make_inputs: Callable[[int, str], Any]
    refresh: Optional[Callable[[Any, int], None]] = None  # new values in place (module docstring)
    skip_baseline: bool = False
    skip_reason: str = ""
    params: dict[str, Any] = field(default_factory=dict)  # what the config is, for the report


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


def _agreement(spec: SpeedupGateSpec, sets: list[Any], fn, reference, agree) -> float:
    """Worst disagreement of ``fn`` with ``reference`` over the input sets (NaN kept)."""
    worst = 0.0
    for inputs in sets:
        # clone first: a reference writing into the same buffer must not make them agree trivially
        out = clone_tensors(fn(inputs))
        err = float(agree(out, reference(inputs)))
        worst = err if math.isnan(err) else max(worst, err)
    return worst


def _finite(err: float) -> Optional[float]:
    return None if math.isnan(err) or math.isinf(err) else err


def _stale_message(name: str, err: float, spec: SpeedupGateSpec) -> str:
    return (f"{name}: the candidate's last timed call disagrees with the baseline on the "
            f"inputs it was given (rel-L2 {err:.3g} > {spec.agree_max_rel_l2:g}; the inputs "
            f"were changed in place between rounds): it returned what it did not compute "
            f"from them (a cache keyed on shapes or pointers?); its time does not count")


def _roofline(row: dict[str, Any], name: str, median_s: float, floor: Optional[float],
              spec: SpeedupGateSpec) -> None:
    if floor is None:
        return
    row["floor_ms"] = floor * 1e3
    row["roofline"] = floor / median_s if median_s > 0 else math.inf
    if row["roofline"] > spec.max_roofline and row["status"] != "stale":  # stale: a wrong answer first
        row["status"] = "impossible"
        row["message"] = (f"{name}: measurement impossible: candidate median "
                          f"{median_s * 1e3:.4g} ms is {row['roofline']:.3g}x its floor "
                          f"{floor * 1e3:.4g} ms (> {spec.max_roofline:g}); check the timer")


def _time_config(spec: SpeedupGateSpec, cfg: SpeedConfig, candidate, baseline, ctx: GateContext,
                 timer: Timer, agree, floor_s, others: dict[str, Callable[[Any], Any]]) -> dict[str, Any]:
    sets, seeds = _input_sets(cfg, spec.trials, ctx)
    row: dict[str, Any] = {"config": cfg.name, "params": cfg.params, "seeds": seeds, "input_sets": len(sets),
                           "status": "ok", "agree_rel_l2": None, "last_call_rel_l2": None, "speedup": None,
                           "roofline": None}
    other_rows: dict[str, dict[str, Any]] = {
        name: {"status": "ok", "agree_rel_l2": None, "last_call_rel_l2": None, "speedup": None, "roofline": None}
        for name in others}
    if others:
        row["others"] = other_rows
    with_baseline = not cfg.skip_baseline
    if with_baseline:
        worst = _agreement(spec, sets, candidate, baseline, agree)
        row["agree_rel_l2"] = _finite(worst)
        if not worst <= spec.agree_max_rel_l2:
            row["status"] = "disagree"
            row["message"] = (f"{cfg.name}: candidate and baseline disagree (rel-L2 {worst:.3g} > "
                              f"{spec.agree_max_rel_l2:g}); its time does not count")
            for orow in other_rows.values():
                orow["status"] = "not timed"
                orow["message"] = f"{cfg.name}: not timed: the candidate disagrees with the baseline"
            return row
    else:
        row["status"] = "baseline skipped"
        row["message"] = f"{cfg.name}: baseline not run ({cfg.skip_reason or 'no reason given'})"
    # other candidates are held against the baseline, or against the candidate where the baseline is skipped
    reference = baseline if with_baseline else candidate
    for name, fn in others.items():
        worst = _agreement(spec, sets, fn, reference, agree)
        orow = other_rows[name]
        orow["agree_rel_l2"] = _finite(worst)
        if not worst <= spec.agree_max_rel_l2:
            orow["status"] = "disagree"
            orow["message"] = (f"{cfg.name} ({name}): disagrees with the "
                               f"{'baseline' if with_baseline else 'candidate'} (rel-L2 {worst:.3g} > "
                               f"{spec.agree_max_rel_l2:g}); its time does not count")
    timed_others = [name for name in others if other_rows[name]["status"] == "ok"]
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

    calls = [recording("", candidate)] + [recording(name, others[name]) for name in timed_others]
    if with_baseline:
        calls.append(lambda i: baseline(sets[i % len(sets)]))
    hosts: Optional[list[list[float]]] = [[] for _ in calls] if hasattr(timer, "host_seconds") else None
    times = round_robin(calls, warmup=spec.warmup, repeats=spec.repeats, timer=timer, host=hosts,
                        before=before_round)
    sides = [("", row)] + [(name, other_rows[name]) for name in timed_others]
    for key, side_row in sides:
        if not with_baseline and key == "":
            continue
        got = clone_tensors(last[key]["out"])
        err = float(agree(got, reference(sets[last[key]["set"]])))
        side_row["last_call_rel_l2"] = _finite(err)
        if not err <= spec.agree_max_rel_l2:
            side_row["status"] = "stale"
            side_row["message"] = _stale_message(cfg.name + (f" ({key})" if key else ""), err, spec)
    base = Spread.of(times[-1]) if with_baseline else None
    if base is not None:
        row["baseline"] = base.ms()
    floor = floor_s(cfg) if floor_s is not None else None
    lead = getattr(timer, "lead_s", 0.0) or 0.0
    for k, (key, side_row) in enumerate(sides):
        spread = Spread.of(times[k])
        side_row["candidate" if key == "" else "ms"] = spread.ms()
        if base is not None:
            side_row["speedup"] = base.median / spread.median if spread.median > 0 else math.inf
        if hosts is not None and hosts[k]:
            side_row["candidate_host_us" if key == "" else "host_us"] = statistics.median(hosts[k]) * 1e6
            if lead:
                side_row["candidate_lead_overruns" if key == "" else "lead_overruns"] = sum(h > lead for h in hosts[k])
        _roofline(side_row, cfg.name + (f" ({key})" if key else ""), spread.median, floor, spec)
    if hosts is not None and with_baseline and hosts[-1]:
        row["baseline_host_us"] = statistics.median(hosts[-1]) * 1e6
        if lead:
            row["baseline_lead_overruns"] = sum(h > lead for h in hosts[-1])
    return row


def _agg(values: list[float], fn) -> float:
    return fn(values) if values else math.nan


def _other_figures(name: str, rows: list[dict[str, Any]], spec: SpeedupGateSpec,
                   with_roofline: bool) -> tuple[list[Figure], list[dict[str, Any]]]:
    """The figures of other candidate ``name`` (prefixed ``name_``) and its rows that went wrong."""
    sides = [r["others"][name] for r in rows if name in r.get("others", {})]
    speedups = [s["speedup"] for s in sides if s["status"] in ("ok", "impossible") and s["speedup"] is not None]
    rooflines = [s["roofline"] for s in sides if s["status"] in ("ok", "impossible") and s["roofline"] is not None]
    bad = [s for s in sides if s["status"] in ("disagree", "stale", "impossible")]
    figures = [
        Figure(name=f"{name}_median_speedup", value=_agg(speedups, statistics.median), unit="x"),
        Figure(name=f"{name}_min_speedup", value=_agg(speedups, min), unit="x"),
        Figure(name=f"{name}_disagreeing_configs", value=sum(s["status"] == "disagree" for s in sides),
               op="<=", threshold=0),
        Figure(name=f"{name}_stale_configs", value=sum(s["status"] == "stale" for s in sides), op="<=", threshold=0),
        Figure(name=f"{name}_configs_timed", value=len(speedups)),
    ]
    if rooflines or with_roofline:
        figures += [Figure(name=f"{name}_median_roofline", value=_agg(rooflines, statistics.median)),
                    Figure(name=f"{name}_min_roofline", value=_agg(rooflines, min)),
                    Figure(name=f"{name}_max_roofline", value=_agg(rooflines, max), op="<=",
                           threshold=spec.max_roofline)]
    return figures, bad


def check_speedup(spec: SpeedupGateSpec, configs: Iterable[SpeedConfig], candidate: Callable[[Any], Any],
                  baseline: Callable[[Any], Any], ctx: GateContext, *, timer: Optional[Timer] = None,
                  agree: Optional[Callable[[Any, Any], float]] = None,
                  floor_s: Optional[Callable[[SpeedConfig], Optional[float]]] = None,
                  others: Optional[dict[str, Callable[[Any], Any]]] = None) -> GateResult:
    """Time every config (see the module docstring) and hold the speedups against the spec.

    Figures: ``median_speedup`` (key, ``>= spec.min_median_speedup``), ``min_speedup``
    (``>= spec.min_each_speedup``), ``disagreeing_configs`` (must be 0), ``configs_timed``, and
    when the spec sets them ``median_roofline`` / ``min_roofline``. Details: ``configs`` (one row
    per config: candidate and baseline median/min/max ms, speedup, roofline, status, and with a
    `QueuedTimer` ``candidate_host_us`` / ``baseline_host_us`` (median host time per call) and
    ``*_lead_overruns``), ``timer`` (its label), and then ``host_us_median`` (median over configs
    per side) and ``lead_overruns`` (calls per side whose host time exceeded the timer's lead).

    ``others`` (name -> callable, same inputs and outputs as ``candidate``): more candidates timed
    in the same rounds (``candidate, others..., baseline``), each held to the same protocol: its
    outputs agree with the baseline's on every input set before its time counts and its last timed
    call is checked. Each adds ``NAME_median_speedup`` / ``NAME_min_speedup`` (reported: the
    spec's speedup thresholds hold the candidate only), ``NAME_disagreeing_configs`` and
    ``NAME_stale_configs`` (must be 0: a wrong answer fails the gate), ``NAME_configs_timed`` and,
    with a floor, ``NAME_median_roofline`` / ``NAME_min_roofline`` / ``NAME_max_roofline`` (an
    impossible one is an ``error``). Its per-config rows are ``configs[i]["others"][NAME]``.
    """
    configs = list(configs)
    others = dict(others or {})
    for name in others:
        if not name.isidentifier() or name in ("median", "min", "max", "disagreeing", "stale", "configs"):
            raise ValueError(f"others: {name!r} cannot prefix figure names; use an identifier such as sm120_path")
    if not configs:
        return GateResult(gate=spec.name, kind=spec.kind, outcome=Outcome.ERROR,
                          summary="no speedup configs were given: measured nothing")
    wants_roofline = spec.min_roofline_median is not None or spec.min_roofline_each is not None
    if wants_roofline and floor_s is None:
        raise ValueError("the spec holds roofline fractions but no floor_s was given")
    timer = timer or default_timer(ctx.device)
    agree = agree or rel_l2_disagreement
    rows = []
    for i, cfg in enumerate(configs):
        ctx.progress(f"speedup {cfg.name}", i / len(configs))
        rows.append(_time_config(spec, cfg, candidate, baseline, ctx, timer, agree, floor_s, others))

    counted = [r for r in rows if r["status"] in ("ok", "impossible")]
    stale = [r for r in rows if r["status"] == "stale"]
    speedups = [r["speedup"] for r in counted if r["speedup"] is not None]
    rooflines = [r["roofline"] for r in rows if r["status"] in ("ok", "baseline skipped", "impossible")
                 and r["roofline"] is not None]
    disagree = [r for r in rows if r["status"] == "disagree"]
    impossible = [r for r in rows if r["status"] == "impossible"]
    figures = [
        Figure(name="median_speedup", value=_agg(speedups, statistics.median), unit="x", op=">=",
               threshold=spec.min_median_speedup, key=True),
        Figure(name="min_speedup", value=_agg(speedups, min), unit="x", op=">=", threshold=spec.min_each_speedup),
        Figure(name="disagreeing_configs", value=len(disagree), op="<=", threshold=0),
        Figure(name="stale_configs", value=len(stale), op="<=", threshold=0),
        Figure(name="configs_timed", value=len(speedups)),
    ]
    if rooflines or wants_roofline:
        figures.append(Figure(name="median_roofline", value=_agg(rooflines, statistics.median),
                              op=">=" if spec.min_roofline_median else None,
                              threshold=spec.min_roofline_median))
        figures.append(Figure(name="min_roofline", value=_agg(rooflines, min),
                              op=">=" if spec.min_roofline_each else None, threshold=spec.min_roofline_each))
        figures.append(Figure(name="max_roofline", value=_agg(rooflines, max), op="<=",
                              threshold=spec.max_roofline))
    other_bad: list[dict[str, Any]] = []
    for name in others:
        more, bad = _other_figures(name, rows, spec, bool(rooflines) or wants_roofline)
        figures += more
        other_bad += bad
    messages = [r["message"] for r in impossible + stale + disagree + other_bad
                + [r for r in rows if r["status"] == "baseline skipped"]]
    details = {"configs": rows, "timer": timer_label(timer), "warmup": spec.warmup, "repeats": spec.repeats,
               "trials": spec.trials, "baseline": spec.baseline}
    for side in ("candidate", "baseline"):
        host = [r[f"{side}_host_us"] for r in rows if f"{side}_host_us" in r]
        if host:
            details.setdefault("host_us_median", {})[side] = statistics.median(host)
        overruns = [r[f"{side}_lead_overruns"] for r in rows if f"{side}_lead_overruns" in r]
        if overruns:
            details.setdefault("lead_overruns", {})[side] = sum(overruns)
    if impossible or any(r["status"] == "impossible" for r in other_bad):
        return GateResult(gate=spec.name, kind=spec.kind, outcome=Outcome.ERROR, figures=figures,
                          summary="; ".join(messages[:3]), details=details)
    summary = "; ".join(messages[:3])
    if speedups:
        summary = (f"median speedup {statistics.median(speedups):.3g}x over {len(speedups)} configs "
                   f"(min {min(speedups):.3g}x) vs {spec.baseline}") + ("; " + summary if summary else "")
    else:
        summary = "no config was timed against the baseline" + ("; " + summary if summary else "")
    return verdict(spec.name, spec.kind, figures, summary, **details)
