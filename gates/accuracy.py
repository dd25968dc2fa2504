"""Accuracy gate: a candidate against an independent oracle on fresh random inputs, outputs poisoned.

Protocol (a phase binds it to its op):

- a case is an `AccuracyCase`: ``make_inputs(seed, device) -> dict`` draws the inputs from the seed
  (a new seed every trial, from ``ctx.fresh_seed()``), ``make_outputs(inputs) -> dict[str, Tensor]``
  allocates the output buffers the candidate writes;
- ``oracle(inputs) -> dict[str, Tensor]`` computes the expected outputs (in higher precision,
  independently of the candidate); it runs *before* the candidate, so a candidate that mutates
  its inputs cannot move the reference;
- ``candidate(inputs, outputs) -> None`` writes every output buffer in place. Before every call
  each buffer is poisoned (`kdtree.gates.tensors.poison_`), so an element it never writes is
  reported as unwritten, with how many and where the first one is.

Every output is checked for unwritten and NaN/Inf elements. The output named ``lse_key``
("lse" unless told) is held against ``spec.max_lse_abs`` (max-abs) when ``spec.check_lse``; when
``check_lse`` is off it is not allocated for the candidate at all. Every other output is held
against ``spec.max_rel_l2`` (rel-L2 ``||out-ref||/||ref||``) and ``spec.max_abs``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from kdtree.gates.base import Figure, GateContext, GateResult, Outcome, verdict
from kdtree.gates.spec import AccuracyGateSpec
from kdtree.gates.tensors import compare, poison_


@dataclass(frozen=True)
class AccuracyCase:
    """A named generator of inputs and their output buffers."""

    name: str
    make_inputs: Callable[[int, str], dict[str, Any]]
    make_outputs: Callable[[dict[str, Any]], dict[str, Any]]
    params: dict[str, Any] = field(default_factory=dict)  # what the case is, for the report


Candidate = Callable[[dict[str, Any], dict[str, Any]], None]
Oracle = Callable[[dict[str, Any]], dict[str, Any]]


def _worst(values: Iterable[float]) -> float:
    """The largest value; NaN (a trial that could not be measured) beats everything."""
    vals = list(values)
    if not vals:
        return math.nan
    if any(math.isnan(v) for v in vals):
        return math.nan
    return max(vals)


def _run_trial(spec: AccuracyGateSpec, case: AccuracyCase, seed: int, candidate: Candidate,
               oracle: Oracle, ctx: GateContext, lse_key: str) -> dict[str, Any]:
    inputs = case.make_inputs(seed, ctx.device)
    outputs = dict(case.make_outputs(inputs))
    if not spec.check_lse:
        outputs.pop(lse_key, None)
    if not outputs:
        raise ValueError(f"case {case.name!r}: make_outputs returned no output buffers")
    expected = oracle(inputs)
    missing = [k for k in outputs if k not in expected]
    if missing:
        raise ValueError(f"case {case.name!r}: the oracle returned no {missing} (it gave {sorted(expected)})")
    for buf in outputs.values():
        poison_(buf)
    candidate(inputs, outputs)
    trial: dict[str, Any] = {"seed": seed, "rel_l2": 0.0, "max_abs": 0.0, "lse_abs": None,
                             "problems": [], "outputs": []}
    for key, buf in outputs.items():
        cmp = compare(key, buf, expected[key])
        trial["outputs"].append(cmp.as_row())
        trial["problems"].extend(cmp.problems)
        if key == lse_key:
            trial["lse_abs"] = cmp.max_abs
            if cmp.max_abs > spec.max_lse_abs:
                trial["problems"].append(f"{key}: max-abs {cmp.max_abs:.3g} > {spec.max_lse_abs:g}")
            continue
        trial["rel_l2"] = _worst([trial["rel_l2"], cmp.rel_l2])
        trial["max_abs"] = _worst([trial["max_abs"], cmp.max_abs])
        if cmp.rel_l2 > spec.max_rel_l2:
            trial["problems"].append(f"{key}: rel-L2 {cmp.rel_l2:.3g} > {spec.max_rel_l2:g}")
        if cmp.max_abs > spec.max_abs:
            trial["problems"].append(f"{key}: max-abs {cmp.max_abs:.3g} > {spec.max_abs:g}")
    return trial


def _num(x: Optional[float]) -> Optional[float]:
    return None if x is None or math.isnan(x) or math.isinf(x) else x


def check_accuracy(spec: AccuracyGateSpec, cases: Iterable[AccuracyCase], candidate: Candidate,
                   oracle: Oracle, ctx: GateContext, *, lse_key: str = "lse") -> GateResult:
    """Run ``spec.trials`` fresh-seeded trials of every case; see the module docstring.

    Figures: ``worst_rel_l2`` (key), ``worst_max_abs``, ``worst_lse_abs`` (when ``check_lse``),
    ``unwritten_elements`` and ``non_finite_elements`` (both must be 0), ``trials`` (cases x
    trials). Details: ``seeds`` (case, trial, seed: every failure is reproducible), ``cases``
    (a row per case) and ``failures`` (the first few problems with their seeds).
    """
    cases = list(cases)
    if not cases:
        return GateResult(gate=spec.name, kind=spec.kind, outcome=Outcome.ERROR,
                          summary="no accuracy cases were given: measured nothing")
    names = [c.name for c in cases]
    if len(set(names)) != len(names):
        raise ValueError(f"accuracy case names must be unique: {names}")
    seeds: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    all_trials: list[dict[str, Any]] = []
    total = len(cases) * spec.trials
    for ci, case in enumerate(cases):
        trials = []
        for t in range(spec.trials):
            seed = ctx.fresh_seed()
            seeds.append({"case": case.name, "trial": t, "seed": seed})
            ctx.progress(f"accuracy {case.name} trial {t + 1}/{spec.trials}", (ci * spec.trials + t) / total)
            trial = _run_trial(spec, case, seed, candidate, oracle, ctx, lse_key)
            trials.append(trial)
            for problem in trial["problems"]:
                failures.append({"case": case.name, "seed": seed, "problem": problem})
        all_trials.extend(trials)
        rows.append({
            "case": case.name, "params": case.params, "trials": len(trials),
            "worst_rel_l2": _num(_worst(tr["rel_l2"] for tr in trials)),
            "worst_max_abs": _num(_worst(tr["max_abs"] for tr in trials)),
            "worst_lse_abs": _num(_worst(tr["lse_abs"] for tr in trials if tr["lse_abs"] is not None)),
            "unwritten": sum(o["unwritten"] for tr in trials for o in tr["outputs"]),
            "non_finite": sum(o["non_finite"] for tr in trials for o in tr["outputs"]),
            "failed_seeds": sorted({tr["seed"] for tr in trials if tr["problems"]}),
        })

    lse_seen = [tr["lse_abs"] for tr in all_trials if tr["lse_abs"] is not None]
    figures = [
        Figure(name="worst_rel_l2", value=_worst(tr["rel_l2"] for tr in all_trials), op="<=",
               threshold=spec.max_rel_l2, key=True),
        Figure(name="worst_max_abs", value=_worst(tr["max_abs"] for tr in all_trials), op="<=",
               threshold=spec.max_abs),
    ]
    if spec.check_lse:
        if not lse_seen:
            raise ValueError(f"spec.check_lse is set but no case has an output named {lse_key!r}")
        figures.append(Figure(name="worst_lse_abs", value=_worst(lse_seen), op="<=",
                              threshold=spec.max_lse_abs))
    figures += [
        Figure(name="unwritten_elements", value=sum(r["unwritten"] for r in rows), op="<=", threshold=0),
        Figure(name="non_finite_elements", value=sum(r["non_finite"] for r in rows), op="<=", threshold=0),
        Figure(name="trials", value=len(all_trials), op=">=", threshold=1),
    ]
    summary = ""
    if failures:
        shown = "; ".join(f"case {f['case']!r} seed {f['seed']}: {f['problem']}" for f in failures[:3])
        more = f" (+{len(failures) - 3} more)" if len(failures) > 3 else ""
        summary = shown + more
    result = verdict(spec.name, spec.kind, figures, summary, seeds=seeds, cases=rows,
                     failures=failures[:50])
    if failures and result.outcome is Outcome.PASSED:  # every problem is a failure, figures or not
        result.outcome = Outcome.FAILED
    return result
