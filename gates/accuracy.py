"""Accuracy gate: a candidate against an independent oracle on fresh random inputs.

Protocol (a phase binds it to its op):

- a case is an `AccuracyCase`: ``make_inputs(seed, device) -> dict`` draws the inputs from the seed
  (a new seed every trial, from ``ctx.fresh_seed()``), ``make_outputs(inputs) -> dict[str, Tensor]``
  allocates the output buffers the candidate writes; ``may_allocate`` names the outputs the
  candidate allocates itself when it is handed None for them (``out=None``);
- ``oracle(inputs) -> dict[str, Tensor]`` computes the expected outputs (in higher precision,
  independently of the candidate); it runs *before* the candidate, so a candidate that mutates
  its inputs cannot move the reference;
- ``candidate(inputs, outputs) -> dict | None`` writes every output buffer it is given in place,
  and returns (in a dict) the outputs it was handed None for.

Nothing tells a candidate that it runs inside the gate. The (case, trial) pairs run in a random
order, and each trial hands the candidate its buffers in one of three ways (every case gets a
poisoned trial; the rest are drawn at random and recorded with the seed):

- ``poisoned``: every buffer is filled with a poison drawn fresh for that trial
  (`kdtree.gates.tensors.poison_`: NaNs with random payloads), so an element the candidate never
  writes is reported as unwritten, with how many and where the first one is;
- ``stale``: the buffers hold finite values at the scale of the expected output, as a buffer
  reused from an earlier call would (what is left unwritten shows up in the numbers);
- ``none``: the outputs named in ``may_allocate`` are passed as None and must be returned.

Every output is checked for unwritten and NaN/Inf elements. The output named ``lse_key``
("lse" unless told) is held against ``spec.max_lse_abs`` (max-abs) when ``spec.check_lse``; when
``check_lse`` is off it is not allocated for the candidate at all. Every other output is held
against ``spec.max_rel_l2`` (``||out-ref|| / ||ref||`` over the whole output),
``spec.max_abs_rel`` (``max|out-ref| / max|ref|``: relative to the output's own scale),
``spec.max_abs`` when the spec states an absolute bound, and ``spec.max_row_rel`` when set: per
row (the last dim), ``||out_r - ref_r|| / scale_r``, where ``row_scale(inputs, expected)`` states
each row's scale (the error a correct candidate's rounding may make grows with it) and defaults
to ``||ref_r||``. The row check is what sees an error confined to a few rows, which the norms over
the whole output dilute.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from kdtree.gates.base import Figure, GateContext, GateResult, Outcome, verdict
from kdtree.gates.spec import AccuracyGateSpec
from kdtree.gates.tensors import compare, fill_stale_, poison_

BUFFER_MODES = ("poisoned", "stale", "none")


@dataclass(frozen=True)
class AccuracyCase:
    """A named generator of inputs and their output buffers."""

    name: str
    make_inputs: Callable[[int, str], dict[str, Any]]
    make_outputs: Callable[[dict[str, Any]], dict[str, Any]]
    params: dict[str, Any] = field(default_factory=dict)  # what the case is, for the report
    may_allocate: tuple[str, ...] = ()  # outputs the candidate allocates when handed None


Candidate = Callable[[dict[str, Any], dict[str, Any]], Optional[dict[str, Any]]]
Oracle = Callable[[dict[str, Any]], dict[str, Any]]
RowScale = Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]


def kept_failures(failures: list[dict[str, Any]], limit: int = 50) -> list[dict[str, Any]]:
    """The failures a record keeps: the first problem of every failing case (so every failing
    case is named, however many there are), then later problems in order up to `limit` in all."""
    first: dict[str, dict[str, Any]] = {}
    for f in failures:
        first.setdefault(f["case"], f)
    rest = [f for f in failures if first[f["case"]] is not f]
    return list(first.values()) + rest[:max(0, limit - len(first))]


def _worst(values: Iterable[float]) -> float:
    """The largest value; NaN (a trial that could not be measured) beats everything."""
    vals = list(values)
    if not vals:
        return math.nan
    if any(math.isnan(v) for v in vals):
        return math.nan
    return max(vals)


def trial_modes(cases: list[AccuracyCase], trials: int, rng: random.Random) -> list[list[str]]:
    """How each trial of each case hands over its buffers: every case gets one ``poisoned`` trial;
    its other trials take turns (across cases, from a random start) at ``stale`` and ``none``
    (``none`` only where the case names outputs the candidate may allocate); then each case's
    list is shuffled."""
    others = [m for m in BUFFER_MODES if m != "poisoned"]
    rng.shuffle(others)
    turn = 0
    out = []
    for case in cases:
        modes = ["poisoned"]
        while len(modes) < trials:
            mode = others[turn % len(others)]
            turn += 1
            modes.append("stale" if mode == "none" and not case.may_allocate else mode)
        rng.shuffle(modes)
        out.append(modes)
    return out


def _row_errors(out, ref, scale):
    """Per-row ``||out_r - ref_r|| / scale_r`` over the last dim (float64), as a flat tensor."""
    import torch  # noqa: PLC0415

    o = out.detach().to(torch.float64)
    r = ref.detach().to(device=o.device, dtype=torch.float64)
    err = torch.linalg.vector_norm(o - r, dim=-1)
    sc = scale.detach().to(device=o.device, dtype=torch.float64).expand_as(err)
    rel = torch.where(sc > 0, err / sc.clamp_min(1e-300), torch.where(err > 0, math.inf, 0.0))
    return rel.reshape(-1)


def _run_trial(spec: AccuracyGateSpec, case: AccuracyCase, seed: int, mode: str, candidate: Candidate,
               oracle: Oracle, ctx: GateContext, lse_key: str, row_scale: Optional[RowScale]) -> dict[str, Any]:
    import torch  # noqa: PLC0415

    inputs = case.make_inputs(seed, ctx.device)
    outputs = dict(case.make_outputs(inputs))
    if not spec.check_lse:
        outputs.pop(lse_key, None)
    if not outputs:
        raise ValueError(f"case {case.name!r}: make_outputs returned no output buffers")
    unknown = [k for k in case.may_allocate if k not in outputs]
    if unknown:
        raise ValueError(f"case {case.name!r}: may_allocate names {unknown}, which make_outputs does not make")
    expected = oracle(inputs)
    missing = [k for k in outputs if k not in expected]
    if missing:
        raise ValueError(f"case {case.name!r}: the oracle returned no {missing} (it gave {sorted(expected)})")
    poisons: dict[str, Any] = {}
    given: dict[str, Any] = dict(outputs)
    buf_rng = random.Random(seed ^ 0x5EED)
    for key, buf in outputs.items():
        if mode == "none" and key in case.may_allocate:
            given[key] = None
        elif mode == "stale":
            ref = expected[key].detach().to(torch.float64)
            finite = ref[torch.isfinite(ref)]
            scale = float(finite.pow(2).mean().sqrt()) if finite.numel() else 1.0
            fill_stale_(buf, scale, buf_rng.getrandbits(32))
        else:
            poisons[key] = poison_(buf, buf_rng.getrandbits(32))
    returned = candidate(inputs, given) or {}
    produced = dict(given)
    trial: dict[str, Any] = {"seed": seed, "buffers": mode, "rel_l2": 0.0, "max_abs": 0.0, "max_abs_rel": 0.0,
                             "row_rel": 0.0, "lse_abs": None, "problems": [], "outputs": []}
    for key in outputs:
        if given[key] is None:
            produced[key] = returned.get(key)
            if produced[key] is None:
                trial["problems"].append(f"{key}: handed None (out=None), the candidate returned no {key!r}")
                trial["rel_l2"] = trial["max_abs"] = trial["max_abs_rel"] = trial["row_rel"] = math.nan
                continue
    scales = row_scale(inputs, expected) if (row_scale is not None and spec.max_row_rel is not None) else {}
    for key in outputs:
        buf = produced.get(key)
        if buf is None:
            continue
        cmp = compare(key, buf, expected[key], poison=poisons.get(key))
        trial["outputs"].append(cmp.as_row())
        trial["problems"].extend(cmp.problems)
        if key == lse_key:
            trial["lse_abs"] = cmp.max_abs
            if cmp.max_abs > spec.max_lse_abs:
                trial["problems"].append(f"{key}: max-abs {cmp.max_abs:.3g} > {spec.max_lse_abs:g}")
            continue
        ref_max = float(expected[key].detach().abs().max()) if expected[key].numel() else 0.0
        abs_rel = cmp.max_abs / ref_max if ref_max > 0 else (0.0 if cmp.max_abs == 0 else math.inf)
        trial["rel_l2"] = _worst([trial["rel_l2"], cmp.rel_l2])
        trial["max_abs"] = _worst([trial["max_abs"], cmp.max_abs])
        trial["max_abs_rel"] = _worst([trial["max_abs_rel"], abs_rel if not math.isnan(cmp.max_abs) else math.nan])
        if cmp.rel_l2 > spec.max_rel_l2:
            trial["problems"].append(f"{key}: rel-L2 {cmp.rel_l2:.3g} > {spec.max_rel_l2:g}")
        if abs_rel > spec.max_abs_rel:
            trial["problems"].append(f"{key}: max-abs {cmp.max_abs:.3g} is {abs_rel:.3g} of the output's "
                                     f"max {ref_max:.3g} (> {spec.max_abs_rel:g})")
        if spec.max_abs is not None and cmp.max_abs > spec.max_abs:
            trial["problems"].append(f"{key}: max-abs {cmp.max_abs:.3g} > {spec.max_abs:g}")
        if spec.max_row_rel is not None and not cmp.problems and buf.dim() >= 1:
            ref = expected[key]
            scale = scales.get(key)
            if scale is None:
                scale = torch.linalg.vector_norm(ref.detach().to(torch.float64), dim=-1)
            rows = _row_errors(buf, ref, scale)
            worst = float(rows.max()) if rows.numel() else 0.0
            trial["row_rel"] = _worst([trial["row_rel"], worst])
            if worst > spec.max_row_rel:
                bad = int((rows > spec.max_row_rel).sum())
                first = int(rows.argmax())
                trial["problems"].append(
                    f"{key}: {bad} of {rows.numel()} rows off by more than {spec.max_row_rel:g} of their "
                    f"scale, worst {worst:.3g} at row {_unravel(first, tuple(buf.shape[:-1]))}")
    return trial


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    idx = []
    for size in reversed(shape):
        idx.append(flat % size)
        flat //= size
    return tuple(reversed(idx))


def _num(x: Optional[float]) -> Optional[float]:
    return None if x is None or math.isnan(x) or math.isinf(x) else x


def check_accuracy(spec: AccuracyGateSpec, cases: Iterable[AccuracyCase], candidate: Candidate,
                   oracle: Oracle, ctx: GateContext, *, lse_key: str = "lse",
                   row_scale: Optional[RowScale] = None) -> GateResult:
    """Run ``spec.trials`` fresh-seeded trials of every case, in a random order; see the module
    docstring.

    Figures: ``worst_rel_l2`` (key), ``worst_max_abs_rel``, ``worst_max_abs`` (held only when the
    spec states ``max_abs``), ``worst_row_rel`` (when ``max_row_rel`` is set), ``worst_lse_abs``
    (when ``check_lse``), ``unwritten_elements`` and ``non_finite_elements`` (both must be 0),
    ``trials`` (cases x trials). Details: ``seeds`` (case, trial, seed, buffers: every failure is
    reproducible), ``cases`` (a row per case), ``failures`` (the first few problems with their
    seeds) and ``order`` (the cases in the order they ran).
    """
    cases = list(cases)
    if not cases:
        return GateResult(gate=spec.name, kind=spec.kind, outcome=Outcome.ERROR,
                          summary="no accuracy cases were given: measured nothing")
    names = [c.name for c in cases]
    if len(set(names)) != len(names):
        raise ValueError(f"accuracy case names must be unique: {names}")
    order_rng = random.Random(ctx.fresh_seed())
    runs = [(ci, t, mode) for ci, modes in enumerate(trial_modes(cases, spec.trials, order_rng))
            for t, mode in enumerate(modes)]
    order_rng.shuffle(runs)
    seeds: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    per_case: dict[int, list[dict[str, Any]]] = {ci: [] for ci in range(len(cases))}
    for n, (ci, t, mode) in enumerate(runs):
        case = cases[ci]
        seed = ctx.fresh_seed()
        seeds.append({"case": case.name, "trial": t, "seed": seed, "buffers": mode})
        ctx.progress(f"accuracy {case.name} trial {t + 1}/{spec.trials}", n / len(runs))
        trial = _run_trial(spec, case, seed, mode, candidate, oracle, ctx, lse_key, row_scale)
        per_case[ci].append(trial)
        for problem in trial["problems"]:
            failures.append({"case": case.name, "seed": seed, "buffers": mode, "problem": problem})

    rows: list[dict[str, Any]] = []
    for ci, case in enumerate(cases):
        trials = per_case[ci]
        rows.append({
            "case": case.name, "params": case.params, "trials": len(trials),
            "worst_rel_l2": _num(_worst(tr["rel_l2"] for tr in trials)),
            "worst_max_abs": _num(_worst(tr["max_abs"] for tr in trials)),
            "worst_max_abs_rel": _num(_worst(tr["max_abs_rel"] for tr in trials)),
            "worst_row_rel": _num(_worst(tr["row_rel"] for tr in trials)),
            "worst_lse_abs": _num(_worst(tr["lse_abs"] for tr in trials if tr["lse_abs"] is not None)),
            "unwritten": sum(o["unwritten"] for tr in trials for o in tr["outputs"]),
            "non_finite": sum(o["non_finite"] for tr in trials for o in tr["outputs"]),
            "failed_seeds": sorted({tr["seed"] for tr in trials if tr["problems"]}),
        })
    all_trials = [tr for ci in per_case for tr in per_case[ci]]
    lse_seen = [tr["lse_abs"] for tr in all_trials if tr["lse_abs"] is not None]
    figures = [
        Figure(name="worst_rel_l2", value=_worst(tr["rel_l2"] for tr in all_trials), op="<=",
               threshold=spec.max_rel_l2, key=True),
        Figure(name="worst_max_abs_rel", value=_worst(tr["max_abs_rel"] for tr in all_trials), op="<=",
               threshold=spec.max_abs_rel),
        Figure(name="worst_max_abs", value=_worst(tr["max_abs"] for tr in all_trials),
               op="<=" if spec.max_abs is not None else None, threshold=spec.max_abs),
    ]
    if spec.max_row_rel is not None:
        figures.append(Figure(name="worst_row_rel", value=_worst(tr["row_rel"] for tr in all_trials), op="<=",
                              threshold=spec.max_row_rel))
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
        first = sorted(failures, key=lambda f: f["buffers"] != "poisoned")  # unwritten shows there
        shown = "; ".join(f"case {f['case']!r} seed {f['seed']} ({f['buffers']} buffers): {f['problem']}"
                          for f in first[:3])
        more = f" (+{len(failures) - 3} more)" if len(failures) > 3 else ""
        summary = shown + more
    result = verdict(spec.name, spec.kind, figures, summary, seeds=seeds, cases=rows,
                     failures=kept_failures(failures), order=[cases[ci].name for ci, _, _ in runs])
    if failures and result.outcome is Outcome.PASSED:  # every problem is a failure, figures or not
        result.outcome = Outcome.FAILED
    return result
