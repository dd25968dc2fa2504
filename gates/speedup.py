"""Speedup gate: judges what `kdtree.bench.speed.measure_speedup` measured.

The measurement (`kdtree.bench.speed`) times a candidate, other candidates and a baseline
interleaved on the same input sets, after checking their outputs agree. The gate turns each
config's samples into a row and holds the rows against the spec:

- a config whose candidate disagrees with the baseline (worst rel-L2 over its input sets above
  ``spec.agree_max_rel_l2``, NaN included) is ``disagree``: it was not timed and does not count;
- a config whose candidate's last timed call disagrees on the inputs it was given is ``stale``
  (it returned what it did not compute from them): its time does not count;
- a config measured without its baseline is ``baseline skipped``: it is reported, left out of
  the speedup figures, and still counted for the roofline;
- a roofline fraction (floor / candidate median) above ``spec.max_roofline`` is an impossible
  measurement: the gate's outcome is ``error``.

Speedups are ratios of medians (`kdtree.gates.stats.Spread`); other candidates are held to the
same rules and add figures prefixed with their name.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Optional

from kdtree.gates.base import Figure, GateContext, GateResult, Outcome, verdict
from kdtree.gates.spec import SpeedupGateSpec
from kdtree.gates.stats import Spread

CANDIDATE, BASELINE = "", "baseline"  # the keys of a config's timed sides (as kdtree.bench.speed has them)
RESERVED = ("median", "min", "max", "disagreeing", "stale", "configs")


def _finite(err: Optional[float]) -> Optional[float]:
    return None if err is None or math.isnan(err) or math.isinf(err) else err


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


def config_row(spec: SpeedupGateSpec, m: Any, others: list[str], lead: float) -> dict[str, Any]:
    """The report row of one config's samples (`kdtree.bench.speed.ConfigSamples`), with its status."""
    row: dict[str, Any] = {"config": m.config, "params": m.params, "seeds": m.seeds, "input_sets": m.input_sets,
                           "status": "ok", "agree_rel_l2": None, "last_call_rel_l2": None, "speedup": None,
                           "roofline": None}
    other_rows: dict[str, dict[str, Any]] = {
        name: {"status": "ok", "agree_rel_l2": None, "last_call_rel_l2": None, "speedup": None, "roofline": None}
        for name in others}
    if others:
        row["others"] = other_rows
    with_baseline = m.skip_reason is None
    if with_baseline:
        row["agree_rel_l2"] = _finite(m.agree_rel_l2)
        if not m.agree_rel_l2 <= spec.agree_max_rel_l2:
            row["status"] = "disagree"
            row["message"] = (f"{m.config}: candidate and baseline disagree (rel-L2 {m.agree_rel_l2:.3g} > "
                              f"{spec.agree_max_rel_l2:g}); its time does not count")
            for orow in other_rows.values():
                orow["status"] = "not timed"
                orow["message"] = f"{m.config}: not timed: the candidate disagrees with the baseline"
            return row
    else:
        row["status"] = "baseline skipped"
        row["message"] = f"{m.config}: baseline not run ({m.skip_reason})"
    for name in others:
        worst = m.others_agree_rel_l2[name]
        orow = other_rows[name]
        orow["agree_rel_l2"] = _finite(worst)
        if not worst <= spec.agree_max_rel_l2:
            orow["status"] = "disagree"
            orow["message"] = (f"{m.config} ({name}): disagrees with the "
                               f"{'baseline' if with_baseline else 'candidate'} (rel-L2 {worst:.3g} > "
                               f"{spec.agree_max_rel_l2:g}); its time does not count")
    timed_others = [name for name in others if other_rows[name]["status"] == "ok"]
    sides = [(CANDIDATE, row)] + [(name, other_rows[name]) for name in timed_others]
    for key, side_row in sides:
        if key not in m.last_call_rel_l2:
            continue
        err = m.last_call_rel_l2[key]
        side_row["last_call_rel_l2"] = _finite(err)
        if not err <= spec.agree_max_rel_l2:
            side_row["status"] = "stale"
            side_row["message"] = _stale_message(m.config + (f" ({key})" if key else ""), err, spec)
    base = Spread.of(m.seconds[BASELINE]) if with_baseline else None
    if base is not None:
        row["baseline"] = base.ms()
    for key, side_row in sides:
        spread = Spread.of(m.seconds[key])
        side_row["candidate" if key == CANDIDATE else "ms"] = spread.ms()
        if base is not None:
            side_row["speedup"] = base.median / spread.median if spread.median > 0 else math.inf
        hosts = m.host_seconds.get(key)
        if hosts:
            side_row["candidate_host_us" if key == CANDIDATE else "host_us"] = statistics.median(hosts) * 1e6
            if lead:
                side_row["candidate_lead_overruns" if key == CANDIDATE else "lead_overruns"] = \
                    sum(h > lead for h in hosts)
        _roofline(side_row, m.config + (f" ({key})" if key else ""), spread.median, m.floor_s, spec)
    hosts = m.host_seconds.get(BASELINE)
    if with_baseline and hosts:
        row["baseline_host_us"] = statistics.median(hosts) * 1e6
        if lead:
            row["baseline_lead_overruns"] = sum(h > lead for h in hosts)
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


def judge_speedup(spec: SpeedupGateSpec, measured: Any, ctx: Optional[GateContext] = None) -> GateResult:
    """Hold a `kdtree.bench.speed.SpeedMeasurement` against the spec (see the module docstring).

    Figures: ``median_speedup`` (key, ``>= spec.min_median_speedup``), ``min_speedup``
    (``>= spec.min_each_speedup``), ``disagreeing_configs`` and ``stale_configs`` (must be 0),
    ``configs_timed``, and when the spec sets them or floors were measured ``median_roofline`` /
    ``min_roofline`` / ``max_roofline``. Details: ``configs`` (one row per config: candidate and
    baseline median/min/max ms, speedup, roofline, status, and with a timer that keeps host times
    ``candidate_host_us`` / ``baseline_host_us`` and ``*_lead_overruns``), ``timer`` (its label),
    ``host_us_median`` and ``lead_overruns`` per side.

    Each other candidate NAME adds ``NAME_median_speedup`` / ``NAME_min_speedup`` (reported: the
    spec's speedup thresholds hold the candidate only), ``NAME_disagreeing_configs`` and
    ``NAME_stale_configs`` (must be 0: a wrong answer fails the gate), ``NAME_configs_timed`` and,
    with floors, ``NAME_median_roofline`` / ``NAME_min_roofline`` / ``NAME_max_roofline``. Its
    per-config rows are ``configs[i]["others"][NAME]``.
    """
    others = list(measured.others)
    for name in others:
        if not name.isidentifier() or name in RESERVED:
            raise ValueError(f"others: {name!r} cannot prefix figure names; use an identifier such as sm120_path")
    if not measured.configs:
        return GateResult(gate=spec.name, kind=spec.kind, outcome=Outcome.ERROR,
                          summary="no speedup configs were given: measured nothing")
    wants_roofline = spec.min_roofline_median is not None or spec.min_roofline_each is not None
    if wants_roofline and all(m.floor_s is None for m in measured.configs if m.timed):
        raise ValueError("the spec holds roofline fractions but no floor_s was given")
    timer = measured.timer
    rows = [config_row(spec, m, others, measured.lead_s) for m in measured.configs]

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
    details = {"configs": rows, "timer": timer, "warmup": spec.warmup, "repeats": spec.repeats,
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
